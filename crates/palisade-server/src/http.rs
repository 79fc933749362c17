//! The node's HTTP listener for operators (`palisade serve --metrics-listen`):
//! `GET /metrics` in Prometheus' text format, `GET /` the status page and
//! `GET /status.json` its data ([`crate::status`]).
//!
//! Read-only and unauthenticated, like every Prometheus endpoint: it shows lock
//! names and session labels, so bind it to an address only the monitoring
//! network reaches (docs/observability.md).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::{NodeMetrics, ScrapeSources};
use crate::store::sm::Shared;
use crate::typ::Raft;

/// What the HTTP handlers read.
pub struct Observed {
    /// The node's Raft.
    pub raft: Raft,
    /// The lock state.
    pub shared: Arc<Shared>,
    /// The committed index the log store knows.
    pub committed: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The registry and its scrape-time gauges.
    pub metrics: NodeMetrics,
    /// The status page's data.
    pub status: Arc<crate::status::StatusSource>,
}

/// The routes of the operators' listener.
pub fn router(observed: Arc<Observed>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(page))
        .route("/status.js", get(script))
        .route("/status.json", get(status))
        .with_state(observed)
}

/// Only the page's own script and JSON: a lock name can never run as code
/// here, even if the script's escaping were wrong.
const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'";

/// The status page: plain HTML and a script of its own that reads
/// `/status.json` every second (no build step, nothing fetched elsewhere).
async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        include_str!("status.html"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("status.js"),
    )
}

async fn status(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    axum::Json(o.status.cluster().await)
}

async fn metrics(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    let text = o.metrics.render(&ScrapeSources {
        raft: &o.raft,
        shared: &o.shared,
        committed: (o.committed)(),
    });
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text)
}
