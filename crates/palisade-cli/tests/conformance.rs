//! One contract, every correctness backend: the same checks run through
//! `backends::connect` and the `FencedLocks` trait against a real Palisade node,
//! ZooKeeper, etcd and PostgreSQL. A new backend gets the same checks with one
//! more block in `every_backend_keeps_the_lock_contract`.

use std::time::Duration;

use palisade_backends::{self as backends, BackendUrl, SessionSpec};
use palisade_core::{FencedLocks, LeaseState, LockError, LockOptions};
use palisade_testkit::{EtcdCluster, PalisadeNode, PostgresServer, ZooKeeperEnsemble};

fn now_or_never() -> LockOptions {
    LockOptions::default()
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions {
        wait,
        ..LockOptions::default()
    }
}

async fn session(url: &BackendUrl) -> Box<dyn FencedLocks> {
    let spec = SessionSpec {
        ttl: Duration::from_secs(10),
        ..SessionSpec::default()
    };
    backends::connect(url, &spec)
        .await
        .unwrap_or_else(|e| panic!("{}://{}: {e}", url.scheme, url.rest))
}

/// The checks every backend must pass.
async fn conforms(url: &BackendUrl) {
    let scheme = url.scheme.clone();
    let (a, b) = (session(url).await, session(url).await);

    // A grant, with a token and a live guarantee.
    let first = a.acquire("conformance/x", &now_or_never()).await.unwrap();
    assert_eq!(first.name(), "conformance/x", "{scheme}");
    assert_eq!(first.state(), LeaseState::Held, "{scheme}");
    assert!(!first.remaining().is_zero(), "{scheme}");

    // Held: another session is refused at once, or when its wait runs out.
    let e = b
        .acquire("conformance/x", &now_or_never())
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WouldBlock, "{scheme}");
    let e = b
        .acquire("conformance/x", &waiting(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WaitTimeout, "{scheme}");

    // A waiter is granted once the holder releases, with a higher token.
    let t1 = first.token();
    let waiter = tokio::spawn(async move {
        let lease = b
            .acquire("conformance/x", &waiting(Duration::from_secs(30)))
            .await;
        (b, lease)
    });
    first.release().await.unwrap();
    let (b, second) = waiter.await.unwrap();
    let second = second.unwrap_or_else(|e| panic!("{scheme}: waiter: {e}"));
    assert!(
        second.token() > t1,
        "{scheme}: {} after {t1}",
        second.token()
    );
    second.release().await.unwrap();

    // Bad input is refused with a typed error.
    let long = "n".repeat(300);
    for bad in ["", long.as_str(), "bad\nname"] {
        let e = a.acquire(bad, &now_or_never()).await.unwrap_err();
        assert!(
            matches!(e, LockError::InvalidInput(_)),
            "{scheme}: {bad:?}: {e:?}"
        );
    }

    // Closing a session releases what it holds.
    let held = a.acquire("conformance/y", &now_or_never()).await.unwrap();
    let t_y = held.token();
    std::mem::forget(held);
    a.close().await.unwrap();
    let after = b
        .acquire("conformance/y", &waiting(Duration::from_secs(30)))
        .await
        .unwrap_or_else(|e| panic!("{scheme}: after close: {e}"));
    assert!(after.token() > t_y, "{scheme}");
    after.release().await.unwrap();
    b.close().await.unwrap();
}

fn url(scheme: &str, rest: String) -> BackendUrl {
    BackendUrl {
        scheme: scheme.into(),
        rest,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_keeps_the_lock_contract() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_palisade"));
    let node = tokio::task::block_in_place(|| PalisadeNode::single(exe)).unwrap();
    conforms(&url("palisade", node.addr())).await;
    tokio::task::block_in_place(move || drop(node));

    let zk = tokio::task::block_in_place(|| ZooKeeperEnsemble::start(1)).unwrap();
    conforms(&url("zk", zk.connect_string())).await;
    tokio::task::block_in_place(move || drop(zk));

    let etcd = tokio::task::block_in_place(|| EtcdCluster::start(1)).unwrap();
    conforms(&url("etcd", etcd.endpoints().join(","))).await;
    tokio::task::block_in_place(move || drop(etcd));

    let pg = tokio::task::block_in_place(PostgresServer::start).unwrap();
    let pg_url = pg.url();
    let rest = pg_url.split_once("://").unwrap().1.to_owned();
    conforms(&url("postgres", rest)).await;
    tokio::task::block_in_place(move || drop(pg));
}
