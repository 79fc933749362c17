//! The ZooKeeper backend against a real 3-server ensemble (Debian's
//! `zookeeper`), killed with `kill -9` and cut off through the fault proxy.
//! No assertion depends on how fast the machine is.

use std::time::{Duration, Instant};

use palisade_core::{FencedLease, LockError, LockOptions};
use palisade_faultproxy::FaultProxy;
use palisade_testkit::ZooKeeperEnsemble;
use palisade_zookeeper::{ZkLease, ZkLocks};

const TTL: Duration = Duration::from_secs(2);

/// A lock name with a slash, as users write them.
const NAME: &str = "jobs/demo";

fn now_or_never() -> LockOptions {
    LockOptions::default()
}

fn waiting(secs: u64) -> LockOptions {
    LockOptions {
        wait: Duration::from_secs(secs),
        ..Default::default()
    }
}

/// Takes `NAME` on a fresh session, again on another one while the ensemble
/// does not answer in time: right after its JVMs start, on a loaded machine, a
/// request can outlast the client's wait for an answer (`Unavailable`, seen in
/// CI). A node that request may have created dies with its session (within
/// the TTL), which the wait outlasts. What the test checks is the tokens'
/// order, not how soon the ensemble answers.
async fn acquire_on_a_new_session(endpoints: &str) -> (ZkLocks, ZkLease) {
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        let attempt = async {
            let locks = ZkLocks::connect(endpoints, TTL).await?;
            let lease = locks.acquire(NAME, &waiting(60)).await?;
            Ok::<_, LockError>((locks, lease))
        };
        match attempt.await {
            Ok(taken) => return taken,
            Err(LockError::Unavailable { .. }) if Instant::now() < give_up => {}
            Err(e) => panic!("acquire failed: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_also_across_a_kill9_of_every_server() {
    let mut zk = ZooKeeperEnsemble::start(3).unwrap();
    let endpoints = zk.connect_string();
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let (_locks, lease) = acquire_on_a_new_session(&endpoints).await;
        tokens.push(lease.token().get());
        lease.release().await.unwrap();
    }
    for i in 0..3 {
        zk.kill(i);
    }
    for i in 0..3 {
        zk.start_server(i).unwrap();
    }
    let (_locks, after) = acquire_on_a_new_session(&endpoints).await;
    tokens.push(after.token().get());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must only grow: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_order_with_higher_tokens_and_timeouts_leave_nothing() {
    let zk = ZooKeeperEnsemble::start(3).unwrap();
    let endpoints = zk.connect_string();
    let a = ZkLocks::connect(&endpoints, TTL).await.unwrap();
    let b = ZkLocks::connect(&endpoints, TTL).await.unwrap();
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
    let zk = ZooKeeperEnsemble::start(3).unwrap();
    let mut proxies = Vec::new();
    for e in zk.endpoints() {
        proxies.push(FaultProxy::start(e.parse().unwrap()).await.unwrap());
    }
    let via: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let cut_off = ZkLocks::connect(&via.join(","), TTL).await.unwrap();
    let held = cut_off.acquire("p", &now_or_never()).await.unwrap();
    let lost = held.lost();
    for p in &proxies {
        p.link().partition();
    }
    let other = ZkLocks::connect(&zk.connect_string(), TTL).await.unwrap();
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
async fn bad_input_gets_typed_errors() {
    let zk = ZooKeeperEnsemble::start(1).unwrap();
    let locks = ZkLocks::connect(&zk.connect_string(), TTL).await.unwrap();
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
