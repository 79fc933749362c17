//! What operators see: `/metrics` checked by `promtool` and scraped by a real
//! Prometheus.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_testkit::{PalisadeNode, PrometheusServer, http_get};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

fn metrics_of(node: &PalisadeNode) -> String {
    let (status, body) = http_get(&node.http_addr(), "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the sample `series` (a name, with its labels if any, exactly
/// as exported) in a text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Polls `check` every 100 ms for up to 90 s.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        if let Some(v) = check() {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for: {what}");
}

fn endpoints(nodes: &[PalisadeNode]) -> String {
    nodes
        .iter()
        .map(PalisadeNode::addr)
        .collect::<Vec<_>>()
        .join(",")
}

fn lock(nodes: &[PalisadeNode], name: &str) {
    let out = Command::new(bin())
        .args(["lock", name, "--endpoints", &endpoints(nodes), "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn promtool_check(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The single number of an instant query's answer, if it has one.
fn query_value(prometheus: &PrometheusServer, expr: &str) -> Option<f64> {
    let body = prometheus.query(expr).ok()?;
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn metrics_pass_promtool_and_a_real_prometheus_sees_grants_move_on_three_nodes() {
    let nodes = PalisadeNode::cluster(bin(), 3, &[]).unwrap();
    let leader = eventually("one node says it leads", || {
        let leading: Vec<_> = nodes
            .iter()
            .filter(|n| sample(&metrics_of(n), "palisade_is_leader") == Some(1.0))
            .collect();
        (leading.len() == 1).then(|| leading[0].id())
    });
    for i in 0..3 {
        lock(&nodes, &format!("job-{i}"));
    }
    for node in &nodes {
        let text = metrics_of(node);
        let (ok, said) = promtool_check(&text);
        assert!(ok, "promtool check metrics, node {}: {said}", node.id());
        // Every member applies every entry: each counts the three grants.
        let grants = eventually("the grants applied", || {
            sample(&metrics_of(node), "palisade_grants_total").filter(|g| *g >= 3.0)
        });
        assert_eq!(grants, 3.0, "node {}", node.id());
        assert_eq!(
            sample(&text, "palisade_leader_id"),
            Some(leader as f64),
            "node {}",
            node.id()
        );
        assert!(sample(&text, "palisade_log_fsync_duration_seconds_count") > Some(0.0));
        assert!(sample(&text, "process_resident_memory_bytes") > Some(0.0));
    }
    let text = metrics_of(&nodes[leader as usize - 1]);
    assert!(sample(&text, "palisade_commit_duration_seconds_count") > Some(0.0));
    for peer in nodes.iter().filter(|n| n.id() != leader) {
        let lag = format!("palisade_replication_lag_entries{{peer=\"{}\"}}", peer.id());
        assert!(sample(&text, &lag).is_some(), "{lag} in\n{text}");
    }
    assert_eq!(
        sample(&text, "palisade_releases_total{how=\"release\"}"),
        Some(3.0)
    );

    let targets: Vec<String> = nodes.iter().map(PalisadeNode::http_addr).collect();
    let prometheus = PrometheusServer::start(&targets).unwrap();
    eventually("Prometheus scrapes all three nodes", || {
        (query_value(&prometheus, "count(up{job=\"palisade\"} == 1)") == Some(3.0)).then_some(())
    });
    let before = eventually("Prometheus has the grant count", || {
        query_value(&prometheus, "max(palisade_grants_total)")
    });
    for i in 0..4 {
        lock(&nodes, &format!("more-{i}"));
    }
    let after = eventually("Prometheus sees the new grants", || {
        query_value(&prometheus, "max(palisade_grants_total)").filter(|v| *v >= before + 4.0)
    });
    assert_eq!(after, before + 4.0, "{}", prometheus.log());
}

/// The DOM of `url` after its script ran, as headless Chromium dumps it.
fn chromium_dom(url: &str) -> String {
    let bin = std::env::var("PALISADE_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let out = Command::new(&bin)
        .args([
            "--headless",
            // As root (CI) Chromium refuses to start sandboxed.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            // Virtual time: the page's fetch and redraw complete before the dump,
            // however slow the machine.
            "--virtual-time-budget=5000",
            "--dump-dom",
            url,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{bin} (Debian's chromium; scripts/test installs it): {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The table row of the members table for node `id`, as dumped.
fn member_row(dom: &str, id: u64) -> Option<&str> {
    let start = dom.find(&format!("data-node=\"{id}\""))?;
    let end = dom[start..].find("</tr>")? + start;
    Some(&dom[start..end])
}

/// Kills the child on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hold(nodes: &[PalisadeNode], name: &str, wait: &str) -> Running {
    hold_with(nodes, name, &["--wait", wait])
}

fn hold_with(nodes: &[PalisadeNode], name: &str, args: &[&str]) -> Running {
    Running(
        Command::new(bin())
            .args(["lock", name, "--endpoints", &endpoints(nodes)])
            .args(args)
            .args(["--", "sleep", "600"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn the_status_page_in_chromium_shows_holders_and_waiters_and_follows_a_new_leader() {
    let mut nodes = PalisadeNode::cluster(bin(), 3, &[]).unwrap();
    let leader = eventually("a leader", || {
        nodes
            .iter()
            .find(|n| sample(&metrics_of(n), "palisade_is_leader") == Some(1.0))
            .map(PalisadeNode::id)
    });
    let holder = hold(&nodes, "orders/nightly", "0s");
    let script_name = "<script>document.title='pwned'</script>";
    let _odd = hold(&nodes, script_name, "0s");
    // The waiter queues behind the holder: seen once the lock has one waiter.
    eventually("the holder holds", || {
        let (_, body) = http_get(&nodes[0].http_addr(), "/status.json").ok()?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        (json["locks"].as_array()?.len() == 2).then_some(())
    });
    let waiter = hold(&nodes, "orders/nightly", "10m");
    let waiter_pid = waiter.0.id();
    let follower = nodes.iter().find(|n| n.id() != leader).unwrap();
    let url = format!("http://{}/", follower.http_addr());
    let dom = eventually("the page shows the lock, its holder and its waiter", || {
        let dom = chromium_dom(&url);
        (dom.contains("orders/nightly") && dom.contains(&format!("pid {waiter_pid}")))
            .then_some(dom)
    });
    assert!(
        dom.contains(&format!("pid {}", holder.0.id())),
        "the holder's label: {dom}"
    );
    let row = member_row(&dom, leader).expect("the leader's row");
    assert!(row.contains("class=\"leader\""), "{row}");
    // The odd name is text in a cell, not an element that ran.
    assert!(
        dom.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;"),
        "{dom}"
    );
    assert!(!dom.contains("<title>pwned"), "{dom}");

    nodes[leader as usize - 1].kill();
    let (new_leader, dom) = eventually("the page follows the new leader", || {
        let dom = chromium_dom(&url);
        let new = nodes
            .iter()
            .map(PalisadeNode::id)
            .filter(|id| *id != leader)
            .find(|id| member_row(&dom, *id).is_some_and(|r| r.contains("class=\"leader\"")))?;
        Some((new, dom))
    });
    assert_ne!(new_leader, leader);
    let old = member_row(&dom, leader).expect("the old leader is still a member");
    assert!(old.contains("unreachable"), "{old}");
    assert!(dom.contains("orders/nightly"), "{dom}");
}

#[test]
fn with_log_format_json_a_lease_expiry_is_one_json_line_with_lock_token_and_session() {
    let mut node = PalisadeNode::prepare(bin(), 1).unwrap();
    node.set_args(&["--log-format", "json"]);
    node.set_log_filter("warn,palisade_server=info");
    node.start().unwrap();
    let nodes = [node];
    let mut holder = hold_with(&nodes, "reports/daily", &["--ttl", "1s"]);
    let token = eventually("the lock is held", || {
        let (_, body) = http_get(&nodes[0].http_addr(), "/status.json").ok()?;
        let json: serde_json::Value = serde_json::from_str(&body).ok()?;
        json["locks"][0]["token"].as_u64()
    });
    // A holder that dies silently: its lease runs out on the leader.
    let _ = holder.0.kill();
    let _ = holder.0.wait();
    let line = eventually("the expiry is logged", || {
        nodes[0]
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["fields"]["message"] == "lease expired: lock released")
    });
    let fields = &line["fields"];
    assert_eq!(fields["lock"], "reports/daily", "{line}");
    assert_eq!(fields["token"], token, "{line}");
    assert!(fields["session"].as_u64().is_some(), "{line}");
    assert_eq!(line["level"], "INFO", "{line}");
    // Every line the node wrote is JSON, its start-up line aside.
    for l in nodes[0]
        .log()
        .lines()
        .filter(|l| !l.starts_with("palisade: node"))
    {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok(),
            "not JSON: {l}"
        );
    }
}

/// Sends SIGCONT to a paused process when dropped, whatever the test did.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

#[test]
fn palisade_lock_reports_the_slack_it_left_and_the_overrun_of_a_lease_squeezed_by_a_paused_server()
{
    let node = PalisadeNode::single(bin()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let metrics = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let run = |name: &str, ttl: &str, file: &str, command: &str| {
        Command::new(bin())
            .args(["lock", name, "--endpoints", &node.addr(), "--ttl", ttl])
            .args(["--grace", "0s", "--metrics-file"])
            .arg(dir.path().join(file))
            .args(["--", "sh", "-c", command])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    // Work well inside its lease: the guarantee it did not need is the slack.
    let calm = run("calm", "60s", "calm.prom", "true");
    assert!(calm.status.success(), "{calm:?}");
    let text = metrics("calm.prom");
    assert_eq!(
        sample(&text, "palisade_lock_release_slack_seconds_count"),
        Some(1.0)
    );
    assert!(
        sample(&text, "palisade_lock_release_slack_seconds_sum") > Some(0.0),
        "{text}"
    );
    assert_eq!(sample(&text, "palisade_lock_leases_lost_total"), Some(0.0));
    assert_eq!(
        sample(&text, "palisade_lock_overrun_seconds_count"),
        Some(0.0)
    );

    // The command pauses the server: no keep-alive is answered, the 1 s lease
    // runs out while the command still runs, and it is stopped past its guarantee.
    let pid = node.pid().unwrap();
    let _resume = Resume(pid);
    // The shell leaves a child of its own: stopping the command must stop it too.
    let grandchild = dir.path().join("grandchild.pid");
    let squeezed = run(
        "squeezed",
        "1s",
        "squeezed.prom",
        &format!(
            "kill -STOP {pid}; sleep 600 >/dev/null 2>&1 & echo $! > {}; wait",
            grandchild.display()
        ),
    );
    let said = String::from_utf8_lossy(&squeezed.stderr);
    assert!(!squeezed.status.success(), "{said}");
    assert!(said.contains("after its guarantee ran out"), "{said}");
    let text = metrics("squeezed.prom");
    assert_eq!(
        sample(&text, "palisade_lock_leases_lost_total"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "palisade_lock_overrun_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "palisade_lock_overrun_seconds_sum") > Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "palisade_lock_release_slack_seconds_count"),
        Some(0.0)
    );
    let orphan = std::fs::read_to_string(&grandchild).unwrap();
    let stat = format!("/proc/{}/stat", orphan.trim());
    eventually("the command's own child is stopped too", || {
        // Gone, or a zombie waiting to be reaped: not running either way.
        std::fs::read_to_string(&stat)
            .map_or(true, |s| s.contains(") Z "))
            .then_some(())
    });
}

#[test]
fn palisade_redis_lock_reports_the_validity_it_was_granted_with_and_the_slack_it_left() {
    let redis = palisade_testkit::RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis.prom");
    let out = Command::new(bin())
        .args([
            "redis",
            "lock",
            "job",
            "--nodes",
            &redis.url(),
            "--ttl",
            "60s",
        ])
        .arg("--metrics-file")
        .arg(&file)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        sample(&text, "palisade_redis_validity_at_grant_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert!(sample(&text, "palisade_redis_validity_at_grant_seconds_sum") > Some(0.0));
    assert_eq!(
        sample(&text, "palisade_lock_release_slack_seconds_count"),
        Some(1.0)
    );
    assert_eq!(sample(&text, "palisade_lock_leases_lost_total"), Some(0.0));
}
