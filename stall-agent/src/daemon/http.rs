//! The daemon's HTTP server: `/metrics` for Prometheus, `/jobs` for people.
//! It serves what the main loop last published and never waits on it.
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    extract::State,
    http::{header, HeaderMap},
    response::IntoResponse,
};

use super::metrics::{self, Metrics};
use crate::error::Error;

/// What the loop publishes and the server reads.
pub struct Shared {
    pub metrics: Metrics,
    pub jobs_json: Mutex<String>,
}

/// Binds `addr` (a port taken is an error of its own) and serves in the
/// background.
pub async fn serve(addr: SocketAddr) -> Result<Arc<Shared>, Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Listen { addr, reason: e.to_string() })?;
    let shared = Arc::new(Shared { metrics: Metrics::new(), jobs_json: Mutex::new("[]".into()) });
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(serve_metrics))
        .route("/jobs", axum::routing::get(serve_jobs))
        .with_state(shared.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            eprintln!("stall: HTTP server stopped: {e}");
        }
    });
    Ok(shared)
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

async fn serve_jobs(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], s.jobs_json.lock().unwrap().clone())
}
