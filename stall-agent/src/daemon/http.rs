//! The daemon's HTTP server, on a thread of its own so that a slow attach
//! in the main loop never holds a scrape: `/metrics` for Prometheus,
//! `/healthz` for probes, `/jobs` and `/jobs/{id}` for people, and
//! `POST /jobs/{id}/capture` to take a job's timeline now. It serves what
//! the main loop last published and hands capture requests to it.
//! Connections are bounded and timed out ([`conn`]); password checks run
//! off the serving thread, at a lower priority ([`gate`]). Probes may have
//! a port of their own (`--health-listen`): plain HTTP, `/healthz` only,
//! served by its own thread, so that a kubelet's probe never queues behind
//! TLS handshakes or password checks on the main port.
mod conn;
mod gate;

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc, Arc, Mutex,
    },
    time::Duration,
};

use axum::{
    extract::{Path, Query, Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    Extension,
};
use serde_json::{json, Value};
use tokio::sync::oneshot;

pub use self::conn::ConnectionLimits;
use self::{
    conn::ClientAddr,
    gate::{Admission, Gate},
};
use super::{
    metrics::{self, Metrics},
    web_config::{Access, WebConfig},
};
use crate::{clock::monotonic_ns, error::Error, output::jobs};

/// What the main loop last published, for `/jobs`.
#[derive(Default)]
pub struct Board {
    /// Unix time of the publication, seconds.
    pub time: f64,
    pub jobs: Vec<BoardJob>,
    /// Cgroups under the roots not watched, and why (None: none).
    pub not_watched: Option<(usize, String)>,
}

pub struct BoardJob {
    pub id: String,
    pub doc: Value,
    pub history: Value,
}

/// A request for a job's timeline over the next `seconds`; the main loop
/// answers on `reply` once the window has passed.
pub struct CaptureRequest {
    pub id: String,
    pub seconds: u64,
    pub reply: oneshot::Sender<Result<Vec<u8>, CaptureRefused>>,
}

#[derive(Debug)]
pub enum CaptureRefused {
    NoSuchJob,
    /// Another job's capture is under way (one at a time).
    Busy,
    /// The job ended before the window was over.
    JobEnded,
    Failed(String),
}

/// How the server is set up.
pub struct HttpOptions {
    pub web: Option<WebConfig>,
    /// File paths, command lines and Python stacks in `/jobs`, and the
    /// capture endpoint (to authenticated clients only, with a web config).
    pub expose_details: bool,
    /// The main loop is fresh while it last ran within this.
    pub fresh: Duration,
    pub node: String,
    pub limits: ConnectionLimits,
    /// A port of its own for `/healthz` (plain HTTP).
    pub health: Option<SocketAddr>,
}

/// Connections open at once on the health port at most: probes open one
/// at a time (a kubelet closes each after its answer).
const HEALTH_MAX_CONNECTIONS: usize = 64;

/// What the loop publishes and the server reads.
pub struct Shared {
    pub metrics: Metrics,
    board: Mutex<Board>,
    /// When the main loop last finished an interval (monotonic ns).
    beat_ns: AtomicU64,
    captures: Mutex<mpsc::Sender<CaptureRequest>>,
    /// Where a web config is given.
    gate: Option<Gate>,
    local_addr: SocketAddr,
    health_addr: Option<SocketAddr>,
    expose_details: bool,
    fresh: Duration,
    node: String,
}

impl Shared {
    pub fn publish(&self, board: Board) {
        *self.board.lock().unwrap_or_else(|e| e.into_inner()) = board;
    }

    /// The address served (the port chosen, where 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The health port's address, where one is served.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// The main loop finished an interval.
    pub fn beat(&self) {
        self.beat_ns.store(monotonic_ns(), Ordering::Relaxed);
    }

    fn details(&self, access: Access) -> bool {
        self.expose_details && (self.gate.is_none() || access == Access::Authenticated)
    }
}

/// Longest capture the endpoint takes.
pub const CAPTURE_MAX_S: u64 = 300;

/// Binds `addr` (and the health port, where asked: a port taken is an
/// error of its own) and serves on a thread of its own; capture requests
/// arrive on the receiver.
pub fn serve(
    addr: SocketAddr,
    opts: HttpOptions,
) -> Result<(Arc<Shared>, mpsc::Receiver<CaptureRequest>), Error> {
    let HttpOptions { web, expose_details, fresh, node, limits, health } = opts;
    let (listener, local_addr) = listen(addr)?;
    let health = health.map(listen).transpose()?;
    let (tx, rx) = mpsc::channel();
    let tls = web.as_ref().and_then(|w| w.tls.clone());
    let metrics = Metrics::new();
    metrics.set_build_info();
    let shared = Arc::new(Shared {
        metrics,
        board: Mutex::new(Board::default()),
        beat_ns: AtomicU64::new(monotonic_ns()),
        captures: Mutex::new(tx),
        gate: web.map(|w| Gate::new(Arc::new(w))),
        local_addr,
        health_addr: health.as_ref().map(|h| h.1),
        expose_details,
        fresh,
        node,
    });
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(serve_metrics))
        .route("/jobs", axum::routing::get(serve_jobs))
        .route("/jobs/{id}", axum::routing::get(serve_job))
        .route("/jobs/{id}/capture", axum::routing::post(serve_capture))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), authenticate))
        // Probes carry no credentials; the answer tells nothing of the jobs.
        .route("/healthz", axum::routing::get(serve_health))
        .with_state(shared.clone());
    spawn_server("stall-http", addr, listener, tls, app, limits)?;
    if let Some((listener, health_addr)) = health {
        let probes = axum::Router::new()
            .route("/healthz", axum::routing::get(serve_health))
            .with_state(shared.clone());
        let limits = ConnectionLimits { max_connections: HEALTH_MAX_CONNECTIONS, ..limits };
        spawn_server("stall-health", health_addr, listener, None, probes, limits)?;
    }
    Ok((shared, rx))
}

/// The listening socket on `addr`, and the address it took (the port
/// chosen, where 0 was asked for).
fn listen(addr: SocketAddr) -> Result<(std::net::TcpListener, SocketAddr), Error> {
    let listener = conn::bind(addr).map_err(|e| Error::Listen { addr, reason: e.to_string() })?;
    let local = listener.local_addr().map_err(|e| Error::Listen { addr, reason: e.to_string() })?;
    Ok((listener, local))
}

/// Serves `app` on `listener` from a thread of its own, with a runtime of
/// its own: nothing one port's clients do holds the other's.
fn spawn_server(
    name: &str,
    addr: SocketAddr,
    listener: std::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    app: axum::Router,
    limits: ConnectionLimits,
) -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Listen { addr, reason: e.to_string() })?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => conn::serve(listener, tls, app, limits).await,
                    Err(e) => eprintln!("stall: HTTP server on {addr} stopped: {e}"),
                }
            })
        })
        .map_err(|e| Error::Listen { addr, reason: e.to_string() })?;
    Ok(())
}

/// Basic authentication where the web config asks for it; the request
/// learns how it stands.
async fn authenticate(State(s): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    let admission = match &s.gate {
        None => Admission::Checked(Access::Anonymous),
        Some(gate) => {
            let client =
                req.extensions().get::<ClientAddr>().map_or(Ipv4Addr::UNSPECIFIED.into(), |c| c.0.ip());
            let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            gate.admit(client, header).await
        }
    };
    let access = match admission {
        Admission::Checked(Access::Denied) => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"stall\"")],
                "unauthorized\n",
            )
                .into_response()
        }
        Admission::Checked(access) => access,
        Admission::Throttled(wait) => {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, seconds.to_string())],
                format!("too many wrong passwords from this address: try again in {seconds} s\n"),
            )
                .into_response();
        }
        Admission::Overloaded => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                "too many password checks waiting: try again\n",
            )
                .into_response()
        }
    };
    req.extensions_mut().insert(access);
    next.run(req).await
}

/// OpenMetrics to whoever asks for it (Prometheus does), the classic text
/// format otherwise.
async fn serve_metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> impl IntoResponse {
    let om = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let text = s.metrics.encode();
    if om {
        ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
    } else {
        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics::to_classic(&text))
    }
}

async fn serve_health(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let age_ns = monotonic_ns().saturating_sub(s.beat_ns.load(Ordering::Relaxed));
    if age_ns <= s.fresh.as_nanos() as u64 {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the main loop last ran {:.1} s ago\n", age_ns as f64 / 1e9),
        )
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error(status: StatusCode, why: &str) -> Response {
    json_response(status, &json!({ "error": why }))
}

async fn serve_jobs(State(s): State<Arc<Shared>>, Extension(access): Extension<Access>) -> Response {
    let details = s.details(access);
    let (time, docs, not_watched) = {
        let board = s.board.lock().unwrap_or_else(|e| e.into_inner());
        (board.time, board.jobs.iter().map(|j| j.doc.clone()).collect::<Vec<_>>(), board.not_watched.clone())
    };
    let docs = docs
        .into_iter()
        .map(|mut d| {
            jobs::resolve(&mut d, details);
            d
        })
        .collect();
    json_response(StatusCode::OK, &jobs::list(&s.node, time, docs, not_watched))
}

async fn serve_job(
    State(s): State<Arc<Shared>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
) -> Response {
    let found = {
        let board = s.board.lock().unwrap_or_else(|e| e.into_inner());
        board.jobs.iter().find(|j| j.id == id).map(|j| {
            let mut doc = j.doc.clone();
            if let Value::Object(m) = &mut doc {
                m.insert("history".into(), j.history.clone());
                m.insert("node".into(), s.node.clone().into());
                m.insert("time".into(), board.time.into());
            }
            doc
        })
    };
    match found {
        None => error(StatusCode::NOT_FOUND, &format!("no job {id} on this node")),
        Some(mut doc) => {
            jobs::resolve(&mut doc, s.details(access));
            json_response(StatusCode::OK, &doc)
        }
    }
}

#[derive(serde::Deserialize)]
struct CaptureQuery {
    seconds: Option<u64>,
}

/// The job's full capture over the next `seconds` (10 unless given), as the
/// gzip'd Chrome/Perfetto trace `--timeline` writes. It names threads and
/// files: details only.
async fn serve_capture(
    State(s): State<Arc<Shared>>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
    Query(q): Query<CaptureQuery>,
) -> Response {
    if !s.details(access) {
        let why = if s.expose_details {
            "a capture names files and threads: authenticate"
        } else {
            "a capture names files and threads: the daemon runs without --expose-details"
        };
        return error(StatusCode::FORBIDDEN, why);
    }
    let seconds = q.seconds.unwrap_or(10);
    if !(1..=CAPTURE_MAX_S).contains(&seconds) {
        return error(StatusCode::BAD_REQUEST, &format!("seconds must be 1 to {CAPTURE_MAX_S}"));
    }
    let (reply, answer) = oneshot::channel();
    let sent = s.captures.lock().unwrap_or_else(|e| e.into_inner()).send(CaptureRequest {
        id: id.clone(),
        seconds,
        reply,
    });
    if sent.is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the main loop has stopped");
    }
    // The loop answers after the window; allow it a few intervals more.
    let wait = Duration::from_secs(seconds) + s.fresh * 2;
    match tokio::time::timeout(wait, answer).await {
        Ok(Ok(Ok(trace))) => {
            let name = format!("attachment; filename=\"stall-{id}.json.gz\"");
            let disposition = HeaderValue::from_str(&name).unwrap_or(HeaderValue::from_static("attachment"));
            (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static("application/gzip")),
                    (header::CONTENT_DISPOSITION, disposition),
                ],
                trace,
            )
                .into_response()
        }
        Ok(Ok(Err(CaptureRefused::NoSuchJob))) => {
            error(StatusCode::NOT_FOUND, &format!("no job {id} on this node"))
        }
        Ok(Ok(Err(CaptureRefused::Busy))) => {
            error(StatusCode::CONFLICT, "another capture is under way; one at a time")
        }
        Ok(Ok(Err(CaptureRefused::JobEnded))) => {
            error(StatusCode::GONE, &format!("job {id} ended during the capture; nothing to answer with"))
        }
        Ok(Ok(Err(CaptureRefused::Failed(why)))) => error(StatusCode::INTERNAL_SERVER_ERROR, &why),
        Ok(Err(_)) | Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the main loop did not answer in time"),
    }
}
