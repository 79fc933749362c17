//! The etcd backend against a real etcd cluster (Debian's `etcd-server`):
//! the lock contract's suite (`lock_contract::*`, 3 members killed with
//! `kill -9` and cut off through the fault proxy where a property is about
//! failures), then what is etcd's own. No assertion depends on how fast the
//! machine is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::conformance::{Cut, Fixture, Opening, Session};
use palisade_core::lock::BoxFuture;
use palisade_core::{FencedLease, FencedLocks, LockError, LockOptions};
use palisade_etcd::EtcdLocks;
use palisade_faultproxy::{FaultProxies, FaultProxy};
use palisade_testkit::EtcdCluster;

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

/// etcd as the lock contract's suite needs it: 3 members where a property is
/// about failures, one otherwise.
struct Etcd {
    cluster: EtcdCluster,
}

impl Fixture for Etcd {
    fn start(replicated: bool) -> Result<Self, String> {
        let cluster =
            EtcdCluster::start(if replicated { 3 } else { 1 }).map_err(|e| e.to_string())?;
        Ok(Etcd { cluster })
    }

    fn session(&self, ttl: Duration) -> Opening<'_, Session> {
        Box::pin(async move {
            let locks = EtcdLocks::connect(&self.cluster.endpoints(), ttl).await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    }

    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)> {
        Box::pin(async move {
            let proxies = FaultProxies::start(&self.cluster.endpoints())
                .await
                .unwrap();
            let locks = EtcdLocks::connect(&proxies.addrs(), ttl).await?;
            let links = proxies.links();
            let cut = Cut::new(move || proxies.partition(), move || links.heal());
            Ok((Box::new(locks) as Box<dyn FencedLocks>, cut))
        })
    }

    fn kill_and_restart(&mut self) -> Result<(), String> {
        let members = self.cluster.members().len();
        for i in 0..members {
            self.cluster.kill(i);
        }
        for i in 0..members {
            self.cluster.start_member(i).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn queued<'a>(&'a self, name: &'a str) -> Option<BoxFuture<'a, usize>> {
        let endpoint = self.cluster.endpoints().remove(0);
        Some(Box::pin(async move {
            usize::try_from(queued(&endpoint, name).await).unwrap()
        }))
    }
}

palisade_core::conformance_suite!(Etcd);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_and_endpoints_it_cannot_serve_get_typed_errors() {
    let etcd = EtcdCluster::start(1).unwrap();
    let locks = EtcdLocks::connect(&etcd.endpoints(), TTL).await.unwrap();
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
    for bad in [
        vec![],
        vec!["http://127.0.0.1:1".to_owned()],
        vec!["nohost".to_owned()],
    ] {
        assert!(matches!(
            EtcdLocks::connect(&bad, TTL).await.err().unwrap(),
            LockError::InvalidInput(_)
        ));
    }
    let closed = palisade_testkit::free_port().unwrap();
    assert!(matches!(
        EtcdLocks::connect(&[format!("127.0.0.1:{closed}")], TTL)
            .await
            .err()
            .unwrap(),
        LockError::Unavailable { .. }
    ));
}

/// A release whose delete never reached etcd leaves the session's key behind.
/// The session's next acquire of that lock must not hand out the earlier grant's
/// token again as if it were a new grant: it deletes the leftover and queues anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_never_reached_etcd_is_not_granted_again_with_its_token() {
    let etcd = EtcdCluster::start(1).unwrap();
    let endpoint = etcd.endpoints()[0].parse().unwrap();
    let proxy = FaultProxy::start(endpoint).await.unwrap();
    let via = [proxy.addr().to_string()];
    let locks = EtcdLocks::connect(&via, Duration::from_secs(30))
        .await
        .unwrap();
    let first = locks.acquire("r", &now_or_never()).await.unwrap();
    let first_token = first.token();
    proxy.link().partition();
    assert!(
        first.release().await.is_err(),
        "the delete cannot have reached etcd"
    );
    // Held bytes would flow on after a heal: close the connections first, so the
    // delete is lost for good.
    proxy.link().sever();
    proxy.link().heal();
    let second = locks.acquire("r", &now_or_never()).await.unwrap();
    assert!(
        second.token() > first_token,
        "grant {} after a release that failed, token {first_token}",
        second.token()
    );
    // The leftover is gone: after this release the lock is free for others.
    second.release().await.unwrap();
    let other = EtcdLocks::connect(&etcd.endpoints(), Duration::from_secs(30))
        .await
        .unwrap();
    assert!(other.acquire("r", &now_or_never()).await.is_ok());
}

/// How many keys the lock `name` has queued, read through etcd's JSON gateway
/// (`POST /v3/kv/range`) on `endpoint`, bypassing the client under test.
async fn queued(endpoint: &str, name: &str) -> u64 {
    queued_under(endpoint, palisade_etcd::PREFIX, name).await
}

/// Keys queued for `name` under `root` (the locks' or the elections' prefix).
async fn queued_under(endpoint: &str, root: &str, name: &str) -> u64 {
    let reply = range(endpoint, root, name, r#""count_only":true"#).await;
    // JSON of proto3 leaves a zero count out.
    reply
        .split("\"count\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// etcd's answer (JSON, through its gateway, not through the backend) to a
/// range over `root` `name` `/` with `options` (`"limit":1`, …).
async fn range(endpoint: &str, root: &str, name: &str, options: &str) -> String {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let prefix = format!("{root}{name}/").into_bytes();
    let mut end = prefix.clone();
    *end.last_mut().unwrap() += 1;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = format!(
        r#"{{"key":"{}","range_end":"{}",{options}}}"#,
        b64.encode(&prefix),
        b64.encode(&end)
    );
    let mut conn = tokio::net::TcpStream::connect(endpoint).await.unwrap();
    let request = format!(
        "POST /v3/kv/range HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).await.unwrap();
    assert!(reply.contains("\"header\""), "not a range answer: {reply}");
    reply
}

/// Waits until the lock `name` has `n` keys queued (or panics after a minute:
/// the fault was not reached).
async fn until_queued(endpoint: &str, name: &str, n: u64) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while queued(endpoint, name).await != n {
        assert!(Instant::now() < give_up, "{name} never had {n} keys queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A key its maker lost track of while its session lives on — a release whose
/// delete never reached etcd, an acquisition dropped midway — must not block
/// the lock for the others for as long as that session is kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_whose_maker_lost_track_of_them_do_not_block_the_lock() {
    let etcd = EtcdCluster::start(1).unwrap();
    let direct = etcd.endpoints();
    let proxy = FaultProxy::start(direct[0].parse().unwrap()).await.unwrap();
    // A lease long enough to live through the faults below.
    let a = Arc::new(
        EtcdLocks::connect(&[proxy.addr().to_string()], Duration::from_secs(15))
            .await
            .unwrap(),
    );
    let b = EtcdLocks::connect(&direct, TTL).await.unwrap();

    // 1. A release whose delete never reached etcd.
    let held = a.acquire("gone", &now_or_never()).await.unwrap();
    proxy.link().partition();
    assert!(
        held.release().await.is_err(),
        "the delete cannot have reached etcd"
    );
    proxy.link().sever();
    proxy.link().heal();
    let next = b
        .acquire("gone", &waiting(60))
        .await
        .expect("the leftover key was deleted while a's session lives on");
    next.release().await.unwrap();

    // 2. An acquisition dropped after its key was made, before it heard so.
    let held = b.acquire("dropped", &now_or_never()).await.unwrap();
    proxy.link().partition_replies();
    let acquiring = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("dropped", &waiting(60)).await.map(|l| l.token()) })
    };
    until_queued(&direct[0], "dropped", 2).await;
    acquiring.abort();
    assert!(acquiring.await.unwrap_err().is_cancelled());
    proxy.link().sever();
    proxy.link().heal();
    held.release().await.unwrap();
    let next = b
        .acquire("dropped", &waiting(60))
        .await
        .expect("the abandoned key was deleted while a's session lives on");
    next.release().await.unwrap();

    // Had a's lease ended, its keys would have gone with it and proven nothing.
    a.acquire("alive", &now_or_never())
        .await
        .expect("a's session lived on through the test")
        .release()
        .await
        .unwrap();
}

/// The value of the election `name`'s leader as etcd holds it: the key of
/// the lowest create revision under the election's prefix, past its 16 random
/// bytes (read through etcd's JSON gateway, not through the backend).
async fn leader_value(endpoint: &str, name: &str) -> Option<String> {
    use base64::Engine as _;
    let options = r#""limit":1,"sort_order":"ASCEND","sort_target":"CREATE""#;
    let reply = range(endpoint, palisade_etcd::ELECTION_PREFIX, name, options).await;
    let value = reply.split("\"value\":\"").nth(1)?.split('"').next()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value)
        .unwrap();
    Some(String::from_utf8(bytes[16..].to_vec()).unwrap())
}

/// An election is etcd's election recipe: the same queue as a lock, apart
/// from the locks' (a lock of the same name is another thing), the value in
/// the leader's key, a new leader with a larger token; a semaphore or a
/// read/write lock is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_a_queue_with_values_apart_from_the_locks() {
    use palisade_core::machine::Claim;
    let etcd = EtcdCluster::start(1).unwrap();
    let endpoints = etcd.endpoints();
    let endpoint = endpoints[0].trim_start_matches("http://").to_owned();
    let a = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
    let b = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
    let lead = |value: &str, secs| LockOptions {
        claim: Claim::Lead {
            value: value.into(),
        },
        wait: Duration::from_secs(secs),
        ..Default::default()
    };
    let leader = a.acquire("primary", &lead("10.0.0.1", 0)).await.unwrap();
    assert_eq!(
        leader_value(&endpoint, "primary").await.as_deref(),
        Some("10.0.0.1")
    );
    // A lock of the same name is free: elections live apart.
    let lock = b.acquire("primary", &now_or_never()).await.unwrap();
    lock.release().await.unwrap();
    assert!(matches!(
        b.acquire("primary", &lead("10.0.0.2", 0))
            .await
            .unwrap_err(),
        LockError::WouldBlock
    ));
    let b = Arc::new(b);
    let next = {
        let b = b.clone();
        let options = lead("10.0.0.2", 60);
        tokio::spawn(async move { b.acquire("primary", &options).await })
    };
    while queued_under(&endpoint, palisade_etcd::ELECTION_PREFIX, "primary").await != 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = leader.token();
    leader.release().await.unwrap();
    let second = next.await.unwrap().unwrap();
    assert!(second.token() > first);
    assert_eq!(
        leader_value(&endpoint, "primary").await.as_deref(),
        Some("10.0.0.2")
    );
    for refused in [Claim::Permit { permits: 2 }, Claim::Read, Claim::Write] {
        let options = LockOptions {
            claim: refused.clone(),
            ..Default::default()
        };
        let e = a.acquire("pool", &options).await.unwrap_err();
        assert!(
            matches!(&e, LockError::InvalidInput(m) if m.contains("etcd")),
            "{refused:?}: {e:?}"
        );
    }
}
