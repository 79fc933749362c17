//! The `palisade` binary as a user runs it: `lock` runs a command with the token,
//! stops it when the lock is lost, and exits with documented statuses.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use palisade_faultproxy::{FaultProxy, Link};
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
        // `locks --json` is one array, `[]` when nothing is held.
        let all: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("locks --json prints one JSON array");
        if all
            .iter()
            .any(|l| l["name"] == name && !l["holder"].is_null())
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
fn with_no_server_each_command_names_the_address_and_says_connection_refused() {
    let addr = format!("127.0.0.1:{}", palisade_testkit::free_port().unwrap());
    let run = |args: &[&str]| {
        let out = Command::new(bin())
            .env("PALISADE_ENDPOINTS", &addr)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            err.contains(&addr) && err.contains("connection refused"),
            "{args:?}: {err}"
        );
        assert!(err.contains("palisade serve"), "a hint: {err}");
        out.status.code()
    };
    assert_eq!(run(&["lock", "x", "--", "true"]), Some(75), "not obtained");
    // 3, not 1: "could not ask" is not "stale".
    assert_eq!(run(&["check-token", "x", "5"]), Some(3));
    assert_eq!(run(&["status"]), Some(1));
    assert_eq!(run(&["locks"]), Some(1));
}

#[test]
fn serve_refuses_a_used_data_dir_or_port_before_it_says_serving_or_touches_disk() {
    let node = PalisadeNode::single(bin()).unwrap();
    let ports = palisade_testkit::free_ports(2).unwrap();
    let serve = |data_dir: &Path, listen: &str, listen_peer: &str| {
        let out = Command::new(bin())
            .env("PALISADE_LOG", "warn")
            .args(["serve", "--listen", listen, "--listen-peer", listen_peer])
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = serve(
        &node.data_dir(),
        &format!("127.0.0.1:{}", ports[0]),
        &format!("127.0.0.1:{}", ports[1]),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another palisade serve is using"), "{err}");
    assert!(!err.contains("serving"), "{err}");
    // The first node is untouched and still serves.
    assert!(token_of(&node) > 0);

    let fresh = tempfile::tempdir().unwrap();
    let unused = fresh.path().join("data");
    let (code, err) = serve(&unused, &node.addr(), &format!("127.0.0.1:{}", ports[1]));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on {}", node.addr())),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
    assert!(
        !unused.exists(),
        "a node that cannot listen creates nothing"
    );

    // Nor one whose metrics listener cannot bind: not a silent absence.
    let out = Command::new(bin())
        .env("PALISADE_LOG", "warn")
        .args(["serve", "--listen", &format!("127.0.0.1:{}", ports[0])])
        .args(["--listen-peer", &format!("127.0.0.1:{}", ports[1])])
        .args(["--metrics-listen", &node.http_addr(), "--data-dir"])
        .arg(&unused)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on {}", node.http_addr())),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
    assert!(!unused.exists(), "nothing created");
}

/// A first port with the `n - 1` after it free too.
fn free_ports_in_a_row(n: u16) -> u16 {
    loop {
        let first = palisade_testkit::free_port().unwrap();
        if first < 65000
            && (first..first + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            return first;
        }
    }
}

#[test]
fn dev_cluster_serves_a_lock_with_only_its_printed_export_line_and_stops_on_ctrl_c() {
    use std::io::BufRead;
    // Six ports for three nodes' client and peer listeners, three for their
    // metrics and status pages.
    let port = free_ports_in_a_row(9);
    let metrics = port + 6;
    let mut dev = Command::new(bin())
        .args(["dev-cluster", "--port", &port.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .env_remove("PALISADE_ENDPOINTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(dev.stdout.take().unwrap()).lines();
    let export = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.trim_start().starts_with("export "))
        .expect("an export line");
    let (var, value) = export
        .trim_start()
        .trim_start_matches("export ")
        .split_once('=')
        .unwrap();
    assert_eq!(var, "PALISADE_ENDPOINTS");
    assert_eq!(value.split(',').count(), 3, "{export}");
    // The nodes may still be electing their first leader: --retry-for covers it.
    let out = Command::new(bin())
        .env(var, value)
        .args(["lock", "demo", "--retry-for", "60s", "--"])
        .args(["sh", "-c", "echo $PALISADE_FENCING_TOKEN"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(token > 0);
    // Node 3's status page names all three members.
    let (status, body) =
        palisade_testkit::http_get(&format!("127.0.0.1:{}", metrics + 2), "/status.json").unwrap();
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["node"], 3, "{body}");
    assert_eq!(json["members"].as_array().unwrap().len(), 3, "{body}");
    let pid = nix::unistd::Pid::from_raw(dev.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = dev.wait().unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C is a clean stop");
    // Every node stopped with it: the ports are free again.
    for p in port..port + 9 {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", p)).is_ok(),
            "port {p} still in use"
        );
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
    // The port accepts before the first election is over: ask until a leader
    // is named (`leader` is null until then).
    let start = Instant::now();
    let v = loop {
        let out = palisade(&node).args(["status", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if !v["leader"].is_null() || start.elapsed() > Duration::from_secs(60) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["leader"], 1);
    assert_eq!(v["members"][0]["peer_addr"], node.peer_addr());
    assert!(v["term"].as_u64().unwrap() >= 1);
    assert!(v["commit_index"].as_u64().is_some());
    assert_eq!(v["members"][0]["id"], 1);
    assert_eq!(v["members"][0]["addr"], node.addr());
}

/// A minimal HTTP/1.1 exchange, so this test needs no client library.
fn http(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, out)
}

fn put(addr: &str, key: &str, token: u64, body: &str) -> (u16, String) {
    http(
        addr,
        &format!(
            "PUT /v1/objects/{key} HTTP/1.1\r\nHost: x\r\nFencing-Token: {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn fence_store_rejects_token_33_after_34() {
    let store = palisade_testkit::FenceStoreProcess::start(bin()).unwrap();
    let addr = store.addr();
    assert_eq!(put(&addr, "file", 34, "from 34").0, 200);
    let (status, body) = put(&addr, "file", 33, "from 33");
    assert_eq!(status, 409);
    assert!(
        body.contains("\"presented\":33") && body.contains("\"highest\":34"),
        "{body}"
    );
    let (status, body) = http(
        &addr,
        "GET /v1/objects/file HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(
        body.to_ascii_lowercase().contains("fencing-token: 34"),
        "{body}"
    );
    assert!(body.ends_with("from 34"), "{body}");
    // The refusal is counted by its reason, the write by its method.
    let (status, metrics) = palisade_testkit::http_get(&addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    for line in [
        "palisade_fence_writes_rejected_total{reason=\"stale_token\"} 1",
        "palisade_fence_writes_accepted_total{method=\"PUT\"} 1",
        "palisade_fence_stale_writes_accepted_total 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
}

#[test]
fn the_essay_example_rejects_the_stale_write_and_its_unfenced_twin_loses_an_update() {
    let on = Command::new(bin())
        .args(["demo", "essay"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&on.stdout);
    assert!(on.status.success(), "{text}");
    assert!(text.contains("REJECTED the stale write: 409"), "{text}");
    assert!(text.contains("holds \"written by client 2"), "{text}");

    let off = Command::new(bin())
        .args(["demo", "essay", "--fencing", "off"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&off.stdout);
    assert!(off.status.success(), "{text}");
    assert!(text.contains("LOST UPDATE"), "{text}");
    assert!(text.contains("holds \"written by client 1"), "{text}");
}

#[test]
fn lock_takes_its_backend_by_url() {
    let node = PalisadeNode::single(bin()).unwrap();
    let url = format!("palisade://{}", node.addr());
    let first = token_via(&url, "by-url", &[]);
    assert!(token_via(&url, "by-url", &[]) > first);
    // PALISADE_BACKEND does the same as --backend.
    let out = Command::new(bin())
        .args([
            "lock",
            "by-url",
            "--",
            "sh",
            "-c",
            "echo $PALISADE_FENCING_TOKEN",
        ])
        .env("PALISADE_BACKEND", &url)
        .env_remove("PALISADE_ENDPOINTS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An unknown scheme or a URL without one is bad input (2), naming what is known.
    for bad in ["zz://127.0.0.1:1", "127.0.0.1:7420", "palisade://"] {
        let out = Command::new(bin())
            .args(["lock", "x", "--backend", bad, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("palisade://"), "{bad}: {stderr}");
    }
}

/// The token `palisade lock NAME --backend URL [EXTRA] -- sh -c 'echo $PALISADE_FENCING_TOKEN'`
/// printed (the command must succeed).
fn token_via(url: &str, name: &str, extra: &[&str]) -> u64 {
    let out = Command::new(bin())
        .args(["lock", name, "--backend", url, "--wait", "30s"])
        .args(extra)
        .args(["--", "sh", "-c", "echo $PALISADE_FENCING_TOKEN"])
        .env_remove("PALISADE_ENDPOINTS")
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
        .parse::<u64>()
        .unwrap()
}

#[test]
fn lock_on_postgres_passes_increasing_tokens_also_across_a_kill9() {
    let mut pg = palisade_testkit::PostgresServer::start().unwrap();
    let url = pg.url();
    let token = || token_via(&url, "demo", &[]);
    let (first, second) = (token(), token());
    assert!(second > first);
    pg.kill9();
    pg.restart().unwrap();
    let third = token();
    assert!(third > second, "{first} {second} {third}");
    eprintln!("postgres tokens: {first} {second}, after the postmaster's kill -9 {third}");
    // Credentials meant for palisade:// are refused for postgres:// (exit 2).
    // (Any readable file will do as the CA: it is refused before it is used.)
    let ca = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(bin())
        .args(["lock", "demo", "--backend", &url, "--ca"])
        .arg(ca.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("are for palisade://"), "{stderr}");
}

/// Tokens from `token` rise across a `kill -9` of all `servers` servers of
/// `cluster` (restarted), and again across a `kill -9` of its leader alone.
fn tokens_rise_across_kills<C>(
    cluster: &mut C,
    servers: usize,
    token: impl Fn() -> u64,
    kill: fn(&mut C, usize),
    start: fn(&mut C, usize) -> std::io::Result<()>,
    leader: fn(&C) -> Option<usize>,
) -> [u64; 4] {
    let (first, second) = (token(), token());
    assert!(second > first);
    for i in 0..servers {
        kill(cluster, i);
    }
    for i in 0..servers {
        start(cluster, i).unwrap();
    }
    let third = token();
    assert!(third > second, "{first} {second} {third}");
    // And the leader alone, killed with kill -9 and restarted.
    let l = some_within_60s("a leader", || leader(cluster));
    kill(cluster, l);
    start(cluster, l).unwrap();
    let fourth = token();
    assert!(
        fourth > third,
        "{third} {fourth} after the leader's kill -9"
    );
    [first, second, third, fourth]
}

#[test]
fn lock_on_etcd_passes_increasing_tokens_also_across_a_kill9() {
    use palisade_testkit::EtcdCluster;
    let mut etcd = EtcdCluster::start(3).unwrap();
    let url = format!("etcd://{}", etcd.endpoints().join(","));
    let [a, b, c, d] = tokens_rise_across_kills(
        &mut etcd,
        3,
        || token_via(&url, "demo", &[]),
        EtcdCluster::kill,
        EtcdCluster::start_member,
        EtcdCluster::leader,
    );
    eprintln!("etcd tokens: {a} {b}, after every member's kill -9 {c}, after the leader's {d}");
}

#[test]
fn lock_on_zookeeper_passes_increasing_tokens_also_across_a_kill9() {
    use palisade_testkit::ZooKeeperEnsemble;
    let mut zk = ZooKeeperEnsemble::start(3).unwrap();
    let url = format!("zk://{}", zk.connect_string());
    let [a, b, c, d] = tokens_rise_across_kills(
        &mut zk,
        3,
        || token_via(&url, "jobs/demo", &["--ttl", "4s"]),
        ZooKeeperEnsemble::kill,
        ZooKeeperEnsemble::start_server,
        ZooKeeperEnsemble::leader,
    );
    eprintln!(
        "zookeeper tokens: {a} {b}, after every server's kill -9 {c}, after the leader's {d}"
    );
}

/// Polls `probe` until it gives a value (a bound on a wait, not a timing claim).
fn some_within_60s<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `palisade lock demo --backend <via proxy>` holding a command, cuts the
/// proxy, and has a second client (direct) take the lock: by the time it is
/// granted, the first command must be gone, and the first `lock` exits 76.
fn cut_off_holder_is_stopped_before_the_next_grant(via_proxy: &str, direct: &str, proxy: &Link) {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("holder.pid");
    let mut holder = Command::new(bin())
        .args(["lock", "demo", "--backend", via_proxy, "--wait", "30s"])
        .args(["--ttl", "2s", "--grace", "1s", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 600", pid_file.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && text.ends_with('\n')
        {
            break text.trim().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{via_proxy}: the holder's command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    proxy.partition();
    // The second client's command looks at the first one: still running (and
    // not a zombie) means two commands inside the lock at once.
    let out = Command::new(bin())
        .args(["lock", "demo", "--backend", direct, "--wait", "60s", "--"])
        .args(["sh", "-c"])
        .arg(format!(
            "s=$(cut -d' ' -f3 /proc/{pid}/stat 2>/dev/null); \
             if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo alive; else echo gone; fi"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{direct}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "gone",
        "{via_proxy}: the cut-off holder's command still ran when the next holder was granted"
    );
    let status = holder.wait().unwrap();
    let stderr = {
        use std::io::Read;
        let mut s = String::new();
        let _ = holder.stderr.take().unwrap().read_to_string(&mut s);
        s
    };
    assert_eq!(
        status.code(),
        Some(76),
        "{via_proxy}: lost lock must exit 76: {stderr}"
    );
}

#[test]
fn a_cut_off_holder_is_stopped_before_the_next_grant_on_every_backend() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let proxied = |addr: &str| {
        rt.block_on(FaultProxy::start(addr.parse().unwrap()))
            .unwrap()
    };

    let node = PalisadeNode::single(bin()).unwrap();
    let p = proxied(&node.addr());
    cut_off_holder_is_stopped_before_the_next_grant(
        &format!("palisade://{}", p.addr()),
        &format!("palisade://{}", node.addr()),
        p.link(),
    );
    drop(node);

    let zk = palisade_testkit::ZooKeeperEnsemble::start(1).unwrap();
    let p = proxied(&zk.endpoints()[0]);
    cut_off_holder_is_stopped_before_the_next_grant(
        &format!("zk://{}", p.addr()),
        &format!("zk://{}", zk.connect_string()),
        p.link(),
    );
    drop(zk);

    let etcd = palisade_testkit::EtcdCluster::start(1).unwrap();
    let p = proxied(&etcd.endpoints()[0]);
    cut_off_holder_is_stopped_before_the_next_grant(
        &format!("etcd://{}", p.addr()),
        &format!("etcd://{}", etcd.endpoints()[0]),
        p.link(),
    );
    drop(etcd);

    let pg = palisade_testkit::PostgresServer::start().unwrap();
    let p = proxied(&format!("127.0.0.1:{}", pg.port()));
    cut_off_holder_is_stopped_before_the_next_grant(
        &pg.url().replace(
            &format!(":{}/", pg.port()),
            &format!(":{}/", p.addr().port()),
        ),
        &pg.url(),
        p.link(),
    );
}

#[test]
fn serve_takes_its_flags_from_a_config_file_and_a_flag_wins_over_it() {
    let ports = palisade_testkit::free_ports(4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{}\"\nlisten-peer = \"127.0.0.1:{}\"\ndata-dir = \"{}\"\nsnapshot-every = 500\n",
            ports[0],
            ports[1],
            data.display()
        ),
    )
    .unwrap();
    let flag_listen = format!("127.0.0.1:{}", ports[2]);
    let mut node = Command::new(bin())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .args(["--listen", &flag_listen])
        .args(["--listen-peer", &format!("127.0.0.1:{}", ports[3])])
        .env("PALISADE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The flag's address serves; the file's data directory holds the data.
    let out = Command::new(bin())
        .args(["lock", "from-config", "--endpoints", &flag_listen])
        .args(["--retry-for", "60s", "--", "true"])
        .output()
        .unwrap();
    let _ = node.kill();
    let _ = node.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(data.join("serve.lock").exists(), "data-dir from the file");
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", ports[0])).is_ok(),
        "the file's listen address was overridden by the flag"
    );

    std::fs::write(&config, "data-dri = \"/tmp/x\"\n").unwrap();
    let out = Command::new(bin())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("unknown key \"data-dri\"").count(), 1, "{err}");
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line_definition() {
    let run = |args: &[&str]| {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completions", shell]);
        for sub in ["dev-cluster", "check-token", "serve"] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let man = run(&["man"]);
    assert!(
        man.contains(".TH palisade 1"),
        "{}",
        &man[..200.min(man.len())]
    );
    assert!(man.contains("fencing"), "the man page has the description");
    let version = run(&["--version"]);
    assert!(version.contains("(commit "), "{version}");
}

#[test]
fn serve_calls_an_impossible_configuration_bad_input_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = palisade_testkit::free_port().unwrap();
    for bad in [
        vec!["--id", "0"],
        vec!["--initial-cluster", "garbage"],
        vec!["--initial-cluster", "2=127.0.0.1:9"],
    ] {
        let out = Command::new(bin())
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data)
            .args(&bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert_eq!(err.lines().count(), 1, "said once: {err}");
        assert!(!data.exists(), "{bad:?} created the data directory");
    }
}

/// The operators' listener names locks and holders: served unauthenticated
/// (plaintext, or `--metrics-open` on a TLS node) it must be on loopback, and
/// a node asked otherwise refuses to start (exit 2) and says why.
#[test]
fn an_unauthenticated_metrics_listener_off_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let out = Command::new(bin())
        .args(["certs", "init", certs.to_str().unwrap(), "--nodes", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let f = |n: &str| certs.join(n).to_str().unwrap().to_owned();
    let tls = [
        "--tls-cert".to_owned(),
        f("node-1.pem"),
        "--tls-key".into(),
        f("node-1-key.pem"),
        "--tls-ca".into(),
        f("ca.pem"),
    ];
    let port = free_ports_in_a_row(3);
    let data = dir.path().join("data");
    for (extra, says) in [
        (vec![], "refusing to serve plaintext on 0.0.0.0"),
        (tls.to_vec(), "refusing --metrics-open on 0.0.0.0"),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--listen-peer", &format!("127.0.0.1:{}", port + 1)])
            .args(["--metrics-listen", &format!("0.0.0.0:{}", port + 2)])
            .args(&extra)
            .arg("--data-dir")
            .arg(&data)
            .stdin(Stdio::null());
        if !extra.is_empty() {
            cmd.arg("--metrics-open");
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!data.exists(), "a refused node creates nothing");
    }
}
