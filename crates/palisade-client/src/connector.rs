//! Finding and following the leader.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use palisade_proto::{ErrorCode, LEADER_KEY};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Response, Status};

use crate::{ClientConfig, ClientError, TlsOptions};

/// What every RPC goes through: a channel to one node, with this client's
/// credentials added to each request.
pub(crate) type Rpc = InterceptedService<Channel, Credentials>;

/// Adds the bearer token, if any, to every request.
#[derive(Clone)]
pub(crate) struct Credentials(Option<AsciiMetadataValue>);

impl Interceptor for Credentials {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Channels to the nodes, and which one is the leader as far as we know.
pub(crate) struct Connector {
    endpoints: Mutex<Vec<String>>,
    /// The address that answered last, or that a follower named as leader.
    leader: Mutex<Option<String>>,
    /// Ordered, so that the connections close in one order when the client is
    /// dropped (a simulation's replay sends the same packets in the same order).
    channels: Mutex<BTreeMap<String, Channel>>,
    pub rpc_timeout: Duration,
    pub retry_for: Duration,
    /// Rotates through endpoints when no leader is known.
    next: Mutex<usize>,
    address_map: HashMap<String, String>,
    tls: Option<TlsOptions>,
    credentials: Credentials,
    dialer: Option<std::sync::Arc<dyn crate::Dialer>>,
}

impl Connector {
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        if config.bearer_token.is_some() && config.tls.is_none() {
            return Err(ClientError::InvalidInput(
                "a bearer token is sent only over TLS: give the cluster's CA too".into(),
            ));
        }
        let credentials = Credentials(
            config
                .bearer_token
                .as_deref()
                .map(|t| {
                    format!("Bearer {}", t.trim())
                        .parse::<AsciiMetadataValue>()
                        .map(|mut v| {
                            // Kept out of debug output and HPACK tables.
                            v.set_sensitive(true);
                            v
                        })
                        .map_err(|_| {
                            ClientError::InvalidInput(
                                "the bearer token is not printable ASCII".into(),
                            )
                        })
                })
                .transpose()?,
        );
        for e in &config.endpoints {
            endpoint(e, config.tls.as_ref())?;
        }
        Ok(Connector {
            endpoints: Mutex::new(config.endpoints.clone()),
            leader: Mutex::new(None),
            channels: Mutex::new(BTreeMap::new()),
            rpc_timeout: config.rpc_timeout,
            retry_for: config.retry_for,
            next: Mutex::new(0),
            address_map: config.address_map.clone(),
            tls: config.tls.clone(),
            credentials,
            dialer: config.dialer.clone(),
        })
    }

    fn channel(&self, addr: &str) -> Result<Rpc, ClientError> {
        let mut channels = self.channels.lock().expect("poisoned");
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let endpoint = endpoint(addr, self.tls.as_ref())?;
                let c = match &self.dialer {
                    None => endpoint.connect_lazy(),
                    Some(dialer) => {
                        let dialer = dialer.clone();
                        endpoint.connect_with_connector_lazy(tower::service_fn(
                            move |uri: tonic::codegen::http::Uri| {
                                let authority =
                                    uri.authority().map(|a| a.to_string()).unwrap_or_default();
                                let dialed = dialer.dial(authority);
                                async move { dialed.await.map(hyper_util::rt::TokioIo::new) }
                            },
                        ))
                    }
                };
                channels.insert(addr.to_owned(), c.clone());
                c
            }
        };
        Ok(InterceptedService::new(channel, self.credentials.clone()))
    }

    fn target(&self) -> String {
        if let Some(l) = self.leader.lock().expect("poisoned").clone() {
            return l;
        }
        let endpoints = self.endpoints.lock().expect("poisoned");
        let mut next = self.next.lock().expect("poisoned");
        *next = (*next + 1) % endpoints.len();
        endpoints[*next].clone()
    }

    fn follow(&self, status: &Status, failed: &str) {
        let named = status
            .metadata()
            .get(LEADER_KEY)
            .and_then(|v| v.to_str().ok())
            .map(|a| self.address_map.get(a).map_or(a, String::as_str))
            .filter(|a| !a.is_empty() && *a != failed)
            .map(str::to_owned);
        if let Some(addr) = &named {
            let mut endpoints = self.endpoints.lock().expect("poisoned");
            if !endpoints.contains(addr) {
                endpoints.push(addr.clone());
            }
        }
        *self.leader.lock().expect("poisoned") = named;
    }

    /// Calls the leader, following redirects and retrying transport failures with
    /// backoff, for at most `budget`.
    pub async fn call<T, F, Fut>(&self, budget: Duration, mut rpc: F) -> Result<T, ClientError>
    where
        F: FnMut(Rpc) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let started = palisade_core::clock::now();
        let give_up = started + budget;
        let mut backoff = Duration::from_millis(20);
        // Each node's last answer, so that the final error says what every one
        // of them did (refused, timed out, no leader yet), not only the last.
        let mut tried: Vec<(String, String)> = Vec::new();
        loop {
            let addr = self.target();
            let channel = self.channel(&addr)?;
            // Every attempt ends within the budget, answered or not: a call
            // without a deadline of its own (a cancel, a close) must not hang
            // on a node that took the request and never answers.
            let left = give_up.saturating_duration_since(palisade_core::clock::now());
            let attempt = tokio::time::timeout(left.max(Duration::from_millis(1)), rpc(channel))
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(
                        "no answer within the call's budget",
                    ))
                });
            let why = match attempt {
                Ok(reply) => {
                    *self.leader.lock().expect("poisoned") = Some(addr);
                    return Ok(reply.into_inner());
                }
                Err(status) => match ErrorCode::of(&status) {
                    Some(ErrorCode::NotLeader) => {
                        self.follow(&status, &addr);
                        if self.leader.lock().expect("poisoned").is_some() {
                            "not the leader".to_owned()
                        } else {
                            "no leader elected yet".to_owned()
                        }
                    }
                    Some(ErrorCode::Unavailable) | None => {
                        self.leader.lock().expect("poisoned").take();
                        describe_failure(&status)
                    }
                    Some(_) => return Err(ClientError::from_status(&status)),
                },
            };
            match tried.iter_mut().find(|(a, _)| *a == addr) {
                Some(entry) => entry.1 = why,
                None => tried.push((addr, why)),
            }
            if palisade_core::clock::now() + backoff >= give_up {
                let each: Vec<String> = tried.iter().map(|(a, w)| format!("{a}: {w}")).collect();
                return Err(ClientError::Unavailable(format!(
                    "{} (tried for {:.1} s)",
                    each.join("; "),
                    started.elapsed().as_secs_f64()
                )));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }
}

/// A failed call in a person's words: "connection refused", "timed out", or
/// the server's own message.
fn describe_failure(status: &Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
                std::io::ErrorKind::TimedOut => "timed out".into(),
                std::io::ErrorKind::ConnectionReset => "connection reset".into(),
                _ => io.to_string(),
            };
        }
        if e.to_string().contains("timed out") {
            return "timed out".into();
        }
        cause = e.source();
    }
    match status.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            if status.message().contains("Timeout") || status.message().contains("timed out") =>
        {
            "timed out".into()
        }
        _ if status.message().is_empty() => format!("{}", status.code()),
        _ => status.message().to_owned(),
    }
}

fn endpoint(addr: &str, tls: Option<&TlsOptions>) -> Result<Endpoint, ClientError> {
    if addr.contains("://") || !addr.contains(':') {
        return Err(ClientError::InvalidInput(format!(
            "endpoint {addr:?}: expected HOST:PORT"
        )));
    }
    let invalid =
        |e: tonic::transport::Error| ClientError::InvalidInput(format!("endpoint {addr:?}: {e}"));
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(invalid)?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(config).map_err(invalid)?;
    }
    Ok(endpoint)
}
