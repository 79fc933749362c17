//! The fenced object store over HTTP.
//!
//! | request | success | errors |
//! |---|---|---|
//! | `PUT /v1/objects/{key}`, header `Fencing-Token: N`, body = the object | `200 {"key","token","previous"}` | 400 `bad_key` / `malformed_token`, 428 `missing_token`, 409 `stale_token`, 413 `body_too_large` |
//! | `GET /v1/objects/{key}` | `200`, the body, header `Fencing-Token` of the write that produced it | 400 `bad_key`, 404 `not_found` |
//! | `GET /v1/objects/{key}`, header `Fencing-Token: N` (a fenced read: admits N first) | as `GET` | as `GET`, and 400 `malformed_token`, 409 `stale_token` |
//! | `GET /v1/objects/{key}`, headers `Fencing-Token: N` and `Fencing-Read: shared` (a reader of a read/write lock: answered unless a write above N was accepted; no write below N lands after it) | as `GET` | as the fenced read, and 400 `bad_read_mode` |
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
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use palisade_core::FencingToken;
use serde_json::{Value, json};

use crate::access::{Access, AccessError, PeerCertificates, Right};
use crate::fence::{Admitted, FenceError, Fencing};
use crate::resource::ObjectKey;
use crate::store::ObjectStore;
use crate::verify::{Belief, TokenVerifier, VerifyError, lock_for_key};

/// The request and response header that carries the fencing token.
pub const FENCING_TOKEN_HEADER: &str = "fencing-token";

/// The request header naming the lock whose token fences the object (the key
/// itself, or a prefix of it ending at a `/`); without it, the lock is the key.
/// What a store that verifies tokens asks the lock service about.
pub const FENCING_LOCK_HEADER: &str = "fencing-lock";

/// The request header that makes a fenced `GET` a shared read, for a reader
/// of a read/write lock: `Fencing-Read: shared`. Answered unless a write under
/// a higher token was accepted; afterwards no write below its token lands; it
/// does not refuse the other readers (see [`ObjectStore::get_shared`]).
/// Without it, a fenced `GET` raises the fence like a write (an exclusive
/// holder's read before its write).
pub const FENCING_READ_HEADER: &str = "fencing-read";

/// Largest object body accepted, in bytes (1 MiB). Larger bodies get `413`.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long a client may take to send a request's headers (a connection that
/// sends none within it, slow-loris or idle, is closed).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's body (`408 body_timeout`).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// How a store serves: TLS, who may write, which tokens it believes, and the
/// deadlines it gives clients. The default is plain HTTP, open to everyone,
/// trusting every token, with [`HEADER_TIMEOUT`] and [`BODY_TIMEOUT`].
#[derive(Clone)]
pub struct ServeOptions {
    /// HTTPS with this acceptor ([`tls_acceptor`]); `None`: plain HTTP.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Who may do what ([`Access::Policy`] needs TLS: credentials are never
    /// taken over plaintext).
    pub access: Access,
    /// Asks the lock service before a token above an object's highest is
    /// believed; `None`: every token is believed.
    pub verifier: Option<Arc<TokenVerifier>>,
    /// See [`HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`BODY_TIMEOUT`].
    pub body_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            tls: None,
            access: Access::Open,
            verifier: None,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
        }
    }
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
    let store = ObjectStore::open(data_dir, fencing)?;
    serve_with(listener, store, ServeOptions::default(), shutdown).await
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
    serve_with(listener, store, ServeOptions::default(), shutdown).await
}

/// The process's rustls crypto provider, or ring's when none is installed.
/// Never rustls' implicit choice: that panics when a build links both ring and
/// aws-lc-rs (the ZooKeeper client brings the second).
pub(crate) fn crypto_provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(ring::default_provider()))
}

/// The TLS settings of a store that serves HTTPS: its certificate chain and key,
/// PEM files (`palisade certs init` makes node certificates that fit).
///
/// # Errors
/// [`ServeError::Tls`] naming the file that is unreadable or not PEM.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, ServeError> {
    tls_acceptor_verifying(cert, key, None)
}

/// Like [`tls_acceptor`], and when `client_ca` is given, a client certificate
/// that chains to it is verified and names its holder ([`crate::access`]);
/// clients without one may still come with a bearer token.
///
/// # Errors
/// [`ServeError::Tls`] naming the file that is unreadable or not PEM.
pub fn tls_acceptor_verifying(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<tokio_rustls::TlsAcceptor, ServeError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let tls = |path: &Path, e: &dyn std::fmt::Display| {
        ServeError::Tls(format!("{}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls(cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls(cert, &e))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| tls(key, &e))?;
    let provider = crypto_provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(cert, &e))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| tls(ca, &e))? {
                roots
                    .add(c.map_err(|e| tls(ca, &e))?)
                    .map_err(|e| tls(ca, &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| tls(ca, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key_der)
        .map_err(|e| tls(cert, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves an opened `store` over HTTPS on `listener` until `shutdown` completes.
///
/// # Errors
/// [`ServeError::Io`] if the listener fails.
pub async fn serve_store_tls(
    listener: tokio::net::TcpListener,
    store: ObjectStore,
    acceptor: tokio_rustls::TlsAcceptor,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let options = ServeOptions {
        tls: Some(acceptor),
        ..ServeOptions::default()
    };
    serve_with(listener, store, options, shutdown).await
}

/// Serves an opened `store` on `listener` as `options` say, until `shutdown`
/// completes; then the requests in flight are finished (for at most
/// [`BODY_TIMEOUT`]).
///
/// Every connection gets `options.header_timeout` for each request's headers
/// and a TLS connection [`HANDSHAKE_TIMEOUT`] for its handshake; a bad
/// handshake (plaintext, garbage) affects only its own connection.
///
/// # Errors
/// [`ServeError::Io`] if the listener fails.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    store: ObjectStore,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::debug!(%addr, fencing = ?store.fencing(), tls = options.tls.is_some(),
            open = options.access.is_open(), "fence-store listening");
    }
    let app = router_with(store, &options);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let (app, options) = (app.clone(), options.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            match &options.tls {
                None => serve_connection(tcp, None, app, &options, watcher, peer).await,
                Some(acceptor) => {
                    let stream =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
                    let certs = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| PeerCertificates(Arc::new(c.to_vec())));
                    serve_connection(stream, certs, app, &options, watcher, peer).await;
                }
            }
        });
    }
    // Requests in flight finish; idle connections close.
    let _ = tokio::time::timeout(BODY_TIMEOUT, graceful.shutdown()).await;
    Ok(())
}

/// One connection: HTTP/1.1 with the header deadline, every request tagged
/// with the connection's verified client certificates.
async fn serve_connection<IO>(
    io: IO,
    certs: Option<PeerCertificates>,
    app: Router,
    options: &ServeOptions,
    watcher: hyper_util::server::graceful::Watcher,
    peer: std::net::SocketAddr,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        if let Some(certs) = &certs {
            request.extensions_mut().insert(certs.clone());
        }
        app.clone().oneshot(request.map(Body::new))
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(connection).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// What the store counts, served at `GET /metrics` in Prometheus' text format.
#[derive(Clone)]
struct StoreMetrics {
    registry: prometheus::Registry,
    accepted: prometheus::IntCounterVec,
    rejected: prometheus::IntCounterVec,
    stale_accepted: prometheus::IntCounter,
    token_checks: prometheus::IntCounterVec,
}

/// Why a write was refused, carried from the error to the counting layer.
#[derive(Clone, Copy)]
struct Refused(&'static str);

/// Marks a write accepted although its token was stale (fencing off).
#[derive(Clone, Copy)]
struct StaleAccepted;

/// Every reason a write can be refused for (the `reason` label's values).
const REFUSALS: [&str; 13] = [
    "stale_token",
    "missing_token",
    "malformed_token",
    "bad_key",
    "bad_lock",
    "body_too_large",
    "body_timeout",
    "unauthenticated",
    "permission_denied",
    "token_not_issued",
    "token_not_current",
    "token_check_unavailable",
    "storage",
];

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
                "Writes the store refused, by reason (stale_token, unauthenticated, token_not_issued, …).",
                "reason",
            ),
            stale_accepted: prometheus::IntCounter::new(
                "palisade_fence_stale_writes_accepted_total",
                "Writes with a stale token the store accepted because fencing is off.",
            )
            .expect("valid counter"),
            token_checks: vec(
                "palisade_fence_token_checks_total",
                "Questions asked of the lock service about a token above an object's highest, by answer.",
                "answer",
            ),
        };
        for method in ["PUT", "DELETE"] {
            metrics.accepted.with_label_values(&[method]);
        }
        for reason in REFUSALS {
            metrics.rejected.with_label_values(&[reason]);
        }
        for answer in [
            "granted",
            "token_not_issued",
            "token_not_current",
            "token_check_unavailable",
        ] {
            metrics.token_checks.with_label_values(&[answer]);
        }
        for c in [
            metrics.accepted.clone(),
            metrics.rejected.clone(),
            metrics.token_checks.clone(),
        ] {
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

/// What every handler needs: the store, who may use it, which tokens it
/// believes.
#[derive(Clone)]
struct App {
    store: ObjectStore,
    access: Access,
    verifier: Option<Arc<TokenVerifier>>,
    body_timeout: Duration,
    metrics: StoreMetrics,
}

/// The connection's verified client certificates, when it has any.
type Certs = Option<axum::Extension<PeerCertificates>>;

impl App {
    /// The caller, if it may exercise `right` on `key`.
    fn authorize(
        &self,
        certs: &Certs,
        headers: &HeaderMap,
        right: Right,
        key: &str,
    ) -> Result<(), ApiError> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let certs = certs.as_ref().map(|axum::Extension(c)| c);
        match self.access.authorize(certs, authorization, right, key) {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::info!(key, error = %e, "fence-store request refused");
                Err(match e {
                    AccessError::Unauthenticated(why) => {
                        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", why)
                    }
                    AccessError::PermissionDenied(why) => {
                        ApiError::new(StatusCode::FORBIDDEN, "permission_denied", why)
                    }
                })
            }
        }
    }

    /// Refuses `token` for `key` unless it is at most the key's highest (believed
    /// before, or stale — the store then says so) or the lock service granted it
    /// for `lock`.
    async fn believe(
        &self,
        key: &ObjectKey,
        lock: &str,
        token: FencingToken,
    ) -> Result<(), ApiError> {
        let Some(verifier) = &self.verifier else {
            return Ok(());
        };
        let store = self.store.clone();
        let k = key.clone();
        let highest = blocking(key, move || store.highest(&k)).await?;
        if highest.is_some_and(|h| token <= h) {
            return Ok(());
        }
        let answer = verifier.verify(lock, token).await;
        let label = match &answer {
            Ok(Belief::Known) => return Ok(()),
            Ok(Belief::Granted) => "granted",
            Err(e) => e.code(),
        };
        self.metrics.token_checks.with_label_values(&[label]).inc();
        answer.map(|_| ()).map_err(|e| {
            tracing::warn!(%key, lock, token = token.get(), error = %e, "token not believed");
            let status = match e {
                VerifyError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::CONFLICT,
            };
            ApiError::new(status, e.code(), &e)
                .with(json!({"key": key.as_str(), "lock": lock, "presented": token.get()}))
        })
    }
}

/// The HTTP routes over `store`, open to everyone and trusting every token
/// (for tests, or to mount under another router).
pub fn router(store: ObjectStore) -> Router {
    router_with(store, &ServeOptions::default())
}

/// The HTTP routes over `store`, with `options`' access and verifier.
pub fn router_with(store: ObjectStore, options: &ServeOptions) -> Router {
    let metrics = StoreMetrics::new();
    let app = App {
        store,
        access: options.access.clone(),
        verifier: options.verifier.clone(),
        body_timeout: options.body_timeout,
        metrics: metrics.clone(),
    };
    Router::new()
        .route("/v1/health", get(health))
        .route(
            "/v1/objects/{*key}",
            get(get_object).put(put_object).delete(delete_object),
        )
        // The catch-all route does not match an empty key; say so instead of 404.
        .route("/v1/objects", any(empty_key))
        .route("/v1/objects/", any(empty_key))
        .route("/metrics", get(render_metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
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
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"palisade-fence-store\""),
            );
        }
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

/// The one value of header `name`, as text, if present.
fn single_header<'h>(
    headers: &'h HeaderMap,
    name: &str,
    code: &'static str,
) -> Result<Option<&'h str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bad = |why: String| ApiError::new(StatusCode::BAD_REQUEST, code, why);
    if values.next().is_some() {
        return Err(bad(format!("more than one {name} header")));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| bad(format!("{name} is not ASCII")))
}

fn parse_token(headers: &HeaderMap) -> Result<FencingToken, ApiError> {
    let Some(text) = single_header(headers, FENCING_TOKEN_HEADER, "malformed_token")? else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "missing_token",
            "this store only accepts fenced writes: send the lock's token in a Fencing-Token header",
        ));
    };
    // Strict: digits only, no sign, spaces or leading zeros (FromStr says so).
    text.parse::<FencingToken>()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "malformed_token", e))
}

/// Whether a fenced read is shared (`Fencing-Read: shared`; absent: not).
fn parse_shared_read(headers: &HeaderMap) -> Result<bool, ApiError> {
    match single_header(headers, FENCING_READ_HEADER, "bad_read_mode")? {
        None => Ok(false),
        Some("shared") => Ok(true),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_read_mode",
            format!("Fencing-Read is \"shared\" or absent, not {other:?}"),
        )),
    }
}

/// The lock whose token fences `key` (`Fencing-Lock` header, else the key).
fn parse_lock(headers: &HeaderMap, key: &ObjectKey) -> Result<String, ApiError> {
    let lock = single_header(headers, FENCING_LOCK_HEADER, "bad_lock")?;
    lock_for_key(key.as_str(), lock)
        .map(str::to_owned)
        .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, "bad_lock", why))
}

async fn read_body(
    headers: &HeaderMap,
    body: Body,
    deadline: Duration,
) -> Result<Vec<u8>, ApiError> {
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
    match tokio::time::timeout(deadline, Limited::new(body, MAX_BODY_BYTES).collect()).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the body did not arrive within {} s", deadline.as_secs()),
        )),
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::new(
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

async fn health(State(app): State<App>) -> Response {
    let fencing = match app.store.fencing() {
        Fencing::On => "on",
        Fencing::Off => "off",
    };
    axum::Json(json!({ "status": "ok", "fencing": fencing })).into_response()
}

async fn render_metrics(
    State(app): State<App>,
    certs: Certs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    app.authorize(&certs, &headers, Right::Metrics, "")?;
    Ok(app.metrics.render())
}

async fn put_object(
    State(app): State<App>,
    key: Result<UrlPath<String>, PathRejection>,
    certs: Certs,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    app.authorize(&certs, &headers, Right::Write, key.as_str())?;
    let token = parse_token(&headers)?;
    let lock = parse_lock(&headers, &key)?;
    let body = read_body(&headers, body, app.body_timeout).await?;
    app.believe(&key, &lock, token).await?;
    let k = key.clone();
    let store = app.store.clone();
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
    State(app): State<App>,
    key: Result<UrlPath<String>, PathRejection>,
    certs: Certs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    let k = key.clone();
    let store = app.store.clone();
    let object = if headers.contains_key(FENCING_TOKEN_HEADER) {
        // A fenced read raises the fence: a write, as far as rights go.
        app.authorize(&certs, &headers, Right::Write, key.as_str())?;
        let token = parse_token(&headers)?;
        let lock = parse_lock(&headers, &key)?;
        let shared = parse_shared_read(&headers)?;
        app.believe(&key, &lock, token).await?;
        if shared {
            blocking(&key, move || store.get_shared(&k, token).map(|(_, o)| o)).await?
        } else {
            blocking(&key, move || store.get_fenced(&k, token).map(|(_, o)| o)).await?
        }
    } else {
        app.authorize(&certs, &headers, Right::Read, key.as_str())?;
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
    State(app): State<App>,
    key: Result<UrlPath<String>, PathRejection>,
    certs: Certs,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = parse_key(key)?;
    app.authorize(&certs, &headers, Right::Write, key.as_str())?;
    let token = parse_token(&headers)?;
    let lock = parse_lock(&headers, &key)?;
    app.believe(&key, &lock, token).await?;
    let k = key.clone();
    let store = app.store.clone();
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
