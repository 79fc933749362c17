//! Redlock and the single-instance lock against real `redis-server` processes.
//!
//! No assertion here depends on how fast the machine is: where time matters, a
//! delaying proxy makes a duration a lower bound, or the test waits for an event
//! with a generous limit.

mod common;

use std::time::Duration;

use common::*;
use palisade_faultproxy::FaultProxy;
use palisade_redis::{AcquireOptions, RedisLockError, Redlock, RedlockConfig};
use palisade_testkit::SilentServer;

#[tokio::test]
async fn single_instance_excludes_then_frees_on_release() {
    let s = servers(1);
    let urls = urls(&s);
    let lock = manager(&urls);
    let guard = lock.acquire("job", &opts(30_000)).await.unwrap();
    assert_eq!(holders(&urls, "job").await, 1);
    let value = get(&urls[0], "job").await.unwrap();
    assert_eq!(value.len(), 32, "value is 128 random bits, hex");

    match lock.acquire("job", &opts(30_000)).await {
        Err(RedisLockError::NoQuorum { counts, .. }) => assert_eq!(counts.refused, 1),
        other => panic!("second holder admitted: {other:?}"),
    }
    guard.release().await.unwrap();
    assert_eq!(holders(&urls, "job").await, 0);
    let again = lock.acquire("job", &opts(30_000)).await.unwrap();
    assert_ne!(
        get(&urls[0], "job").await.unwrap(),
        value,
        "a fresh value per grant"
    );
    again.release().await.unwrap();
}

#[tokio::test]
async fn quorum_survives_two_of_five_nodes_down() {
    let mut s = servers(5);
    let urls = urls(&s);
    s[0].kill();
    s[1].kill();
    let lock = manager(&urls);
    let guard = lock.acquire("report", &opts(30_000)).await.unwrap();
    assert!(guard.remaining() > Duration::ZERO);
    assert_eq!(holders(&urls[2..], "report").await, 3);
    guard.release().await.unwrap();
    assert_eq!(holders(&urls[2..], "report").await, 0);
}

#[tokio::test]
async fn three_of_five_down_fails_and_leaves_no_key() {
    let mut s = servers(5);
    let urls = urls(&s);
    for server in &mut s[..3] {
        server.kill();
    }
    let lock = manager(&urls);
    match lock.acquire("report", &opts(30_000)).await {
        Err(RedisLockError::NoQuorum {
            needed: 3,
            nodes: 5,
            counts,
            failures,
        }) => {
            assert_eq!(counts.failed, 3);
            // Each killed node is named, with why.
            assert_eq!(failures.len(), 3, "{failures:?}");
            assert!(
                failures.iter().all(|f| f.contains("connection refused")),
                "{failures:?}"
            );
            assert!(counts.granted <= 2);
        }
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert_eq!(
        holders(&urls[3..], "report").await,
        0,
        "failed attempt left keys behind"
    );
}

#[tokio::test]
async fn silent_nodes_cost_only_their_timeout() {
    let s = servers(3);
    let silent = [
        SilentServer::start().unwrap(),
        SilentServer::start().unwrap(),
    ];
    let mut urls = urls(&s);
    urls.extend(silent.iter().map(SilentServer::url));
    let config = RedlockConfig {
        node_timeout: Some(Duration::from_secs(2)),
        ..one_shot()
    };
    let lock = Redlock::new(&urls, config).unwrap();

    // Three live nodes settle the outcome: the silent ones are not awaited.
    let guard = lock.acquire("a", &opts(60_000)).await.unwrap();
    guard.release().await.unwrap();

    // With one live node refusing, the silent nodes decide, and cost their timeout:
    // the call returns (it does not hang) and counts them as timed out.
    set(&urls[2], "b", "someone-else", 60_000).await;
    let started = std::time::Instant::now();
    match lock.acquire("b", &opts(60_000)).await {
        Err(RedisLockError::NoQuorum { counts, .. }) => {
            assert_eq!(
                (counts.granted, counts.refused, counts.timed_out),
                (2, 1, 2)
            );
        }
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the node timeout"
    );
    assert_eq!(get(&urls[0], "b").await, None, "released after the failure");
    assert_eq!(get(&urls[2], "b").await.as_deref(), Some("someone-else"));
}

#[tokio::test]
async fn release_and_extend_never_touch_another_value() {
    let s = servers(3);
    let urls = urls(&s);
    let lock = manager(&urls);
    let guard = lock.acquire("k", &opts(30_000)).await.unwrap();
    // As if our lease expired and another client took the lock everywhere.
    for u in &urls {
        set(u, "k", "other-holder", 60_000).await;
    }
    match guard.extend().await {
        Err(RedisLockError::NotHolder { counts, .. }) => {
            assert_eq!(counts.granted, 0);
            assert!(counts.refused >= 2, "settled on refusals: {counts}");
        }
        other => panic!("extended someone else's lock: {other:?}"),
    }
    for u in &urls {
        assert!(
            pttl(u, "k").await > 30_000,
            "extend changed another holder's expiry"
        );
    }
    assert!(matches!(
        guard.release().await,
        Err(RedisLockError::NotHolder { .. })
    ));
    for u in &urls {
        assert_eq!(get(u, "k").await.as_deref(), Some("other-holder"));
    }
}

#[tokio::test]
async fn extend_renews_a_majority_and_moves_the_deadline() {
    let s = servers(5);
    let urls = urls(&s);
    let lock = manager(&urls);
    let guard = lock.acquire("k", &opts(5_000)).await.unwrap();
    let before = guard.remaining();
    // Stretch the lease on the nodes well beyond the TTL, then extend: each node's
    // expiry must be reset to the TTL, which shows the extension reached it.
    for u in &urls {
        let _: () = redis::cmd("PEXPIRE")
            .arg("k")
            .arg(600_000)
            .query_async(&mut conn(u).await)
            .await
            .unwrap();
    }
    let validity = guard.extend().await.unwrap();
    assert!(validity > Duration::ZERO && validity <= Duration::from_secs(5));
    let mut renewed = 0;
    for u in &urls {
        let p = pttl(u, "k").await;
        if (0..=5_000).contains(&p) {
            renewed += 1;
        }
    }
    assert!(renewed >= 3, "extension reached only {renewed} nodes");
    assert!(guard.remaining() + Duration::from_secs(1) >= before.min(guard.remaining()));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn expiry_frees_the_lock_and_the_guard_says_lost() {
    let s = servers(3);
    let urls = urls(&s);
    let lock = Redlock::new(
        &urls,
        RedlockConfig {
            node_timeout: Some(Duration::from_millis(500)),
            ..one_shot()
        },
    )
    .unwrap();
    let first = lock.acquire("short", &opts(2_000)).await.unwrap();
    assert!(lock.acquire("short", &opts(2_000)).await.is_err(), "held");
    // No timing assert: wait for the guard's own signal, with a generous bound.
    tokio::time::timeout(Duration::from_secs(30), first.lost())
        .await
        .expect("lost() never fired");
    assert_eq!(first.remaining(), Duration::ZERO);
    assert_eq!(first.state(), palisade_core::LeaseState::Lost);
    assert!(matches!(
        first.extend().await,
        Err(RedisLockError::LeaseExpired { .. })
    ));
    let waiting = AcquireOptions {
        wait: Some(Duration::from_secs(30)),
        ..opts(30_000)
    };
    let patient = Redlock::new(
        &urls,
        RedlockConfig {
            retry_count: 1_000,
            retry_delay: Duration::from_millis(20),
            ..one_shot()
        },
    )
    .unwrap();
    let second = patient.acquire("short", &waiting).await.unwrap();
    second.release().await.unwrap();
}

#[tokio::test]
async fn work_that_does_not_fit_the_validity_must_not_start() {
    // Every node sits behind a 150 ms proxy: acquisition takes at least 300 ms
    // (a lower bound that a slow machine only raises), so a 1 s lease leaves less
    // than 700 ms of validity, and 800 ms of work must not start.
    let s = servers(3);
    let mut proxies = Vec::new();
    for server in &s {
        let p = FaultProxy::start(palisade_testkit::loopback(server.port()))
            .await
            .unwrap();
        p.link().set_delay(Duration::from_millis(150));
        proxies.push(p);
    }
    let proxied: Vec<String> = proxies
        .iter()
        .map(|p| format!("redis://{}", p.addr()))
        .collect();
    let lock = Redlock::new(
        &proxied,
        RedlockConfig {
            node_timeout: Some(Duration::from_millis(490)),
            ..one_shot()
        },
    )
    .unwrap();
    let opts = AcquireOptions {
        work: Duration::from_millis(800),
        ..opts(1_000)
    };
    match lock.acquire("slow", &opts).await {
        Err(RedisLockError::ValidityExhausted {
            elapsed, required, ..
        }) => {
            assert!(elapsed >= Duration::from_millis(300));
            assert_eq!(required, Duration::from_millis(800));
        }
        Err(RedisLockError::NoQuorum { counts, .. }) if counts.timed_out > 0 => {
            // A machine so loaded that the proxy's 300 ms round trip exceeded the
            // 490 ms node timeout: still refused, which is what matters.
        }
        other => panic!("work started without enough validity: {other:?}"),
    }
    let direct = urls(&s);
    assert_eq!(holders(&direct, "slow").await, 0, "refused grant left keys");
}

#[tokio::test]
async fn delayed_restart_rule_ignores_young_nodes() {
    let s = servers(3);
    let urls = urls(&s);
    let lock = Redlock::new(
        &urls,
        RedlockConfig {
            min_uptime: Some(Duration::from_secs(3600)),
            ..one_shot()
        },
    )
    .unwrap();
    // Every node was just started: none may count, so no quorum and no keys —
    // from the very first attempt, which learns each node's uptime as it connects.
    for _ in 0..2 {
        match lock.acquire("young", &opts(30_000)).await {
            Err(RedisLockError::NoQuorum { counts, .. }) => {
                // Settled as soon as two of three were found too young.
                assert_eq!(counts.granted, 0);
                assert!(counts.ineligible >= 2, "{counts}");
            }
            other => panic!("young nodes counted: {other:?}"),
        }
        assert_eq!(holders(&urls, "young").await, 0);
    }
}

#[tokio::test]
async fn at_most_one_of_many_racing_clients_wins() {
    let s = servers(5);
    let urls = urls(&s);
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let lock = manager(&urls);
        tasks.push(tokio::spawn(async move {
            lock.acquire("race", &opts(60_000)).await.ok().map(|g| {
                // Keep the guard alive: leak it past the race by forgetting the release.
                std::mem::forget(g);
            })
        }));
    }
    let mut winners = 0;
    for t in tasks {
        if t.await.unwrap().is_some() {
            winners += 1;
        }
    }
    assert!(winners <= 1, "{winners} clients hold the lock at once");
}

/// Tasks sharing one manager share its pipelines: each request's answers must
/// still be tallied on their own. 24 tasks race for one key through one manager,
/// many times; the key's holder count, kept beside the lock, never exceeds one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_sharing_one_manager_never_hold_one_lock_together() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let s = servers(5);
    let lock = manager(&urls(&s));
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let (lock, inside, most, wins) = (lock.clone(), inside.clone(), most.clone(), wins.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                if let Ok(guard) = lock.acquire("shared-race", &opts(60_000)).await {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    wins.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two tasks held the lock at once"
    );
    assert!(wins.load(Ordering::SeqCst) > 0, "nobody ever won");
    assert_eq!(holders(&urls(&s), "shared-race").await, 0);
}

/// Many acquisitions of distinct keys made at once through one manager (they
/// go out in shared pipelines) are each granted on every node, and each
/// release deletes its own key only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_distinct_keys_through_one_manager_is_granted_and_released() {
    let s = servers(3);
    let urls = urls(&s);
    let lock = manager(&urls);
    let acquires = (0..200).map(|i| {
        let lock = lock.clone();
        async move { lock.acquire(&format!("burst-{i}"), &opts(60_000)).await }
    });
    let guards: Vec<_> = futures_util::future::join_all(acquires)
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("every distinct key is free");
    // Every request was counted once, in some batch (how many batches depends
    // on the scheduling: not asserted).
    let stats = lock.batch_stats();
    assert_eq!(stats.requests, 200, "{stats:?}");
    assert!((1..=200).contains(&stats.batches), "{stats:?}");
    for i in [0, 99, 199] {
        assert_eq!(holders(&urls, &format!("burst-{i}")).await, 3);
    }
    let (keep, release): (Vec<_>, Vec<_>) = guards
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let released =
        futures_util::future::join_all(release.into_iter().map(|(_, g)| g.release())).await;
    for r in released {
        let counts = r.unwrap();
        assert!(counts.granted >= 2, "{counts}");
    }
    assert_eq!(lock.batch_stats().requests, 300);
    // A release answers at the majority; the third delete follows on its own.
    for i in [1, 99, 199] {
        let key = format!("burst-{i}");
        let mut left = holders(&urls, &key).await;
        for _ in 0..500 {
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            left = holders(&urls, &key).await;
        }
        assert_eq!(left, 0, "{key} still held after its release");
    }
    for i in [0, 100, 198] {
        assert_eq!(holders(&urls, &format!("burst-{i}")).await, 3, "burst-{i}");
    }
    drop(keep);
}

/// Releases and extensions send their scripts by hash; a node that lost its
/// script cache (restarted, or `SCRIPT FLUSH`) answers NOSCRIPT and must get the
/// script's text instead, not count as failed.
#[tokio::test]
async fn a_node_that_lost_its_scripts_still_releases_and_extends() {
    let s = servers(3);
    let urls = urls(&s);
    let lock = manager(&urls);
    let guard = lock.acquire("flushed", &opts(60_000)).await.unwrap();
    guard.extend().await.unwrap();
    for u in &urls {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut common::conn(u).await)
            .await
            .unwrap();
    }
    guard.extend().await.expect("extend after SCRIPT FLUSH");
    let counts = guard.release().await.expect("release after SCRIPT FLUSH");
    assert_eq!(counts.failed, 0, "{counts}");
    assert!(counts.granted >= 2, "{counts}");
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let s = servers(1);
    let urls = urls(&s);
    let lock = manager(&urls);
    let invalid = |r: Result<palisade_redis::RedisGuard, RedisLockError>| {
        matches!(r, Err(RedisLockError::InvalidInput(_)))
    };
    assert!(invalid(lock.acquire("", &opts(1_000)).await));
    assert!(invalid(
        lock.acquire(&"n".repeat(10_000), &opts(1_000)).await
    ));
    assert!(invalid(lock.acquire("x", &opts(0)).await));
    assert!(invalid(
        lock.acquire("x", &opts(10 * 24 * 3600 * 1000)).await
    ));
    let work_too_long = AcquireOptions {
        work: Duration::from_secs(6),
        ..opts(5_000)
    };
    assert!(invalid(lock.acquire("x", &work_too_long).await));
    let drifty = Redlock::new(
        &urls,
        RedlockConfig {
            drift: Some(Duration::from_secs(5)),
            ..one_shot()
        },
    )
    .unwrap();
    assert!(invalid(drifty.acquire("x", &opts(5_000)).await));
    assert_eq!(holders(&urls, "x").await, 0);

    let no_nodes: [&str; 0] = [];
    assert!(matches!(
        Redlock::new(&no_nodes, one_shot()),
        Err(RedisLockError::InvalidInput(_))
    ));
    assert!(matches!(
        Redlock::new(&["http://x"], one_shot()),
        Err(RedisLockError::InvalidInput(_))
    ));
    assert!(matches!(
        Redlock::new(&[urls[0].clone(), urls[0].clone()], one_shot()),
        Err(RedisLockError::InvalidInput(_))
    ));
    let closed = format!(
        "redis://127.0.0.1:{}",
        palisade_testkit::free_port().unwrap()
    );
    let err = Redlock::connect(&[closed], one_shot(), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        RedisLockError::Unreachable {
            reachable: 0,
            needed: 1,
            ..
        }
    ));
    assert!(
        err.to_string().contains("127.0.0.1"),
        "error names the node: {err}"
    );
}
