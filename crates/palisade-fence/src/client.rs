//! A small client of the fenced object store ([`crate::http`]), over HTTP or
//! HTTPS: what the drills, the demo and tests use to read and write objects with
//! a token. One request per connection; every request is bounded by a timeout.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::http::FENCING_TOKEN_HEADER;

/// How long one request may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request to the store got no answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreClientError {
    /// The CA file could not be read or holds no usable certificate.
    #[error("CA {path}: {detail}")]
    Ca {
        /// The file.
        path: String,
        /// What was wrong.
        detail: String,
    },
    /// The request could not be built (a key or address HTTP cannot carry).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The connection or the exchange failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The HTTP exchange failed.
    #[error("{0}")]
    Http(#[from] hyper::Error),
    /// The HTTP client failed (connect, send).
    #[error("{0}")]
    Client(#[from] hyper_util::client::legacy::Error),
    /// No answer within [`REQUEST_TIMEOUT`].
    #[error("the store did not answer within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout,
}

/// A reply of the store: status, `Fencing-Token` header if any, body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The token of the object's last write, when the store sent one.
    pub token: Option<u64>,
    /// The body, as text.
    pub body: String,
}

/// Where the store is, and whether it speaks TLS.
#[derive(Clone)]
pub struct StoreAddr {
    /// `HOST:PORT`.
    pub addr: String,
    /// HTTPS, trusting only the given CA; `None`: plain HTTP.
    tls: Option<TlsConnector>,
    /// Sent as `Authorization: Bearer …` (only over HTTPS).
    bearer: Option<String>,
}

impl StoreAddr {
    /// A store over plain HTTP.
    pub fn plain(addr: impl Into<String>) -> Self {
        StoreAddr {
            addr: addr.into(),
            tls: None,
            bearer: None,
        }
    }

    /// A store over HTTPS whose certificate the CA in `ca` (PEM) signed.
    ///
    /// # Errors
    /// [`StoreClientError::Ca`] when the file cannot be read or has no
    /// certificate.
    pub fn tls(addr: impl Into<String>, ca: &Path) -> Result<Self, StoreClientError> {
        Self::tls_as(addr, ca, None)
    }

    /// A store over HTTPS whose certificate the CA in `ca` signed, presenting
    /// `identity` (certificate and key, PEM files) when given: how a writer
    /// authenticates to a store started with `--auth` and `--tls-ca`.
    ///
    /// # Errors
    /// [`StoreClientError::Ca`] when a file cannot be read or used.
    pub fn tls_as(
        addr: impl Into<String>,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<Self, StoreClientError> {
        let ca_err = |detail: String| StoreClientError::Ca {
            path: ca.display().to_string(),
            detail,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(|e| ca_err(e.to_string()))? {
            roots
                .add(cert.map_err(|e| ca_err(e.to_string()))?)
                .map_err(|e| ca_err(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca_err("no certificate in the file".into()));
        }
        let builder = ClientConfig::builder_with_provider(crate::http::crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ca_err(e.to_string()))?
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let file_err = |path: &Path, detail: String| StoreClientError::Ca {
                    path: path.display().to_string(),
                    detail,
                };
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| file_err(cert, e.to_string()))?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| file_err(cert, e.to_string()))?;
                let key_der = rustls_pki_types::PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| file_err(key, e.to_string()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| file_err(cert, e.to_string()))?
            }
        };
        Ok(StoreAddr {
            addr: addr.into(),
            tls: Some(TlsConnector::from(Arc::new(config))),
            bearer: None,
        })
    }

    /// The same store, every request carrying `token` as a bearer token. Only
    /// over HTTPS: a plaintext store gets no credentials.
    #[must_use]
    pub fn with_bearer(mut self, token: impl Into<String>) -> Self {
        self.bearer = Some(token.into());
        self
    }

    /// Whether requests go over HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// One request to the store: `method` on `/v1/objects/KEY`, with `token` in the
/// `Fencing-Token` header when given.
///
/// # Errors
/// When no answer came (any HTTP status, 409 included, is an `Ok` reply).
pub async fn request(
    method: &str,
    store: &StoreAddr,
    key: &str,
    token: Option<u64>,
    body: &str,
) -> Result<Reply, StoreClientError> {
    send(method, store, &format!("/v1/objects/{key}"), token, body).await
}

/// The store's metrics (`GET /metrics`, Prometheus text), with the store's
/// credentials.
///
/// # Errors
/// When no answer came.
pub async fn metrics(store: &StoreAddr) -> Result<Reply, StoreClientError> {
    send("GET", store, "/metrics", None, "").await
}

/// Whether the store at `store` checks fencing tokens (`GET /v1/health`:
/// `"fencing": "on"`).
///
/// # Errors
/// When no answer came, or the answer is not the store's health.
pub async fn fencing_on(store: &StoreAddr) -> Result<bool, StoreClientError> {
    let reply = send("GET", store, "/v1/health", None, "").await?;
    let health: serde_json::Value = serde_json::from_str(&reply.body)
        .ok()
        .filter(|_| reply.status == 200)
        .ok_or_else(|| {
            StoreClientError::BadRequest(format!(
                "not a fence store's health answer: HTTP {} {}",
                reply.status, reply.body
            ))
        })?;
    match health["fencing"].as_str() {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        _ => Err(StoreClientError::BadRequest(format!(
            "no fencing state in {}",
            reply.body
        ))),
    }
}

async fn send(
    method: &str,
    store: &StoreAddr,
    path: &str,
    token: Option<u64>,
    body: &str,
) -> Result<Reply, StoreClientError> {
    let addr = &store.addr;
    let scheme = if store.tls.is_some() { "https" } else { "http" };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{scheme}://{addr}{path}"))
        .header(hyper::header::HOST, addr.as_str());
    if let Some(t) = token {
        req = req.header(FENCING_TOKEN_HEADER, t.to_string());
    }
    if let (Some(bearer), Some(_)) = (&store.bearer, &store.tls) {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {bearer}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| StoreClientError::BadRequest(e.to_string()))?;
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, async {
        match &store.tls {
            None => {
                let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
                Ok::<_, StoreClientError>(client.request(req).await?)
            }
            Some(connector) => {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
                let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .map_err(|e| StoreClientError::BadRequest(e.to_string()))?;
                let tls = connector.connect(name, tcp).await?;
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
                tokio::spawn(conn);
                Ok(sender.send_request(req).await?)
            }
        }
    })
    .await
    .map_err(|_| StoreClientError::Timeout)??;
    let status = resp.status().as_u16();
    let token = resp
        .headers()
        .get(FENCING_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<palisade_core::FencingToken>().ok())
        .map(palisade_core::FencingToken::get);
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        token,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}
