//! The ZooKeeper backend against a real ensemble (Debian's `zookeeper`): the
//! lock contract's suite (`lock_contract::*`, 3 servers killed with `kill -9`
//! and cut off through the fault proxy where a property is about failures),
//! then what is ZooKeeper's own. No assertion depends on how fast the machine
//! is.

use std::time::{Duration, Instant};

use palisade_core::conformance::{Cut, Fixture, Opening, Session};
use palisade_core::lock::BoxFuture;
use palisade_core::{FencedLease, FencedLocks, LockError, LockOptions};
use palisade_faultproxy::{FaultProxies, FaultProxy};
use palisade_testkit::ZooKeeperEnsemble;
use palisade_zookeeper::{ZkLocks, znode_segment};

const TTL: Duration = Duration::from_secs(2);

fn now_or_never() -> LockOptions {
    LockOptions::default()
}

fn waiting(secs: u64) -> LockOptions {
    LockOptions {
        wait: Duration::from_secs(secs),
        ..Default::default()
    }
}

/// ZooKeeper as the lock contract's suite needs it: a 3-server ensemble
/// where a property is about failures, one server otherwise.
struct ZooKeeper {
    ensemble: ZooKeeperEnsemble,
}

impl Fixture for ZooKeeper {
    fn start(replicated: bool) -> Result<Self, String> {
        let ensemble =
            ZooKeeperEnsemble::start(if replicated { 3 } else { 1 }).map_err(|e| e.to_string())?;
        Ok(ZooKeeper { ensemble })
    }

    fn session(&self, ttl: Duration) -> Opening<'_, Session> {
        Box::pin(async move {
            let locks = ZkLocks::connect(&self.ensemble.connect_string(), ttl).await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    }

    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)> {
        Box::pin(async move {
            let proxies = FaultProxies::start(&self.ensemble.endpoints())
                .await
                .unwrap();
            let locks = ZkLocks::connect(&proxies.addrs().join(","), ttl).await?;
            let links = proxies.links();
            let cut = Cut::new(move || proxies.partition(), move || links.heal());
            Ok((Box::new(locks) as Box<dyn FencedLocks>, cut))
        })
    }

    fn kill_and_restart(&mut self) -> Result<(), String> {
        for i in 0..self.ensemble.len() {
            self.ensemble.kill(i);
        }
        for i in 0..self.ensemble.len() {
            self.ensemble.start_server(i).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The children of the lock's node, as a plain client sees them.
    fn queued<'a>(&'a self, name: &'a str) -> Option<BoxFuture<'a, usize>> {
        Some(Box::pin(async move {
            let watcher = zookeeper_client::Client::connect(&self.ensemble.connect_string())
                .await
                .unwrap();
            let parent = format!("{}/{}", palisade_zookeeper::LOCKS, znode_segment(name));
            watcher
                .get_children(&parent)
                .await
                .map_or(0, |(children, _)| children.len())
        }))
    }
}

palisade_core::conformance_suite!(ZooKeeper);

/// Waits until the lock `name` has `n` nodes queued, as a plain client sees
/// it (or panics after a minute: the fault was not reached).
async fn until_queued(watcher: &zookeeper_client::Client, name: &str, n: usize) -> Vec<String> {
    let parent = format!("/palisade/locks/{name}");
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((children, _)) = watcher.get_children(&parent).await
            && children.len() == n
        {
            return children;
        }
        assert!(
            Instant::now() < give_up,
            "{name} never had {n} nodes queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Curator's "protected" case, and an acquisition abandoned midway: a node
/// was made in the lock's queue, but its maker never learnt of it while the
/// session lives on. Left there it would reach the head of the queue owned by
/// no one and block the lock for as long as the session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_maker_lost_track_of_them_do_not_block_the_lock() {
    let zk = ZooKeeperEnsemble::start(1).unwrap();
    let direct = zk.connect_string();
    let proxy = FaultProxy::start(zk.endpoints()[0].parse().unwrap())
        .await
        .unwrap();
    // A session long enough to live through the fault.
    let a = ZkLocks::connect(&proxy.addr().to_string(), Duration::from_secs(10))
        .await
        .unwrap();
    let b = ZkLocks::connect(&direct, TTL).await.unwrap();
    let watcher = zookeeper_client::Client::connect(&direct).await.unwrap();

    // 1. The answer to a's create is lost; the connection drops; the session
    //    lives on. a must find its node again and hold the lock in its turn.
    let held = b.acquire("lost", &now_or_never()).await.unwrap();
    proxy.link().partition_replies();
    let a = std::sync::Arc::new(a);
    let acquiring = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("lost", &waiting(60)).await })
    };
    until_queued(&watcher, "lost", 2).await;
    proxy.link().sever();
    proxy.link().heal();
    held.release().await.unwrap();
    let lease = acquiring
        .await
        .unwrap()
        .expect("a found its node again and was granted the lock");
    let queue = until_queued(&watcher, "lost", 1).await;
    let stat = watcher
        .check_stat(&format!("/palisade/locks/lost/{}", queue[0]))
        .await
        .unwrap()
        .expect("a's node");
    assert_eq!(
        lease.token().get(),
        stat.czxid as u64,
        "a holds its own node"
    );
    lease.release().await.unwrap();
    let next = b.acquire("lost", &waiting(60)).await.expect("free again");
    next.release().await.unwrap();

    // 2. An acquisition dropped midway (after its node was made, before it
    //    heard so): the session's heartbeat deletes the node.
    let held = b.acquire("dropped", &now_or_never()).await.unwrap();
    proxy.link().partition_replies();
    let acquiring = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("dropped", &waiting(60)).await })
    };
    until_queued(&watcher, "dropped", 2).await;
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    proxy.link().heal();
    held.release().await.unwrap();
    let next = b
        .acquire("dropped", &waiting(60))
        .await
        .expect("the abandoned node was deleted while a's session lives on");
    next.release().await.unwrap();
    // Had a's session ended, its nodes would have gone with it and proven nothing.
    a.acquire("alive", &now_or_never())
        .await
        .expect("a's session lived on through the test")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_and_servers_it_cannot_serve_get_typed_errors() {
    let zk = ZooKeeperEnsemble::start(1).unwrap();
    let locks = ZkLocks::connect(&zk.connect_string(), TTL).await.unwrap();
    assert!(matches!(
        locks
            .acquire(
                "x",
                &LockOptions {
                    lock_delay: Duration::from_secs(1),
                    ..Default::default()
                }
            )
            .await
            .unwrap_err(),
        LockError::InvalidInput(_)
    ));
    for bad in ["", "zk://127.0.0.1:1"] {
        assert!(matches!(
            ZkLocks::connect(bad, TTL).await.err().unwrap(),
            LockError::InvalidInput(_)
        ));
    }
    // A chroot that does not exist is named as such.
    let e = ZkLocks::connect(&format!("{}/no/such/chroot", zk.connect_string()), TTL)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(e, LockError::InvalidInput(ref m) if m.contains("chroot")),
        "{e:?}"
    );
}

/// An election is Curator's LeaderLatch: the same queue as a lock, under
/// `/palisade/elections` (a lock of the same name is another thing), the
/// candidate's value as its node's data, the leader the lowest sequence, a
/// new leader with a larger token; a semaphore or a read/write lock is
/// refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_a_queue_with_values_apart_from_the_locks() {
    use palisade_core::machine::Claim;
    let zk = ZooKeeperEnsemble::start(1).unwrap();
    let direct = zk.connect_string();
    let a = ZkLocks::connect(&direct, TTL).await.unwrap();
    let b = std::sync::Arc::new(ZkLocks::connect(&direct, TTL).await.unwrap());
    let watcher = zookeeper_client::Client::connect(&direct).await.unwrap();
    let lead = |value: &str, secs| LockOptions {
        claim: Claim::Lead {
            value: value.into(),
        },
        wait: Duration::from_secs(secs),
        ..Default::default()
    };
    // The leader's value, read from ZooKeeper directly: the data of the
    // lowest-sequence child.
    let leader_value = async || {
        let parent = format!("{}/primary", palisade_zookeeper::ELECTIONS);
        let (mut children, _) = watcher.get_children(&parent).await.unwrap();
        children.sort_by_key(|c| c.rsplit('-').next().unwrap().to_owned());
        let (data, _) = watcher
            .get_data(&format!("{parent}/{}", children[0]))
            .await
            .unwrap();
        String::from_utf8(data).unwrap()
    };
    let leader = a.acquire("primary", &lead("10.0.0.1", 0)).await.unwrap();
    assert_eq!(leader_value().await, "10.0.0.1");
    let lock = b.acquire("primary", &now_or_never()).await.unwrap();
    lock.release().await.unwrap();
    assert!(matches!(
        b.acquire("primary", &lead("10.0.0.2", 0))
            .await
            .unwrap_err(),
        LockError::WouldBlock
    ));
    let next = {
        let b = b.clone();
        let options = lead("10.0.0.2", 60);
        tokio::spawn(async move { b.acquire("primary", &options).await })
    };
    let parent = format!("{}/primary", palisade_zookeeper::ELECTIONS);
    let give_up = Instant::now() + Duration::from_secs(60);
    while watcher
        .get_children(&parent)
        .await
        .map_or(0, |(c, _)| c.len())
        != 2
    {
        assert!(
            Instant::now() < give_up,
            "the second candidate never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = leader.token();
    leader.release().await.unwrap();
    let second = next.await.unwrap().unwrap();
    assert!(second.token() > first);
    assert_eq!(leader_value().await, "10.0.0.2");
    for refused in [Claim::Permit { permits: 2 }, Claim::Read, Claim::Write] {
        let options = LockOptions {
            claim: refused.clone(),
            ..Default::default()
        };
        let e = a.acquire("pool", &options).await.unwrap_err();
        assert!(
            matches!(&e, LockError::InvalidInput(m) if m.contains("zookeeper")),
            "{refused:?}: {e:?}"
        );
    }
}
