//! `palisade bench lock` as a user runs it: one run starts every correctness
//! backend and prints the same rows for each. The numbers are not judged here
//! (timings belong in benchmarks, not in asserts); that every row is there, with
//! every documented field and work actually done, is.

use std::process::Command;

use serde_json::Value;

/// Runs `palisade ARGS`, which must succeed, and parses its stdout as one JSON
/// object per line.
fn json_rows(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .output()
        .expect("run palisade");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn bench_lock_prints_every_backends_rows_from_one_run() {
    let rows = json_rows(&[
        "bench",
        "lock",
        "--json",
        "--duration",
        "300ms",
        "--clients",
        "1,4",
        "--contenders",
        "3",
    ]);
    let fields = [
        "backend",
        "nodes",
        "clients",
        "workload",
        "acquire_p50_us",
        "acquire_p99_us",
        "pairs_per_s",
        "handoff_p50_us",
        "handoff_p99_us",
    ];
    for r in &rows {
        for f in fields {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
        assert!(r["pairs"].as_u64().unwrap() >= 1, "no work done: {r}");
    }
    for (backend, nodes) in [
        ("palisade", 1),
        ("palisade", 3),
        ("zookeeper", 1),
        ("zookeeper", 3),
        ("etcd", 3),
        ("postgres", 1),
        ("postgres-poll", 1),
    ] {
        let of = |clients: u64, workload: &str| {
            rows.iter().find(|r| {
                r["backend"] == backend
                    && r["nodes"] == nodes
                    && r["clients"] == clients
                    && r["workload"] == workload
            })
        };
        assert!(
            of(1, "uncontended").is_some(),
            "{backend} ×{nodes}: {rows:?}"
        );
        assert!(
            of(4, "uncontended").is_some(),
            "{backend} ×{nodes}: {rows:?}"
        );
        let contended = of(3, "contended").unwrap_or_else(|| panic!("{backend}: {rows:?}"));
        // Three clients taking turns for 300 ms hand the lock over at least once.
        assert!(contended["handoff_p50_us"].is_u64(), "{contended}");
    }
    assert_eq!(rows.len(), 7 * 3, "{rows:?}");

    // A URL with an unknown scheme is bad input: exit 2, nothing started.
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["bench", "lock", "--backend", "consul://127.0.0.1:8500"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scheme"));
}

#[test]
fn bench_scale_reports_one_object_with_the_documented_fields() {
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "bench",
            "scale",
            "--json",
            "--sessions",
            "500",
            "--locks",
            "300",
        ])
        .args(["--callers", "8", "--keepalive-duration", "300ms"])
        .args(["--expiring", "50", "--expiring-ttl", "5s"])
        .output()
        .expect("run palisade bench scale");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(r["sessions"], 500, "{r}");
    assert_eq!(r["locks"], 300, "{r}");
    assert!(r["rss_bytes"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["expiring"], 50, "{r}");
    // Present (a waiter was granted each sampled lock); how fast is not judged.
    assert!(r["expired_locks_free_after_ttl_ms"].is_u64(), "{r}");
    assert!(r["acquire_p99_during_expiry_us"].is_u64(), "{r}");
    // A snapshot was built and a new learner caught up (from the snapshot if
    // the log was already compacted when it was added, else from the log).
    for f in [
        "snapshot_bytes",
        "snapshot_build_ms",
        "snapshot_install_ms",
        "acquire_p99_us",
        "acquire_p99_during_snapshot_us",
    ] {
        assert!(r[f].is_u64(), "{f} in {r}");
    }
    assert!(r["snapshot_bytes"].as_u64() > Some(300 * 8), "{r}");
    for f in [
        "create_session_per_s",
        "keepalive_per_s",
        "keepalive_p99_us",
        "acquire_per_s",
    ] {
        assert!(r[f].as_f64().is_some_and(|v| v > 0.0), "{f} in {r}");
    }
    // Bad input is refused before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["bench", "scale", "--sessions", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bench_server_rows_carry_the_leaders_commit_latency_and_the_nodes_cpu() {
    let rows = json_rows(&[
        "bench",
        "server",
        "--json",
        "--nodes",
        "1",
        "--duration",
        "300ms",
        "--clients",
        "1",
        "--contenders",
        "2",
    ]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        for f in [
            "nodes",
            "tls",
            "clients",
            "workload",
            "acquire_p50_us",
            "acquire_p99_us",
            "pairs_per_s",
            "handoff_p50_us",
            "handoff_p99_us",
            "pairs",
        ] {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
        assert!(r["pairs"].as_u64().unwrap() >= 1, "no work done: {r}");
        // Entries were committed during the row, so the leader has a figure.
        assert!(r["commit_p50_us"].as_u64().is_some_and(|us| us > 0), "{r}");
        // The bench started the nodes, so it read their CPU time; committing
        // entries costs some.
        assert!(
            r["server_cpu_us_per_op"].as_u64().is_some_and(|us| us > 0),
            "{r}"
        );
    }
}

#[test]
fn bench_server_http_rows_sit_beside_the_grpc_ones_with_the_language_clients() {
    let clients = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients");
    let rows = json_rows(&[
        "bench",
        "server",
        "--json",
        "--nodes",
        "1",
        "--duration",
        "300ms",
        "--clients",
        "1",
        "--contenders",
        "2",
        "--http",
        "--lang",
        "python,node",
        "--clients-dir",
        clients,
    ]);
    let kinds: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (f("client"), f("api"), f("workload"))
        })
        .collect();
    let expected = [
        ("rust", "grpc", "uncontended"),
        ("rust", "http", "uncontended"),
        ("rust", "grpc", "contended"),
        ("rust", "http", "contended"),
        ("python", "http", "uncontended"),
        ("node", "http", "uncontended"),
    ]
    .map(|(c, a, w)| (c.to_owned(), a.to_owned(), w.to_owned()));
    assert_eq!(kinds, expected, "{rows:?}");
    for r in &rows {
        assert!(r["pairs"].as_u64().unwrap() >= 1, "no work done: {r}");
        assert!(r["acquire_p50_us"].as_u64().is_some(), "{r}");
        assert!(r["pairs_per_s"].as_f64().is_some_and(|v| v > 0.0), "{r}");
    }
    // The contended HTTP row handed the lock over by long polls.
    assert!(
        rows[3]["handoff_p50_us"].as_u64().is_some(),
        "{:?}",
        rows[3]
    );
}

#[test]
fn bench_redis_prints_shared_and_own_manager_rows_with_twins() {
    let rows = json_rows(&[
        "bench",
        "redis",
        "--json",
        "--duration",
        "400ms",
        "--rounds",
        "1",
        "--clients",
        "3,6",
    ]);
    // One client, 3 and 6 sharing a manager, 3 with their own: 5 rows each.
    assert_eq!(rows.len(), 20, "{rows:?}");
    for r in &rows {
        for f in [
            "backend",
            "clients",
            "shared_manager",
            "slow_node_ms",
            "proxied_node",
            "acquire_p50_us",
            "acquire_p99_us",
            "release_p50_us",
            "release_p99_us",
            "pairs_per_s",
            "failed_acquires",
        ] {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
        assert!(r["pairs"].as_u64().unwrap() >= 1, "no work done: {r}");
    }
    let count = |clients: u64, shared: bool| {
        rows.iter()
            .filter(|r| r["clients"] == clients && r["shared_manager"] == shared)
            .count()
    };
    assert_eq!(count(1, false), 5);
    assert_eq!(count(3, true), 5);
    assert_eq!(count(6, true), 5);
    assert_eq!(count(3, false), 5);
    // Every slowed Redlock row has a twin through the same proxy adding nothing.
    let slowed = rows.iter().filter(|r| r["slow_node_ms"].as_u64() > Some(0));
    for s in slowed {
        assert!(
            rows.iter().any(|t| t["backend"] == s["backend"]
                && t["clients"] == s["clients"]
                && t["shared_manager"] == s["shared_manager"]
                && t["proxied_node"] == true
                && t["slow_node_ms"] == 0),
            "no twin for {s}"
        );
    }
}
