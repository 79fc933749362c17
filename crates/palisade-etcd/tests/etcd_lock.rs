//! The etcd backend against a real 3-member etcd cluster (Debian's
//! `etcd-server`), killed with `kill -9` and cut off through the fault proxy.
//! No assertion depends on how fast the machine is.

use std::time::{Duration, Instant};

use palisade_core::{FencedLease, LockError, LockOptions};
use palisade_etcd::EtcdLocks;
use palisade_faultproxy::FaultProxy;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_also_across_a_kill9_of_every_member() {
    let mut etcd = EtcdCluster::start(3).unwrap();
    let endpoints = etcd.endpoints();
    let mut tokens = Vec::new();
    {
        let locks = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
        for _ in 0..2 {
            let lease = locks.acquire("demo", &now_or_never()).await.unwrap();
            tokens.push(lease.token().get());
            lease.release().await.unwrap();
        }
    }
    for i in 0..3 {
        etcd.kill(i);
    }
    for i in 0..3 {
        etcd.start_member(i).unwrap();
    }
    let locks = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
    let after = locks.acquire("demo", &waiting(60)).await.unwrap();
    tokens.push(after.token().get());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must only grow: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_order_with_higher_tokens_and_timeouts_leave_nothing() {
    let etcd = EtcdCluster::start(3).unwrap();
    let endpoints = etcd.endpoints();
    let a = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
    let b = EtcdLocks::connect(&endpoints, TTL).await.unwrap();
    let held = a.acquire("x", &now_or_never()).await.unwrap();
    assert_eq!(
        b.acquire("x", &now_or_never()).await.unwrap_err(),
        LockError::WouldBlock
    );
    let e = b
        .acquire(
            "x",
            &LockOptions {
                wait: Duration::from_millis(300),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WaitTimeout);
    // Kept alive past several TTLs: still held.
    tokio::time::sleep(TTL * 2).await;
    assert!(!held.remaining().is_zero());
    let first = held.token();
    let waiter = tokio::spawn(async move { b.acquire("x", &waiting(60)).await.map(|l| l.token()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_loses_its_lease_before_another_is_granted() {
    let etcd = EtcdCluster::start(3).unwrap();
    let mut proxies = Vec::new();
    for e in etcd.endpoints() {
        proxies.push(FaultProxy::start(e.parse().unwrap()).await.unwrap());
    }
    let via: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let cut_off = EtcdLocks::connect(&via, TTL).await.unwrap();
    let held = cut_off.acquire("p", &now_or_never()).await.unwrap();
    let lost = held.lost();
    for p in &proxies {
        p.link().partition();
    }
    let other = EtcdLocks::connect(&etcd.endpoints(), TTL).await.unwrap();
    let granted = other.acquire("p", &waiting(60)).await.unwrap();
    let at_grant = Instant::now();
    assert!(
        held.guaranteed_until() <= at_grant,
        "two holders inside their guarantees"
    );
    tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("lost() had fired");
    assert!(granted.token() > held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors() {
    let etcd = EtcdCluster::start(1).unwrap();
    let locks = EtcdLocks::connect(&etcd.endpoints(), TTL).await.unwrap();
    assert!(matches!(
        locks.acquire("", &now_or_never()).await.unwrap_err(),
        LockError::InvalidInput(_)
    ));
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
