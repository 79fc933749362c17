//! The fault drills, CI-sized: every scenario on every backend it applies to, two
//! trials each, on real processes (5 `redis-server`s, a 3-node Palisade cluster,
//! a 3-server ZooKeeper ensemble, a 3-member etcd cluster, PostgreSQL, the
//! fenced store, worker processes behind fault proxies). The assertions are
//! the drills' claims, counted by the checker from the recorded histories; none
//! of them is a timing.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

const TRIALS: u64 = 2;

/// One row of `palisade chaos --json`, keyed by (scenario/variant, backend, fencing).
type Rows = HashMap<(String, String, String), Value>;

fn run_drills_with(out: &Path, extra: &[&str]) -> Rows {
    let output = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["chaos", "--json", "--seed", "20261203"])
        .args(["--trials", &TRIALS.to_string()])
        .args(["--mixed-duration", "4s"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run palisade chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "palisade chaos failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let mut rows = Rows::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let row: Value = serde_json::from_str(line).expect("a JSON line");
        let scenario = match row["variant"].as_str() {
            Some(v) if !v.is_empty() => format!("{}/{v}", row["scenario"].as_str().unwrap()),
            _ => row["scenario"].as_str().unwrap().to_owned(),
        };
        let key = (
            scenario,
            row["backend"].as_str().unwrap().to_owned(),
            row["fencing"].as_str().unwrap().to_owned(),
        );
        rows.insert(key, row);
    }
    rows
}

fn row<'a>(rows: &'a Rows, scenario: &str, backend: &str, fencing: &str) -> &'a Value {
    rows.get(&(scenario.into(), backend.into(), fencing.into()))
        .unwrap_or_else(|| panic!("no row for {scenario} · {backend} · fencing {fencing}"))
}

fn count(row: &Value, field: &str) -> u64 {
    row[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a count in {row}"))
}

#[test]
fn the_drills_show_what_each_backend_does() {
    let out = tempfile::tempdir().unwrap();
    let rows = run_drills_with(out.path(), &["--backend", "redis,redlock,palisade"]);
    for r in rows.values() {
        assert_eq!(count(r, "trials"), TRIALS, "every trial ran: {r}");
    }

    // holder-pause and delayed-write: the superseded holder's write really reaches
    // the resource after another client was granted the lock, on every backend.
    // Only Palisade's token with a fenced store turns it away.
    for scenario in ["holder-pause", "delayed-write"] {
        for (backend, fencing) in [
            ("redis", "off"),
            ("redlock", "off"),
            ("palisade", "off"),
            ("palisade", "on"),
        ] {
            let r = row(&rows, scenario, backend, fencing);
            assert_eq!(
                count(r, "trials_with_stale_write"),
                TRIALS,
                "{scenario} · {backend} · {fencing}: the late write must reach the store: {r}"
            );
            if fencing == "on" {
                assert!(count(r, "stale_writes_rejected") >= 1, "{r}");
                assert_eq!(count(r, "stale_writes_accepted"), 0, "{r}");
                assert_eq!(count(r, "lost_updates"), 0, "{r}");
            } else {
                assert!(count(r, "stale_writes_accepted") >= 1, "{r}");
            }
        }
    }

    // leader-pause: the same story for the recipes. A paused leader's (or
    // permit holder's) write reaches the store after the next was elected (or
    // granted its slot); fenced, it is refused; unfenced, it is a lost update.
    for scenario in ["leader-pause/election", "leader-pause/permit"] {
        for fencing in ["on", "off"] {
            let r = row(&rows, scenario, "palisade", fencing);
            assert_eq!(
                count(r, "trials_with_stale_write"),
                TRIALS,
                "{scenario} · {fencing}: {r}"
            );
            assert_eq!(count(r, "overlaps"), 0, "{scenario} · {fencing}: {r}");
            if fencing == "on" {
                assert_eq!(count(r, "stale_writes_rejected"), TRIALS, "{r}");
                assert_eq!(count(r, "stale_writes_accepted"), 0, "{r}");
                assert_eq!(count(r, "lost_updates"), 0, "{r}");
            } else {
                assert_eq!(count(r, "stale_writes_accepted"), TRIALS, "{r}");
                assert!(count(r, "lost_updates") >= 1, "{r}");
            }
        }
    }

    // Redlock trusts every node's clock: one jump gives two holders; no jump, none.
    let jump = row(&rows, "redlock-clock-jump/jump", "redlock", "off");
    assert_eq!(count(jump, "trials_with_overlap"), TRIALS, "{jump}");
    let no_jump = row(&rows, "redlock-clock-jump/no-jump", "redlock", "off");
    assert_eq!(count(no_jump, "overlaps"), 0, "{no_jump}");

    // A node that forgets its keys on restart gives two holders, unless it stays
    // out until every lease it granted has ended.
    for backend in ["redis", "redlock"] {
        let without = row(&rows, "redis-crash-restart/no-uptime-rule", backend, "off");
        assert_eq!(count(without, "trials_with_overlap"), TRIALS, "{without}");
        let with = row(&rows, "redis-crash-restart/uptime-rule", backend, "off");
        assert_eq!(count(with, "overlaps"), 0, "{with}");
    }

    // Palisade with fencing through leader failures and random faults: nothing
    // stale accepted, tokens monotonic, no lost increment, linearizable.
    for scenario in ["leader-failure/kill", "leader-failure/pause", "mixed"] {
        let r = row(&rows, scenario, "palisade", "on");
        assert_eq!(count(r, "stale_writes_accepted"), 0, "{scenario}: {r}");
        assert_eq!(count(r, "non_monotonic_tokens"), 0, "{scenario}: {r}");
        assert_eq!(count(r, "lost_updates"), 0, "{scenario}: {r}");
        assert_eq!(r["linearizable"], Value::Bool(true), "{scenario}: {r}");
        assert!(
            count(r, "acquire_ok") >= 1,
            "{scenario}: nothing was granted: {r}"
        );
    }

    // The report, the histories and the pictures are written.
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(report.contains("| holder-pause"), "{report}");
    let histories = std::fs::read_dir(out.path().join("histories"))
        .unwrap()
        .count();
    assert_eq!(histories as u64, rows.len() as u64 * TRIALS);
    let mut svgs = 0;
    for entry in std::fs::read_dir(out.path().join("timelines")).unwrap() {
        let svg = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(svg.starts_with("<svg"), "not an SVG");
        svgs += 1;
    }
    assert_eq!(svgs, rows.len(), "one timeline per row");
}

/// The leader-failure drill with TLS on every link (peers by mutual TLS, the
/// workers by client certificate, the store over HTTPS) keeps every claim.
#[test]
fn the_leader_failure_drill_holds_with_tls_on_every_link() {
    let out = tempfile::tempdir().unwrap();
    let rows = run_drills_with(out.path(), &["leader-failure", "--tls", "--fencing", "on"]);
    for scenario in ["leader-failure/kill", "leader-failure/pause"] {
        let r = row(&rows, scenario, "palisade", "on");
        assert_eq!(count(r, "trials"), TRIALS, "{scenario}: {r}");
        assert_eq!(count(r, "stale_writes_accepted"), 0, "{scenario}: {r}");
        assert_eq!(count(r, "non_monotonic_tokens"), 0, "{scenario}: {r}");
        assert_eq!(count(r, "lost_updates"), 0, "{scenario}: {r}");
        assert_eq!(r["linearizable"], Value::Bool(true), "{scenario}: {r}");
        assert!(
            count(r, "acquire_ok") >= 1,
            "{scenario}: nothing was granted: {r}"
        );
    }
}

/// The same drills on the systems users already run for correctness: the
/// essay's pause and delay beat every lease (ZooKeeper's session, etcd's lease,
/// PostgreSQL's row expiry) — stale writes reach an unfenced store — and each
/// one's token turns them away at a fenced one, also through a leader kill or
/// pause (PostgreSQL: a kill -9 of the postmaster and a restart) and random
/// faults.
#[test]
fn the_drills_hold_on_zookeeper_etcd_and_postgres() {
    let out = tempfile::tempdir().unwrap();
    let rows = run_drills_with(
        out.path(),
        &[
            "holder-pause",
            "delayed-write",
            "leader-failure",
            "mixed",
            "--backend",
            "zookeeper,etcd,postgres",
        ],
    );
    for r in rows.values() {
        assert_eq!(count(r, "trials"), TRIALS, "every trial ran: {r}");
    }
    for backend in ["zookeeper", "etcd", "postgres"] {
        for scenario in ["holder-pause", "delayed-write"] {
            let off = row(&rows, scenario, backend, "off");
            assert_eq!(count(off, "trials_with_stale_write"), TRIALS, "{off}");
            assert!(count(off, "stale_writes_accepted") >= 1, "{off}");
            let on = row(&rows, scenario, backend, "on");
            assert_eq!(count(on, "trials_with_stale_write"), TRIALS, "{on}");
            assert!(count(on, "stale_writes_rejected") >= 1, "{on}");
            assert_eq!(count(on, "stale_writes_accepted"), 0, "{on}");
            assert_eq!(count(on, "lost_updates"), 0, "{on}");
        }
        let mut fenced = vec!["leader-failure/kill", "mixed"];
        if backend != "postgres" {
            fenced.push("leader-failure/pause");
        }
        for scenario in fenced {
            let r = row(&rows, scenario, backend, "on");
            assert_eq!(count(r, "stale_writes_accepted"), 0, "{scenario}: {r}");
            assert_eq!(count(r, "non_monotonic_tokens"), 0, "{scenario}: {r}");
            assert_eq!(count(r, "lost_updates"), 0, "{scenario}: {r}");
            assert_eq!(r["linearizable"], Value::Bool(true), "{scenario}: {r}");
            assert!(
                count(r, "acquire_ok") >= 1,
                "{scenario}: nothing was granted: {r}"
            );
        }
    }
    assert!(
        !rows.contains_key(&(
            "leader-failure/pause".into(),
            "postgres".into(),
            "on".into()
        )),
        "pausing the postmaster does not pause PostgreSQL; the drill must not pretend it does"
    );
}

/// Redlock assumes independent masters: a node that fails over to an
/// asynchronous replica which never received the key (its replication stream
/// is held from before client 1's grant until the master is killed) lets a
/// second client get a majority — two holders in every trial. The same kill
/// with nothing promoted in its place leaves client 2 short of a majority.
#[test]
fn a_redlock_node_failing_over_to_an_async_replica_gives_two_holders() {
    let out = tempfile::tempdir().unwrap();
    let rows = run_drills_with(
        out.path(),
        &["redlock-replica-failover", "--backend", "redlock"],
    );
    assert_eq!(rows.len(), 2, "one row per variant: {rows:?}");
    let failover = row(&rows, "redlock-replica-failover/failover", "redlock", "off");
    assert_eq!(count(failover, "trials"), TRIALS, "{failover}");
    assert_eq!(count(failover, "trials_with_overlap"), TRIALS, "{failover}");
    assert!(count(failover, "overlaps") >= TRIALS, "{failover}");
    let independent = row(
        &rows,
        "redlock-replica-failover/independent",
        "redlock",
        "off",
    );
    assert_eq!(count(independent, "trials"), TRIALS, "{independent}");
    assert_eq!(count(independent, "overlaps"), 0, "{independent}");
    // The staging is checked, not assumed: the key was on the master and not
    // on its replica at the grant, and the promoted replica never got it.
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(
        report.contains("after client 1's grant: the key is on redis 3 and not on its replica"),
        "{report}"
    );
    assert!(
        report.contains("the promoted replica does not have the key"),
        "{report}"
    );
    assert!(!report.contains("HAS the key"), "{report}");
    assert!(!report.contains("ALSO on"), "{report}");
}
