//! `palisade review` against real systems: a Redlock set, a Palisade node, a
//! fence store and a real drill report.

use palisade_testkit::{FenceStoreProcess, PalisadeNode, RedisServer};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

fn review(args: &[&str]) -> (Option<i32>, String, String) {
    let out: Output = Command::new(bin())
        .arg("review")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_correctness_need_on_redlock_fails_and_says_why() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let backend = servers
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let (code, record, said) = review(&["job", "--backend", &backend, "--need", "correctness"]);
    assert_eq!(code, Some(1), "{record}{said}");
    assert!(
        record.starts_with("# Design review: lock `job`"),
        "{record}"
    );
    assert!(
        record.contains("Redlock (independent Redis masters)"),
        "{record}"
    );
    assert!(record.contains("issues no fencing token"), "{record}");
    assert!(record.contains("`palisade redis audit`"), "{record}");
    assert!(said.contains("does not meet the need"), "{said}");

    // The same set for efficiency: no token needed, an audit that passes on
    // independent local masters aside from sharing a host… which the audit
    // calls a violation of Redlock's independence, so it still fails.
    let (code, record, _) = review(&["job", "--backend", &backend, "--need", "efficiency"]);
    assert_eq!(code, Some(1), "{record}");
    assert!(record.contains("Redis audit:"), "{record}");

    // One Redis instance for efficiency: nothing to be independent of.
    let (code, record, said) = review(&[
        "job",
        "--backend",
        &servers[0].url(),
        "--need",
        "efficiency",
        "--work",
        "1s",
    ]);
    assert_eq!(code, Some(0), "{record}{said}");
    assert!(record.contains("Validity budget"), "{record}");
    assert!(record.contains("fits"), "{record}");
    // Work longer than a grant's validity does not fit.
    let (code, record, _) = review(&[
        "job",
        "--backend",
        &servers[0].url(),
        "--need",
        "efficiency",
        "--ttl",
        "2s",
        "--work",
        "5s",
    ]);
    assert_eq!(code, Some(1), "{record}");
    assert!(record.contains("does not fit"), "{record}");
}

#[test]
fn a_correctness_need_on_palisade_with_a_fenced_store_and_a_passing_drill_passes() {
    let node = PalisadeNode::single(bin()).unwrap();
    let store = FenceStoreProcess::start(bin()).unwrap();
    let drills = tempfile::tempdir().unwrap();
    let ran = Command::new(bin())
        .args([
            "chaos",
            "holder-pause",
            "--backend",
            "palisade",
            "--fencing",
            "on",
        ])
        .args(["--trials", "1", "--out"])
        .arg(drills.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let backend = format!("palisade://{}", node.addr());
    let resource = format!("http://{}", store.addr());
    let drills_dir = drills.path().to_str().unwrap();
    let (code, record, said) = review(&[
        "nightly-export",
        "--backend",
        &backend,
        "--need",
        "correctness",
        "--resource",
        &resource,
        "--drills",
        drills_dir,
        "--work",
        "1h",
    ]);
    assert_eq!(code, Some(0), "{record}{said}");
    assert!(record.contains("the Raft log index"), "{record}");
    assert!(record.contains("fencing **on**"), "{record}");
    assert!(record.contains("holder-pause"), "{record}");
    assert!(
        record.contains("voting member(s), leader node 1"),
        "{record}"
    );
    assert!(record.contains("**Meets the need.**"), "{record}");

    // A resource that checks nothing fails the same set-up.
    let (code, record, _) = review(&[
        "nightly-export",
        "--backend",
        &backend,
        "--need",
        "correctness",
        "--resource",
        "none",
        "--drills",
        drills_dir,
    ]);
    assert_eq!(code, Some(1), "{record}");
    assert!(record.contains("does not check fencing tokens"), "{record}");

    // Facts that cannot be had are named, and the rest is still written.
    let nowhere = format!(
        "http://127.0.0.1:{}",
        palisade_testkit::free_port().unwrap()
    );
    let (code, record, said) = review(&[
        "nightly-export",
        "--backend",
        &backend,
        "--need",
        "correctness",
        "--resource",
        &nowhere,
        "--drills",
        "/nonexistent/drills",
    ]);
    assert_eq!(code, Some(1), "{record}");
    assert!(record.contains("## The lock"), "{record}");
    assert!(record.contains("could not be read"), "{record}");
    assert!(said.contains("could not get the drills' results"), "{said}");
    assert!(
        said.contains(&format!("could not get the resource at {nowhere}")),
        "{said}"
    );

    // A backend that does not answer: its status is named as missing, and the
    // verdict rests on what was had (the design: token, fenced store, drills).
    let silent = format!(
        "palisade://127.0.0.1:{}",
        palisade_testkit::free_port().unwrap()
    );
    let (code, record, said) = review(&[
        "nightly-export",
        "--backend",
        &silent,
        "--need",
        "correctness",
        "--resource",
        &resource,
        "--drills",
        drills_dir,
    ]);
    assert!(record.contains("## Fault drills"), "{record}");
    assert!(record.contains("Facts that could not be had"), "{record}");
    assert!(
        said.contains("could not get the cluster's status"),
        "{said}"
    );
    assert_eq!(code, Some(0), "{record}{said}");
}
