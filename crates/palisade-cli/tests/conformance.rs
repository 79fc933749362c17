//! The Palisade server against the lock contract's suite (`lock_contract::*`
//! of `palisade_core::conformance`, which every backend's own tests run): real
//! `palisade serve` processes — 3 nodes killed with `kill -9` and cut off
//! through the fault proxy where a property is about failures, one node
//! otherwise — reached the way every command reaches a backend, through
//! `palisade_backends::connect`.

use std::collections::HashMap;
use std::time::Duration;

use palisade_backends::{self as backends, BackendUrl, SessionSpec};
use palisade_client::{Admin, ClientConfig};
use palisade_core::conformance::{Cut, Fixture, Opening, Session};
use palisade_core::lock::BoxFuture;
use palisade_core::{FencedLocks, LockError};
use palisade_faultproxy::FaultProxy;
use palisade_testkit::PalisadeNode;

/// Palisade nodes as the suite needs them.
struct Palisade {
    nodes: Vec<PalisadeNode>,
}

impl Palisade {
    fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(PalisadeNode::addr).collect()
    }

    async fn connect(
        endpoints: Vec<String>,
        spec: SessionSpec,
    ) -> Result<Box<dyn FencedLocks>, LockError> {
        let url = BackendUrl {
            scheme: "palisade".into(),
            rest: endpoints.join(","),
        };
        backends::connect(&url, &spec).await
    }
}

impl Fixture for Palisade {
    fn start(replicated: bool) -> Result<Self, String> {
        let exe = std::path::Path::new(env!("CARGO_BIN_EXE_palisade"));
        let nodes = if replicated {
            PalisadeNode::cluster(exe, 3, &[])
        } else {
            PalisadeNode::single(exe).map(|n| vec![n])
        };
        Ok(Palisade {
            nodes: nodes.map_err(|e| e.to_string())?,
        })
    }

    fn session(&self, ttl: Duration) -> Opening<'_, Session> {
        let spec = SessionSpec {
            ttl,
            ..SessionSpec::default()
        };
        Box::pin(Self::connect(self.addrs(), spec))
    }

    /// Every node through its own proxy, also the leader a follower names.
    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)> {
        Box::pin(async move {
            let mut proxies = Vec::new();
            let mut address_map = HashMap::new();
            for addr in self.addrs() {
                let proxy = FaultProxy::start(addr.parse().unwrap()).await.unwrap();
                address_map.insert(addr, proxy.addr().to_string());
                proxies.push(proxy);
            }
            let spec = SessionSpec {
                ttl,
                address_map: address_map.clone(),
                ..SessionSpec::default()
            };
            let locks = Self::connect(address_map.into_values().collect(), spec).await?;
            let links: Vec<_> = proxies.iter().map(|p| p.link().clone()).collect();
            let cut = Cut::new(
                move || proxies.iter().for_each(|p| p.link().partition()),
                move || links.iter().for_each(|l| l.heal()),
            );
            Ok((locks, cut))
        })
    }

    fn kill_and_restart(&mut self) -> Result<(), String> {
        for node in &mut self.nodes {
            node.kill();
        }
        for node in &mut self.nodes {
            node.start().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The lock's holders and waiters, read linearizably by an admin call.
    fn queued<'a>(&'a self, name: &'a str) -> Option<BoxFuture<'a, usize>> {
        Some(Box::pin(async move {
            let admin = Admin::new(&ClientConfig::new(self.addrs())).unwrap();
            match admin.get(name).await {
                Ok(Some(lock)) => lock.holders.len() + lock.waiters.len(),
                Ok(None) => 0,
                // Asked again by the suite's wait.
                Err(_) => usize::MAX,
            }
        }))
    }
}

palisade_core::conformance_suite!(Palisade);
