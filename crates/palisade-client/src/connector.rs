//! Finding and following the leader.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use palisade_proto::{ErrorCode, LEADER_KEY};
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};

use crate::{ClientConfig, ClientError};

/// Channels to the nodes, and which one is the leader as far as we know.
pub(crate) struct Connector {
    endpoints: Mutex<Vec<String>>,
    /// The address that answered last, or that a follower named as leader.
    leader: Mutex<Option<String>>,
    channels: Mutex<HashMap<String, Channel>>,
    pub rpc_timeout: Duration,
    pub retry_for: Duration,
    /// Rotates through endpoints when no leader is known.
    next: Mutex<usize>,
    address_map: HashMap<String, String>,
}

impl Connector {
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        for e in &config.endpoints {
            endpoint(e)?;
        }
        Ok(Connector {
            endpoints: Mutex::new(config.endpoints.clone()),
            leader: Mutex::new(None),
            channels: Mutex::new(HashMap::new()),
            rpc_timeout: config.rpc_timeout,
            retry_for: config.retry_for,
            next: Mutex::new(0),
            address_map: config.address_map.clone(),
        })
    }

    fn channel(&self, addr: &str) -> Result<Channel, ClientError> {
        let mut channels = self.channels.lock().expect("poisoned");
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let c = endpoint(addr)?.connect_lazy();
        channels.insert(addr.to_owned(), c.clone());
        Ok(c)
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
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let give_up = Instant::now() + budget;
        let mut backoff = Duration::from_millis(20);
        let mut last: String;
        loop {
            let addr = self.target();
            let channel = self.channel(&addr)?;
            match rpc(channel).await {
                Ok(reply) => {
                    *self.leader.lock().expect("poisoned") = Some(addr);
                    return Ok(reply.into_inner());
                }
                Err(status) => match ErrorCode::of(&status) {
                    Some(ErrorCode::NotLeader) => {
                        last = format!("{addr}: not the leader");
                        self.follow(&status, &addr);
                    }
                    Some(ErrorCode::Unavailable) | None => {
                        last = format!("{addr}: {}", status.message());
                        self.leader.lock().expect("poisoned").take();
                    }
                    Some(_) => return Err(ClientError::from_status(&status)),
                },
            }
            if Instant::now() + backoff >= give_up {
                return Err(ClientError::Unavailable(last));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }
}

fn endpoint(addr: &str) -> Result<Endpoint, ClientError> {
    if addr.contains("://") || !addr.contains(':') {
        return Err(ClientError::InvalidInput(format!(
            "endpoint {addr:?}: expected HOST:PORT"
        )));
    }
    Endpoint::from_shared(format!("http://{addr}"))
        .map(|e| e.connect_timeout(Duration::from_secs(1)).tcp_nodelay(true))
        .map_err(|e| ClientError::InvalidInput(format!("endpoint {addr:?}: {e}")))
}
