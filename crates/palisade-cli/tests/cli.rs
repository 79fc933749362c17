//! The `palisade` binary as a user runs it: `lock` runs a command with the token,
//! stops it when the lock is lost, and exits with documented statuses.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_testkit::PalisadeNode;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

fn palisade(node: &PalisadeNode) -> Command {
    let mut c = Command::new(bin());
    c.env("PALISADE_ENDPOINTS", node.addr());
    c
}

fn token_of(node: &PalisadeNode) -> u64 {
    let out = palisade(node)
        .args([
            "lock",
            "demo",
            "--",
            "sh",
            "-c",
            "echo $PALISADE_FENCING_TOKEN",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn lock_passes_increasing_tokens_also_across_a_restart() {
    let mut node = PalisadeNode::single(bin()).unwrap();
    let a = token_of(&node);
    let b = token_of(&node);
    assert!(b > a, "{b} after {a}");
    node.kill();
    node.start().unwrap();
    let c = token_of(&node);
    assert!(c > b, "{c} after {b} across kill -9");
}

#[test]
fn lock_returns_the_commands_status_and_75_when_not_obtained() {
    let node = PalisadeNode::single(bin()).unwrap();
    let st = palisade(&node)
        .args(["lock", "s", "--", "sh", "-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(7));

    let mut holder = palisade(&node)
        .args(["lock", "busy", "--", "sleep", "600"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_holder(&node, "busy");
    let st = palisade(&node)
        .args(["lock", "busy", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(
        st.code(),
        Some(75),
        "lock held elsewhere must not run the command"
    );
    let st = palisade(&node)
        .args(["lock", "", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(2), "empty name is a usage error");
    let _ = holder.kill();
    let _ = holder.wait();
}

fn wait_for_holder(node: &PalisadeNode, name: &str) {
    let start = Instant::now();
    loop {
        let out = palisade(node).args(["locks", "--json"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        if text
            .lines()
            .any(|l| l.contains(&format!("\"name\":\"{name}\"")) && !l.contains("\"holder\":null"))
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} never held"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn lock_stops_the_command_when_the_session_cannot_be_kept_alive() {
    let mut node = PalisadeNode::single(bin()).unwrap();
    let mut holder = palisade(&node)
        .args([
            "lock", "demo", "--ttl", "2s", "--grace", "1s", "--", "sleep", "600",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_holder(&node, "demo");
    node.kill();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = holder.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "command never stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(76), "lost lock must exit 76");
}

#[test]
fn status_json_has_the_documented_fields() {
    let node = PalisadeNode::single(bin()).unwrap();
    let out = palisade(&node).args(["status", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["leader"], 1);
    assert!(v["term"].as_u64().unwrap() >= 1);
    assert!(v["commit_index"].as_u64().is_some());
    assert_eq!(v["members"][0]["id"], 1);
    assert_eq!(v["members"][0]["addr"], node.addr());
}
