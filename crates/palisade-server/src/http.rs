//! The node's HTTP listener for operators (`palisade serve --metrics-listen`):
//! `GET /metrics` in Prometheus' text format, `GET /` the status page and
//! `GET /status.json` its data ([`crate::status`]).
//!
//! On a TLS node it speaks HTTPS with the node's certificate and asks every
//! request who sends it, as the client listener does (a client certificate of
//! the CA or a bearer token of the policy): an identity with some `read` (or
//! `admin`) right may scrape and see the page, and the page lists only the
//! locks it may read. No credentials: `401`; no such right: `403`. A plaintext
//! node, or one started with `--metrics-open` (plain HTTP on loopback only),
//! serves everyone (docs/observability.md).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use palisade_proto::ErrorCode;

use crate::metrics::{NodeMetrics, ScrapeSources};
use crate::security::{Caller, Gatekeeper};
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
    /// Who may look: `None` is everyone (a plaintext node, `--metrics-open`).
    pub access: Option<Arc<Gatekeeper>>,
}

impl Observed {
    /// The caller of `request`, if it may look at this listener (`Ok(None)`
    /// when the listener is open to everyone).
    fn admit(&self, request: Request) -> Result<Option<Caller>, Box<Response>> {
        let Some(gatekeeper) = &self.access else {
            return Ok(None);
        };
        let refused = |status: tonic::Status| {
            let code = ErrorCode::of(&status).unwrap_or(ErrorCode::Unavailable);
            let status_code = crate::json_api::http_status(code);
            let mut answer = (status_code, format!("{}\n", status.message())).into_response();
            if status_code == StatusCode::UNAUTHORIZED {
                answer.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer realm=\"palisade\""),
                );
            }
            Box::new(answer)
        };
        let caller = gatekeeper
            .admit(request.headers(), request.extensions())
            .map_err(refused)?;
        caller.may_observe().map_err(refused)?;
        Ok(Some(caller))
    }
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
async fn page(State(o): State<Arc<Observed>>, request: Request) -> Response {
    if let Err(refused) = o.admit(request) {
        return *refused;
    }
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        include_str!("status.html"),
    )
        .into_response()
}

async fn script(State(o): State<Arc<Observed>>, request: Request) -> Response {
    if let Err(refused) = o.admit(request) {
        return *refused;
    }
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("status.js"),
    )
        .into_response()
}

async fn status(State(o): State<Arc<Observed>>, request: Request) -> Response {
    let caller = match o.admit(request) {
        Ok(caller) => caller,
        Err(refused) => return *refused,
    };
    let mut status = o.status.cluster().await;
    if let Some(caller) = caller {
        // Totals stay; names the caller may not read do not.
        status.locks.retain(|l| caller.can_read(&l.name));
        status
            .recent
            .retain(|e| e.lock.as_deref().is_none_or(|name| caller.can_read(name)));
    }
    axum::Json(status).into_response()
}

async fn metrics(State(o): State<Arc<Observed>>, request: Request) -> Response {
    if let Err(refused) = o.admit(request) {
        return *refused;
    }
    let text = o.metrics.render(&ScrapeSources {
        raft: &o.raft,
        shared: &o.shared,
        committed: (o.committed)(),
    });
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response()
}
