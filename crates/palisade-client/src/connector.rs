//! Finding and following the leader.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use palisade_core::Unreachable;
use palisade_proto::h2_channel::{H2Channel, TlsDialing};
use palisade_proto::{ErrorCode, LEADER_KEY};
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::{ClientConfig, ClientError};

/// What every RPC goes through: a channel to one node (straight over HTTP/2, see
/// [`H2Channel`]), with this client's credentials added to each request.
pub(crate) type Rpc = InterceptedService<H2Channel, Credentials>;

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
    channels: Mutex<BTreeMap<String, H2Channel>>,
    pub rpc_timeout: Duration,
    pub retry_for: Duration,
    /// Rotates through endpoints when no leader is known.
    next: Mutex<usize>,
    address_map: HashMap<String, String>,
    tls: Option<Tls>,
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
            check_endpoint(e)?;
        }
        let tls = config
            .tls
            .as_ref()
            .map(|t| {
                let identity = t
                    .identity
                    .as_ref()
                    .map(|(c, k)| (c.as_slice(), k.as_slice()));
                TlsDialing::from_pem(&t.ca_pem, identity)
                    .map(|dialing| Tls {
                        dialing,
                        server_name: t.server_name.clone(),
                    })
                    .map_err(|e| ClientError::InvalidInput(format!("TLS: {e}")))
            })
            .transpose()?;
        Ok(Connector {
            endpoints: Mutex::new(config.endpoints.clone()),
            leader: Mutex::new(None),
            channels: Mutex::new(BTreeMap::new()),
            rpc_timeout: config.rpc_timeout,
            retry_for: config.retry_for,
            next: Mutex::new(0),
            address_map: config.address_map.clone(),
            tls,
            credentials,
            dialer: config.dialer.clone(),
        })
    }

    fn channel(&self, addr: &str) -> Result<Rpc, ClientError> {
        let mut channels = self.channels.lock().expect("poisoned");
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = self.new_channel(addr)?;
                channels.insert(addr.to_owned(), c.clone());
                c
            }
        };
        Ok(InterceptedService::new(channel, self.credentials.clone()))
    }

    /// A lazily connecting channel to `addr`: over the configured dialer or TCP,
    /// with TLS when configured.
    fn new_channel(&self, addr: &str) -> Result<H2Channel, ClientError> {
        let invalid = |e: &dyn std::fmt::Display| {
            ClientError::InvalidInput(format!("endpoint {addr:?}: {e}"))
        };
        check_endpoint(addr)?;
        let dialer: palisade_proto::h2_channel::Dialer = match &self.dialer {
            None => H2Channel::tcp_dialer(addr.to_owned()),
            Some(dialer) => {
                let (dialer, addr) = (dialer.clone(), addr.to_owned());
                std::sync::Arc::new(move || {
                    let dialed = dialer.dial(addr.clone());
                    Box::pin(async move {
                        Ok(Box::new(dialed.await?) as Box<dyn palisade_proto::h2_channel::Io>)
                    })
                })
            }
        };
        let dialer = match &self.tls {
            None => dialer,
            Some(tls) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = tls.server_name.as_deref().unwrap_or(host);
                tls.dialing.dialer(dialer, name).map_err(|e| invalid(&e))?
            }
        };
        H2Channel::new(addr, self.tls.is_some(), Duration::from_secs(1), dialer)
            .map_err(|e| invalid(&e))
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
        let mut tried: Vec<(String, String, Unreachable)> = Vec::new();
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
            let (words, why) = match attempt {
                Ok(reply) => {
                    *self.leader.lock().expect("poisoned") = Some(addr);
                    return Ok(reply.into_inner());
                }
                Err(status) => match ErrorCode::of(&status) {
                    Some(ErrorCode::NotLeader) => {
                        self.follow(&status, &addr);
                        if self.leader.lock().expect("poisoned").is_some() {
                            ("not the leader".to_owned(), Unreachable::Unknown)
                        } else {
                            ("no leader elected yet".to_owned(), Unreachable::NoLeader)
                        }
                    }
                    Some(ErrorCode::Unavailable) | None => {
                        self.leader.lock().expect("poisoned").take();
                        describe_failure(&status)
                    }
                    Some(_) => return Err(ClientError::from_status(&status)),
                },
            };
            match tried.iter_mut().find(|(a, _, _)| *a == addr) {
                Some(entry) => (entry.1, entry.2) = (words, why),
                None => tried.push((addr, words, why)),
            }
            if palisade_core::clock::now() + backoff >= give_up {
                let each: Vec<String> = tried.iter().map(|(a, w, _)| format!("{a}: {w}")).collect();
                return Err(ClientError::Unavailable {
                    detail: format!(
                        "{} (tried for {:.1} s)",
                        each.join("; "),
                        started.elapsed().as_secs_f64()
                    ),
                    why: overall(tried.iter().map(|(_, _, why)| *why)),
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }
}

/// What the nodes' failures add up to: a refused connection anywhere says
/// the most (a wrong address), then no leader, then no answer in time.
fn overall(each: impl Iterator<Item = Unreachable> + Clone) -> Unreachable {
    [
        Unreachable::Refused,
        Unreachable::NoLeader,
        Unreachable::TimedOut,
    ]
    .into_iter()
    .find(|kind| each.clone().any(|why| why == *kind))
    .unwrap_or_default()
}

/// A failed call in a person's words — "connection refused", "timed out", or
/// the server's own message — and its kind.
fn describe_failure(status: &Status) -> (String, Unreachable) {
    let timed_out = || ("timed out".to_owned(), Unreachable::TimedOut);
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    ("connection refused".into(), Unreachable::Refused)
                }
                std::io::ErrorKind::TimedOut => timed_out(),
                std::io::ErrorKind::ConnectionReset => {
                    ("connection reset".into(), Unreachable::Unknown)
                }
                _ => (io.to_string(), Unreachable::Unknown),
            };
        }
        // hyper's and tower's timeouts are errors of their own, not io ones:
        // their words are all that tells them apart.
        if e.to_string().contains("timed out") {
            return timed_out();
        }
        cause = e.source();
    }
    match status.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            if status.message().contains("Timeout") || status.message().contains("timed out") =>
        {
            timed_out()
        }
        // The call's own budget ran out (see `call`).
        tonic::Code::DeadlineExceeded => (status.message().to_owned(), Unreachable::TimedOut),
        _ if status.message().is_empty() => (format!("{}", status.code()), Unreachable::Unknown),
        _ => (status.message().to_owned(), Unreachable::Unknown),
    }
}

/// Checks that `addr` is `HOST:PORT`.
fn check_endpoint(addr: &str) -> Result<(), ClientError> {
    if addr.contains("://") || !addr.contains(':') {
        return Err(ClientError::InvalidInput(format!(
            "endpoint {addr:?}: expected HOST:PORT"
        )));
    }
    addr.parse::<tonic::codegen::http::uri::Authority>()
        .map(drop)
        .map_err(|e| ClientError::InvalidInput(format!("endpoint {addr:?}: {e}")))
}

/// TLS to the nodes, ready to dial.
struct Tls {
    dialing: TlsDialing,
    /// The name expected in the nodes' certificates; `None`: each address's host.
    server_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_anywhere_names_the_failure_then_no_leader_then_timeouts() {
        use Unreachable::*;
        assert_eq!(overall([TimedOut, Refused, NoLeader].into_iter()), Refused);
        assert_eq!(overall([TimedOut, NoLeader].into_iter()), NoLeader);
        assert_eq!(overall([Unknown, TimedOut].into_iter()), TimedOut);
        assert_eq!(overall([Unknown].into_iter()), Unknown);
        assert_eq!(overall(std::iter::empty()), Unknown);
    }

    #[test]
    fn the_calls_own_budget_running_out_is_a_timeout_in_its_own_words() {
        let status = Status::deadline_exceeded("no answer within the call's budget");
        assert_eq!(
            describe_failure(&status),
            (
                "no answer within the call's budget".to_owned(),
                Unreachable::TimedOut
            )
        );
        let (_, why) = describe_failure(&Status::unavailable("shutting down"));
        assert_eq!(why, Unreachable::Unknown);
    }
}
