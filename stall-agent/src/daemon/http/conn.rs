//! The connections of the daemon's port, with limits a flood cannot push
//! past: a connection must send its request's head within
//! `header_timeout` (of opening, of the TLS handshake, or of its first
//! byte after a response), may idle between requests for `idle_timeout`,
//! and at most `max_connections` are open. A new one past that closes the
//! connection idle the longest (a flood of silent sockets pushes out
//! itself, not the scrape under way); only when every one is mid-request
//! is the new one closed at once.
use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{body::Body, Router};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::{body::Incoming, Request};
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::Notify,
    time::Instant,
};
use tokio_rustls::{rustls::ServerConfig, TlsAcceptor};
use tower::ServiceExt;

use crate::clock::monotonic_ns;

/// How long connections may wait and how many may be open.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
    /// Also the TLS handshake's.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            idle_timeout: Duration::from_secs(60),
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Connections the kernel completes ahead of the accept loop (std's 128
/// overflows under a flood, and each SYN dropped then costs a scrape a
/// second or more; the kernel caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 4096;

/// The listening socket, nonblocking.
pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As std's bind does: a restarted daemon binds again at once.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Connections asked to close whose tasks have not run yet, at most.
const CLOSING_MAX: usize = 64;

/// The client's address, in each request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// Accepts on `listener` for ever and serves `router` on each connection,
/// over TLS where `tls` is given.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    limits: ConnectionLimits,
) {
    let open = Arc::new(Open::default());
    let acceptor = tls.map(TlsAcceptor::from);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                let starved = matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                // Out of descriptors (or memory): the idlest connection makes
                // room, or the next accept would fail the same way. A client
                // that left before its accept costs nothing; anything else is
                // not retried in a busy loop.
                if starved && open.close_idlest() {
                    tokio::task::yield_now().await;
                } else if starved || !is_connection_error(&e) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                continue;
            }
        };
        match open.make_room(limits.max_connections) {
            Room::Free => {}
            // The closing connections' tasks run before the next accept
            // once a few are waiting, so that a burst of them does not hold
            // a descriptor each (yielding after every one would slow the
            // accepts behind a flood).
            Room::Made { closing } if closing >= CLOSING_MAX => tokio::task::yield_now().await,
            Room::Made { .. } => {}
            Room::None => {
                // Every connection is mid-request: this one is refused.
                drop(stream);
                continue;
            }
        }
        let (conn, registered) = open.add();
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let _registered = registered;
            connection(stream, peer, acceptor, router, conn, limits).await
        });
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionRefused
    )
}

/// The open connections.
#[derive(Default)]
struct Open {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

enum Room {
    Free,
    /// The idlest connection was asked to close; so many are closing.
    Made {
        closing: usize,
    },
    /// Every connection is mid-request.
    None,
}

/// One connection's state, as its task and the accept loop see it.
struct Conn {
    /// Requests in flight: from their head read to their response's body
    /// written (or dropped).
    busy: AtomicU32,
    /// Not busy, and awaiting a request's head (rather than idle between
    /// requests).
    awaiting_head: AtomicBool,
    /// Since when (monotonic ns) it awaits a head or idles.
    since_ns: AtomicU64,
    /// Asked to close, to make room.
    closing: AtomicBool,
    /// Its task looks again at the fields above.
    wake: Notify,
}

impl Open {
    fn add(self: &Arc<Self>) -> (Arc<Conn>, Registered) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            busy: AtomicU32::new(0),
            awaiting_head: AtomicBool::new(true),
            since_ns: AtomicU64::new(monotonic_ns()),
            closing: AtomicBool::new(false),
            wake: Notify::new(),
        });
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(id, conn.clone());
        (conn, Registered { open: self.clone(), id })
    }

    /// Whether one more connection may open, having asked the idlest to
    /// close if `max` are open.
    fn make_room(&self, max: usize) -> Room {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let open = conns.values().filter(|c| !c.closing.load(Ordering::Relaxed)).count();
        if open < max {
            Room::Free
        } else if Self::close_idlest_of(&conns) {
            Room::Made { closing: conns.len() - open + 1 }
        } else {
            Room::None
        }
    }

    fn close_idlest(&self) -> bool {
        Self::close_idlest_of(&self.conns.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn close_idlest_of(conns: &HashMap<u64, Arc<Conn>>) -> bool {
        let idlest = conns
            .values()
            .filter(|c| !c.closing.load(Ordering::Relaxed) && c.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|c| c.since_ns.load(Ordering::Relaxed));
        match idlest {
            Some(c) => {
                c.closing.store(true, Ordering::Relaxed);
                c.wake.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Removes a connection from the open ones when its task ends.
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

impl Conn {
    /// When it times out (monotonic ns); none while busy.
    fn deadline_ns(&self, limits: &ConnectionLimits) -> Option<u64> {
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let limit = if self.awaiting_head.load(Ordering::Relaxed) {
            limits.header_timeout
        } else {
            limits.idle_timeout
        };
        Some(self.since_ns.load(Ordering::Relaxed).saturating_add(limit.as_nanos() as u64))
    }

    /// Bytes came in: from an idle connection, they start a request's head.
    fn received(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && !self.awaiting_head.swap(true, Ordering::Relaxed) {
            self.since_ns.store(monotonic_ns(), Ordering::Relaxed);
            self.wake.notify_one();
        }
    }

    /// Waits until it is asked to close.
    async fn closed(&self) {
        loop {
            self.wake.notified().await;
            if self.closing.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// A request in flight on a connection, until its response is written.
struct Busy(Arc<Conn>);

impl Busy {
    fn begin(conn: Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        conn.awaiting_head.store(false, Ordering::Relaxed);
        Busy(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.since_ns.store(monotonic_ns(), Ordering::Relaxed);
            self.0.wake.notify_one();
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    router: Router,
    conn: Arc<Conn>,
    limits: ConnectionLimits,
) {
    let _ = stream.set_nodelay(true);
    let Some(acceptor) = tls else { return serve_http(stream, peer, router, conn, limits).await };
    // A failed handshake (plain HTTP, an unknown client certificate) ends
    // the connection: nothing is served.
    let tls = tokio::select! {
        done = tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)) => match done {
            Ok(Ok(tls)) => tls,
            _ => return,
        },
        () = conn.closed() => return,
    };
    // The request's head is awaited from the end of the handshake.
    conn.since_ns.store(monotonic_ns(), Ordering::Relaxed);
    serve_http(tls, peer, router, conn, limits).await
}

async fn serve_http<S>(io: S, peer: SocketAddr, router: Router, conn: Arc<Conn>, limits: ConnectionLimits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let busy = Busy::begin(conn.clone());
            req.extensions_mut().insert(ClientAddr(peer));
            let router = router.clone();
            async move {
                let Ok(response) = router.oneshot(req).await;
                Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let io = TokioIo::new(Watched { io, conn: conn.clone() });
    let http = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(http);
    loop {
        let deadline = conn
            .deadline_ns(&limits)
            .map(|at| Instant::now() + Duration::from_nanos(at.saturating_sub(monotonic_ns())));
        tokio::select! {
            _ = http.as_mut() => return,
            () = conn.wake.notified() => {
                if conn.closing.load(Ordering::Relaxed) {
                    if conn.busy.load(Ordering::Relaxed) == 0 {
                        return;
                    }
                    // A request came in meanwhile: it is served, and the
                    // connection counts again.
                    conn.closing.store(false, Ordering::Relaxed);
                }
            }
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if conn.deadline_ns(&limits).is_some_and(|at| at <= monotonic_ns()) {
                    return;
                }
            }
        }
    }
}

/// The connection's stream, telling it when bytes come in.
struct Watched<S> {
    io: S,
    conn: Arc<Conn>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.received();
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A response's body, holding its request in flight until it is written.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
