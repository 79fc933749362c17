//! The node's HTTP listener for operators (`palisade serve --metrics-listen`):
//! `GET /metrics` in Prometheus' text format.
//!
//! Read-only and unauthenticated, like every Prometheus endpoint: it shows lock
//! names and session labels, so bind it to an address only the monitoring
//! network reaches (docs/operations.md).

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
}

/// The routes of the operators' listener.
pub fn router(observed: Arc<Observed>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(observed)
}

async fn metrics(State(o): State<Arc<Observed>>) -> impl IntoResponse {
    let text = o.metrics.render(&ScrapeSources {
        raft: &o.raft,
        shared: &o.shared,
        committed: (o.committed)(),
    });
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text)
}
