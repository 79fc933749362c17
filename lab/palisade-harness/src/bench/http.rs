//! The HTTP/JSON API as a [`FencedLocks`] backend, for the `--http` rows of
//! `palisade bench server`: the same workloads as the gRPC rows
//! ([`super::locks::uncontended`], [`super::locks::contended`]), so the two
//! differ only in the protocol.
//!
//! One session per [`HttpLocks`], on two HTTP/1.1 keep-alive connections to
//! the leader: one for its calls (acquire, release, close), one for the
//! background keep-alive, so that a long-polling acquire never delays a
//! renewal. The lease runs from when the last acknowledged keep-alive was
//! *sent*, minus a safety margin, as in every Palisade client.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use palisade_client::TlsOptions;
use palisade_core::LockError;
use palisade_core::lock::BoxFuture;
use palisade_core::{FencedLease, FencedLocks, FencingToken, LeaseState, LockOptions};
use palisade_proto::h2_channel::client_config;
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

/// Where and how to reach the leader's HTTP API.
#[derive(Clone)]
pub struct HttpTarget {
    /// The leader's client address (`host:port`).
    pub addr: String,
    /// TLS towards it (and the client certificate, if any).
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// A bearer token sent with every call.
    bearer_token: Option<String>,
}

impl HttpTarget {
    /// The target `addr`, with the same credentials as the gRPC rows.
    pub fn new(
        addr: String,
        tls: Option<&TlsOptions>,
        bearer_token: Option<String>,
    ) -> Result<Self> {
        let tls = match tls {
            None => None,
            Some(t) => {
                let identity = t.identity.as_ref().map(|(c, k)| (&c[..], &k[..]));
                let config = client_config(&t.ca_pem, identity, &[b"http/1.1"])?;
                let host = match &t.server_name {
                    Some(name) => name.clone(),
                    None => addr
                        .rsplit_once(':')
                        .map_or(addr.clone(), |(h, _)| h.to_owned()),
                };
                let name = ServerName::try_from(host).context("the server name")?;
                Some((TlsConnector::from(Arc::new(config)), name))
            }
        };
        Ok(HttpTarget {
            addr,
            tls,
            bearer_token,
        })
    }
}

/// One HTTP/1.1 connection; calls on it are one at a time.
struct Conn {
    sender: tokio::sync::Mutex<SendRequest<Full<Bytes>>>,
    target: HttpTarget,
}

impl Conn {
    async fn open(target: &HttpTarget) -> Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(&target.addr).await?;
        tcp.set_nodelay(true)?;
        let sender = match &target.tls {
            None => handshake(tcp).await?,
            Some((connector, name)) => {
                handshake(connector.connect(name.clone(), tcp).await?).await?
            }
        };
        Ok(Conn {
            sender: tokio::sync::Mutex::new(sender),
            target: target.clone(),
        })
    }

    /// POSTs `body` to `path`; the answer's status and JSON.
    async fn post(&self, path: &str, body: &Value) -> Result<(StatusCode, Value), LockError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, &self.target.addr)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = &self.target.bearer_token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        let mut sender = self.sender.lock().await;
        let answer = sender.send_request(request).await.map_err(unavailable)?;
        let status = answer.status();
        let bytes = answer
            .into_body()
            .collect()
            .await
            .map_err(unavailable)?
            .to_bytes();
        let json = serde_json::from_slice(&bytes).map_err(unavailable)?;
        Ok((status, json))
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

fn unavailable(e: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        backend: "palisade",
        detail: e.to_string(),
        why: palisade_core::Unreachable::Unknown,
    }
}

/// A refusal of the API as the trait's error, by its code.
fn refusal(status: StatusCode, body: &Value) -> LockError {
    let code = body["error"]["code"].as_str().unwrap_or("");
    let message = body["error"]["message"].as_str().unwrap_or("").to_owned();
    match code {
        "invalid_input" => LockError::InvalidInput(message),
        "would_block" => LockError::WouldBlock,
        "wait_timeout" => LockError::WaitTimeout,
        "unknown_session" => LockError::SessionExpired,
        "not_holder" | "stale_token" => LockError::NotHolder(message),
        "unauthenticated" => LockError::Unauthenticated(message),
        "permission_denied" => LockError::PermissionDenied(message),
        "limit_reached" => LockError::LimitReached(message),
        _ => unavailable(format!("HTTP {status}: {body}")),
    }
}

/// What the keep-alive task and the leases share.
struct Guarantee {
    /// On this process's monotonic clock: the send time of the last
    /// acknowledged keep-alive (or create) + TTL − margin; now once the session
    /// is known to be gone.
    until: Mutex<Instant>,
}

impl Guarantee {
    fn until(&self) -> Instant {
        *self.until.lock().expect("poisoned")
    }
}

/// A session of the HTTP API, as the lock trait's object.
pub struct HttpLocks {
    calls: Arc<Conn>,
    id: String,
    key: String,
    guarantee: Arc<Guarantee>,
    ttl: Duration,
    keep_alive: tokio::task::JoinHandle<()>,
}

impl HttpLocks {
    /// Opens a session of `ttl` at the target.
    pub async fn connect(target: &HttpTarget, ttl: Duration) -> Result<HttpLocks> {
        let calls = Arc::new(Conn::open(target).await?);
        let sent = Instant::now();
        let (status, body) = calls
            .post(
                "/v1/sessions",
                &json!({"ttl_ms": ttl.as_millis() as u64, "label": "bench/http"}),
            )
            .await?;
        anyhow::ensure!(
            status == StatusCode::OK,
            "creating a session: {status} {body}"
        );
        let field = |f: &str| {
            body[f]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("no {f} in {body}"))
        };
        let (id, key) = (field("session_id")?, field("session_key")?);
        let ttl = Duration::from_millis(body["ttl_ms"].as_u64().context("no ttl_ms")?);
        let margin = ttl / 10;
        let guarantee = Arc::new(Guarantee {
            until: Mutex::new(sent + ttl - margin),
        });
        let keep_alive = tokio::spawn(keep_alive(
            Conn::open(target).await?,
            json!({"session_id": id, "session_key": key}),
            ttl,
            margin,
            guarantee.clone(),
        ));
        Ok(HttpLocks {
            calls,
            id,
            key,
            guarantee,
            ttl,
            keep_alive,
        })
    }
}

/// Renews the session every third of its TTL until it is gone.
async fn keep_alive(
    conn: Conn,
    session: Value,
    ttl: Duration,
    margin: Duration,
    g: Arc<Guarantee>,
) {
    loop {
        tokio::time::sleep(ttl / 3).await;
        let sent = Instant::now();
        match conn.post("/v1/sessions/keepalive", &session).await {
            Ok((StatusCode::OK, _)) => {
                let mut until = g.until.lock().expect("poisoned");
                *until = (*until).max(sent + ttl - margin);
            }
            Ok((status, body)) if status == StatusCode::NOT_FOUND => {
                tracing::warn!(%body, "bench session gone");
                *g.until.lock().expect("poisoned") = Instant::now();
                return;
            }
            // Retried at the next tick; the guarantee runs out meanwhile.
            Ok(_) | Err(_) => {}
        }
    }
}

impl FencedLocks for HttpLocks {
    fn backend(&self) -> &'static str {
        "palisade"
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>> {
        Box::pin(async move {
            options.plain_lock_only("palisade HTTP")?;
            let body = json!({
                "session_id": self.id,
                "session_key": self.key,
                "name": name,
                "wait_ms": options.wait.as_millis() as u64,
                "lock_delay_ms": options.lock_delay.as_millis() as u64,
            });
            let (status, answer) = self.calls.post("/v1/locks/acquire", &body).await?;
            if status != StatusCode::OK {
                return Err(refusal(status, &answer));
            }
            let token = answer["token"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .and_then(FencingToken::new)
                .ok_or_else(|| unavailable(format!("no token in {answer}")))?;
            if Instant::now() >= self.guarantee.until() {
                return Err(LockError::GrantTooLate);
            }
            let lease: Box<dyn FencedLease> = Box::new(HttpLease {
                calls: self.calls.clone(),
                session: (self.id.clone(), self.key.clone()),
                name: name.to_owned(),
                token,
                guarantee: self.guarantee.clone(),
                ttl: self.ttl,
            });
            Ok(lease)
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            self.keep_alive.abort();
            let body = json!({"session_id": self.id, "session_key": self.key});
            match self.calls.post("/v1/sessions/close", &body).await? {
                (StatusCode::OK, _) => Ok(()),
                (status, answer) => Err(refusal(status, &answer)),
            }
        })
    }
}

/// A lock granted over the HTTP API.
struct HttpLease {
    calls: Arc<Conn>,
    session: (String, String),
    name: String,
    token: FencingToken,
    guarantee: Arc<Guarantee>,
    ttl: Duration,
}

impl std::fmt::Debug for HttpLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl FencedLease for HttpLease {
    fn name(&self) -> &str {
        &self.name
    }

    fn token(&self) -> FencingToken {
        self.token
    }

    fn remaining(&self) -> Duration {
        self.guarantee
            .until()
            .saturating_duration_since(Instant::now())
    }

    fn guaranteed_until(&self) -> Instant {
        self.guarantee.until()
    }

    fn state(&self) -> LeaseState {
        // Jeopardy below a third of the TTL: a keep-alive is then overdue.
        LeaseState::classify(self.remaining(), self.ttl / 3)
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        let guarantee = self.guarantee.clone();
        Box::pin(async move {
            // The guarantee only moves forward while the session lives: sleep
            // to it, and again if a renewal moved it meanwhile.
            loop {
                let until = guarantee.until();
                if Instant::now() >= until {
                    return;
                }
                tokio::time::sleep_until(until.into()).await;
            }
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            let body = json!({
                "session_id": self.session.0,
                "session_key": self.session.1,
                "name": self.name,
                "token": self.token.get().to_string(),
            });
            match self.calls.post("/v1/locks/release", &body).await? {
                (StatusCode::OK, _) => Ok(()),
                (status, answer) => Err(refusal(status, &answer)),
            }
        })
    }
}
