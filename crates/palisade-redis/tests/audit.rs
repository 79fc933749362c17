//! The deployment audit against real servers: a replica, a duplicate URL, one
//! host, a short uptime.

mod common;

use std::time::Duration;

use palisade_redis::audit::{Severity, audit};
use palisade_testkit::RedisServer;

/// Waits (bounded) until `master` lists a replica, so the link is visible.
async fn wait_until_linked(master: &RedisServer) {
    for _ in 0..500 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut common::conn(&master.url()).await)
            .await
            .unwrap();
        if info.contains("slave0:") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("replica never connected to its master");
}

fn kinds(report: &palisade_redis::audit::AuditReport) -> Vec<&'static str> {
    report.findings.iter().map(|f| f.kind).collect()
}

#[tokio::test]
async fn finds_replica_duplicate_shared_host_and_short_uptime() {
    let master = RedisServer::start().unwrap();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let other = RedisServer::start().unwrap();
    wait_until_linked(&master).await;

    let urls = [
        master.url(),
        replica.url(),
        other.url(),
        format!("redis://localhost:{}", other.port()),
    ];
    let report = audit(
        &urls,
        Some(Duration::from_secs(3600)),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let k = kinds(&report);
    for expected in [
        "replica",
        "replicates_within_set",
        "duplicate_server",
        "shared_host",
        "short_uptime",
        "no_fsync",
    ] {
        assert!(k.contains(&expected), "{expected} missing from {k:?}");
    }
    assert!(!report.independent);
    let dup = report
        .findings
        .iter()
        .find(|f| f.kind == "duplicate_server")
        .unwrap();
    assert_eq!(dup.nodes.len(), 2);
    assert!(dup.nodes.iter().any(|u| u.contains("localhost")));
    let replica_finding = report
        .findings
        .iter()
        .find(|f| f.kind == "replica")
        .unwrap();
    assert_eq!(replica_finding.nodes, [report.nodes[1].url.clone()]);
    assert_eq!(report.nodes[1].role.as_deref(), Some("slave"));
    // Violations come first.
    let first_warning = report
        .findings
        .iter()
        .position(|f| f.severity == Severity::Warning)
        .unwrap();
    assert!(
        report.findings[first_warning..]
            .iter()
            .all(|f| f.severity == Severity::Warning)
    );
}

#[tokio::test]
async fn a_lone_persistent_node_is_independent_and_an_unreachable_one_is_not() {
    let fsync =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let report = audit(&[fsync.url()], None, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(report.independent, "{:?}", report.findings);
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert_eq!(report.nodes[0].appendfsync.as_deref(), Some("always"));

    let closed = format!(
        "redis://127.0.0.1:{}",
        palisade_testkit::free_port().unwrap()
    );
    let report = audit(&[closed], None, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(!report.independent);
    assert_eq!(kinds(&report), ["unreachable"]);
    assert!(!report.nodes[0].reachable);
}

/// A master whose asynchronous replica sits outside the set is not an
/// independent master: a failover promotes the replica without the locks
/// (the `redlock-replica-failover` drill shows two holders).
#[tokio::test]
async fn a_master_with_a_replica_outside_the_set_is_not_independent() {
    let master =
        RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).unwrap();
    let port = master.port().to_string();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    wait_until_linked(&master).await;
    let report = audit(&[master.url()], None, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!report.independent, "{:?}", report.findings);
    let finding = report
        .findings
        .iter()
        .find(|f| f.kind == "has_replicas")
        .expect("has_replicas reported");
    assert_eq!(finding.severity, Severity::Violation);
}
