//! The fenced object store over HTTP.
//!
//! | request | success | errors |
//! |---|---|---|
//! | `PUT /v1/objects/{key}`, header `Fencing-Token: N`, body = the object | `200 {"key","token","previous"}` | 400 `bad_key` / `malformed_token`, 428 `missing_token`, 409 `stale_token`, 413 `body_too_large` |
//! | `GET /v1/objects/{key}` | `200`, the body, header `Fencing-Token` of the write that produced it | 400 `bad_key`, 404 `not_found` |
//! | `GET /v1/objects/{key}`, header `Fencing-Token: N` (a fenced read: admits N first) | as `GET` | as `GET`, and 400 `malformed_token`, 409 `stale_token` |
//! | `DELETE /v1/objects/{key}`, header `Fencing-Token: N` | `200 {"key","token","previous","deleted"}` | as `PUT` |
//! | `GET /v1/health` | `200 {"status":"ok","fencing":"on"\|"off"}` | |
//! | `GET /metrics` | `200`, Prometheus text: writes accepted by method, refused by reason, stale writes let through (fencing off) | |
//!
//! Every error is JSON: `{"error": CODE, "message": TEXT, …}`; a stale token adds
//! `"presented"` and `"highest"`. A 2xx to a `PUT` or `DELETE` is sent only after
//! the object and its token are committed and synced to disk. Storage failures are
//! `500 storage`.

use std::future::Future;
use std::path::Path;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use palisade_core::FencingToken;
use serde_json::{Value, json};

use crate::fence::{Admitted, FenceError, Fencing};
use crate::resource::ObjectKey;
use crate::store::ObjectStore;

/// The request and response header that carries the fencing token.
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

/// Largest object body accepted, in bytes (1 MiB). Larger bodies get `413`.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store in the data directory could not be opened.
    #[error("cannot open the object store: {0}")]
    Store(#[from] FenceError),
    /// The listener failed.
    #[error("fence-store server: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS certificate or key is unusable.
    #[error("fence-store TLS: {0}")]
    Tls(String),
}

/// Serves the fenced object store in `data_dir` (created if missing) on
/// `listener` until `shutdown` completes, then finishes the requests in flight.
///
/// # Errors
/// [`ServeError::Store`] if the store cannot be opened (e.g. another process has
/// it open); [`ServeError::Io`] if the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    data_dir: &Path,
    fencing: Fencing,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_store(listener, ObjectStore::open(data_dir, fencing)?, shutdown).await
}

/// Serves an opened `store` on `listener` until `shutdown` completes.
///
/// # Errors
/// [`ServeError::Io`] if the listener fails.
pub async fn serve_store(
    listener: tokio::net::TcpListener,
    store: ObjectStore,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let fencing = store.fencing();
    if let Ok(addr) = listener.local_addr() {
        tracing::debug!(%addr, ?fencing, "fence-store listening");
    }
    axum::serve(listener, router(store))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// The TLS settings of a store that serves HTTPS: its certificate chain and key,
/// PEM files (`palisade certs init` makes node certificates that fit).
///
/// # Errors
/// [`ServeError::Tls`] naming the file that is unreadable or not PEM.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServeError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let tls = |path: &Path, e: &dyn std::fmt::Display| {
        ServeError::Tls(format!("{}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| tls(key, &e))?;
    let mut config = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| tls(cert, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

/// Serves an opened `store` over HTTPS on `listener` until `shutdown` completes.
/// A client that does not finish its handshake within 10 s is dropped; a bad
/// handshake (plaintext, garbage) affects only its own connection.
///
/// # Errors
/// [`ServeError::Io`] if the listener fails.
pub async fn serve_store_tls(
    listener: tokio::net::TcpListener,
    store: ObjectStore,
    acceptor: tokio_rustls::TlsAcceptor,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    let fencing = store.fencing();
    if let Ok(addr) = listener.local_addr() {
        tracing::debug!(%addr, ?fencing, "fence-store listening (TLS)");
    }
    let app = router(store);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let handshake =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
            let stream = match handshake.await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// What the store counts, served at `GET /metrics` in Prometheus' text format.
#[derive(Clone)]
struct StoreMetrics {
    registry: prometheus::Registry,
    accepted: prometheus::IntCounterVec,
    rejected: prometheus::IntCounterVec,
    stale_accepted: prometheus::IntCounter,
}

/// Why a write was refused, carried from the error to the counting layer.
#[derive(Clone, Copy)]
struct Refused(&'static str);

/// Marks a write accepted although its token was stale (fencing off).
#[derive(Clone, Copy)]
struct StaleAccepted;

impl StoreMetrics {
    fn new() -> Self {
        let vec = |name: &str, help: &str, label: &str| {
            prometheus::IntCounterVec::new(prometheus::Opts::new(name, help), &[label])
                .expect("valid counter")
        };
        let metrics = StoreMetrics {
            registry: prometheus::Registry::new(),
            accepted: vec(
                "palisade_fence_writes_accepted_total",
                "Writes (PUT, DELETE) the store committed, by method.",
                "method",
            ),
            rejected: vec(
                "palisade_fence_writes_rejected_total",
                "Writes the store refused, by reason (stale_token, missing_token, …).",
                "reason",
            ),
            stale_accepted: prometheus::IntCounter::new(
                "palisade_fence_stale_writes_accepted_total",
                "Writes with a stale token the store accepted because fencing is off.",
            )
            .expect("valid counter"),
        };
        for method in ["PUT", "DELETE"] {
            metrics.accepted.with_label_values(&[method]);
        }
        for reason in [
            "stale_token",
            "missing_token",
            "malformed_token",
            "bad_key",
            "body_too_large",
            "storage",
        ] {
            metrics.rejected.with_label_values(&[reason]);
        }
        for c in [metrics.accepted.clone(), metrics.rejected.clone()] {
            metrics
                .registry
                .register(Box::new(c))
                .expect("unique names");
        }
        metrics
            .registry
            .register(Box::new(metrics.stale_accepted.clone()))
            .expect("unique names");
        metrics
    }

    fn render(&self) -> Response {
        let mut text = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &self.registry.gather(),
            &mut text,
        )
        .expect("the text encoder writes to memory");
        ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response()
    }
}

/// Counts every write by its answer (the handlers mark refusals and stale
/// acceptances on the response).
async fn count_writes(
    State(metrics): State<StoreMetrics>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    if method == axum::http::Method::PUT || method == axum::http::Method::DELETE {
        if let Some(Refused(reason)) = response.extensions().get::<Refused>() {
            metrics.rejected.with_label_values(&[reason]).inc();
        } else if response.status().is_success() {
            metrics.accepted.with_label_values(&[method.as_str()]).inc();
            if response.extensions().get::<StaleAccepted>().is_some() {
                metrics.stale_accepted.inc();
            }
        }
    }
    response
}

/// The HTTP routes over `store` (for tests, or to mount under another router).
pub fn router(store: ObjectStore) -> Router {
    let metrics = StoreMetrics::new();
    let rendered = metrics.clone();
    Router::new()
        .route("/v1/health", get(health))
        .route(
            "/v1/objects/{*key}",
            get(get_object).put(put_object).delete(delete_object),
        )
        // The catch-all route does not match an empty key; say so instead of 404.
        .route("/v1/objects", any(empty_key))
        .route("/v1/objects/", any(empty_key))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(store)
        .route("/metrics", get(move || async move { rendered.render() }))
        .layer(axum::middleware::from_fn_with_state(metrics, count_writes))
}

/// A refused request: a status and the JSON body `{"error", "message", …extra}`.
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Value,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            status,
            code,
            message: message.to_string(),
            extra: Value::Null,
        }
    }

    fn with(mut self, extra: Value) -> Self {
        self.extra = extra;
        self
    }

    fn fence(key: &ObjectKey, e: FenceError) -> Self {
        match e {
            FenceError::StaleToken { presented, highest } => {
                tracing::info!(
                    %key,
                    token = presented.get(),
                    highest = highest.get(),
                    "stale token refused"
                );
                Self::new(
                    StatusCode::CONFLICT,
                    "stale_token",
                    format!(
                        "token {presented} is stale: {:?} has already accepted token {highest}",
                        key.as_str()
                    ),
                )
                .with(json!({
                    "key": key.as_str(),
                    "presented": presented.get(),
                    "highest": highest.get(),
                }))
            }
            other => {
                tracing::error!(%key, error = %other, "fence-store storage failure");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "storage", other)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), self.extra) {
            body.extend(extra);
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        response.extensions_mut().insert(Refused(self.code));
        response
    }
}

fn parse_key(key: Result<UrlPath<String>, PathRejection>) -> Result<ObjectKey, ApiError> {
    let UrlPath(key) =
        key.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad_key", e.body_text()))?;
    ObjectKey::new(&key).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_key", e).with(json!({ "key": key }))
    })
}

fn parse_token(headers: &HeaderMap) -> Result<FencingToken, ApiError> {
    let mut values = headers.get_all(FENCING_TOKEN_HEADER).iter();
    let Some(value) = values.next() else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "missing_token",
            "this store only accepts fenced writes: send the lock's token in a Fencing-Token header",
        ));
    };
    let malformed = |why: &dyn std::fmt::Display| {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed_token", why)
    };
    if values.next().is_some() {
        return Err(malformed(&"more than one Fencing-Token header"));
    }
    let text = value
        .to_str()
        .map_err(|_| malformed(&"Fencing-Token is not ASCII"))?;
    text.parse::<FencingToken>().map_err(|e| malformed(&e))
}

async fn read_body(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("an object is at most {MAX_BODY_BYTES} bytes"),
        )
        .with(json!({ "limit": MAX_BODY_BYTES }))
    };
    // Refuse a declared oversize body before reading any of it.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes().to_vec()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_body",
            format!("cannot read the body: {e}"),
        )),
    }
}

/// Runs a blocking store call off the async workers (it fsyncs).
async fn blocking<T: Send + 'static>(
    key: &ObjectKey,
    f: impl FnOnce() -> Result<T, FenceError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| ApiError::fence(key, e)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("store task failed: {e}"),
        )),
    }
}

fn written(key: &ObjectKey, a: &Admitted) -> Value {
    json!({
        "key": key.as_str(),
        "token": a.token.get(),
        "previous": a.previous.map(FencingToken::get),
    })
}

async fn health(State(store): State<ObjectStore>) -> Response {
    let fencing = match store.fencing() {
        Fencing::On => "on",
        Fencing::Off => "off",
    };
    axum::Json(json!({ "status": "ok", "fencing": fencing })).into_response()
}

async fn put_object(
    State(store): State<ObjectStore>,
    key: Result<UrlPath<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    let token = parse_token(&headers)?;
    let body = read_body(&headers, body).await?;
    let k = key.clone();
    let admitted = blocking(&key, move || store.put(&k, token, &body)).await?;
    let mut response = axum::Json(written(&key, &admitted)).into_response();
    if admitted.was_stale() {
        tracing::warn!(%key, token = %admitted.token, highest = %admitted.highest(),
            "fencing off: accepted a stale write");
        response.extensions_mut().insert(StaleAccepted);
    }
    Ok(response)
}

async fn get_object(
    State(store): State<ObjectStore>,
    key: Result<UrlPath<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    let k = key.clone();
    let object = if headers.contains_key(FENCING_TOKEN_HEADER) {
        let token = parse_token(&headers)?;
        blocking(&key, move || store.get_fenced(&k, token).map(|(_, o)| o)).await?
    } else {
        blocking(&key, move || store.get(&k)).await?
    };
    let Some(object) = object else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no object at {:?}", key.as_str()),
        )
        .with(json!({ "key": key.as_str() })));
    };
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        ),
        (
            header::HeaderName::from_static(FENCING_TOKEN_HEADER),
            HeaderValue::from(object.token.get()),
        ),
    ];
    Ok((headers, object.body).into_response())
}

async fn delete_object(
    State(store): State<ObjectStore>,
    key: Result<UrlPath<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    let token = parse_token(&headers)?;
    let k = key.clone();
    let (admitted, deleted) = blocking(&key, move || store.delete(&k, token)).await?;
    let mut body = written(&key, &admitted);
    body["deleted"] = Value::Bool(deleted);
    Ok(axum::Json(body).into_response())
}

async fn empty_key() -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_key", "object key is empty")
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (objects take GET, PUT and DELETE)",
    )
}
