//! The recipes beyond the mutex on real `palisade serve` processes, through the
//! Rust client: a semaphore, a read/write lock, an election. What is asserted
//! is counted from the holders' own records, not from the server's word.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use palisade_client::{AcquireOptions, Claim, Client, ClientConfig, ClientError, FencedGuard};
use palisade_testkit::PalisadeNode;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

async fn client(node: &PalisadeNode) -> Client {
    let mut c = ClientConfig::new([node.addr()]);
    c.retry_for = Duration::from_secs(30);
    Client::connect(c).await.expect("connect")
}

fn claiming(claim: Claim, wait_secs: u64) -> AcquireOptions {
    AcquireOptions {
        wait: Duration::from_secs(wait_secs),
        claim,
        ..AcquireOptions::default()
    }
}

/// Ten contenders for three permits, each in a session of its own: never more
/// than three hold at once, by the contenders' own count; all ten are served;
/// each slot's tokens rise from one holder to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_three_serves_ten_contenders_never_more_than_three_at_once() {
    let node = PalisadeNode::single(bin()).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let c = client(&node).await;
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let permit = c
                .acquire("pool", &claiming(Claim::Permit { permits: 3 }, 120))
                .await
                .expect("a permit within two minutes");
            // Counted after the grant and uncounted before the release, so the
            // count is never above the number really holding.
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let grant = (permit.slot(), permit.token());
            permit.release().await.expect("released");
            grant
        }));
    }
    let mut grants = Vec::new();
    for t in tasks {
        grants.push(t.await.unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&most),
        "{most} held a permit of three at once"
    );
    assert_eq!(grants.len(), 10, "every contender was served");
    assert!(grants.iter().all(|(slot, _)| *slot < 3), "{grants:?}");
    // Grants in one entry may share a token, but only in different slots.
    let mut by_slot = grants.clone();
    by_slot.sort();
    by_slot.dedup();
    assert_eq!(by_slot.len(), 10, "a slot was granted twice with one token");

    // The name is a semaphore of three: a plain lock or another size on it
    // is refused by name, not silently turned into something else.
    let c = client(&node).await;
    let held = c
        .acquire("pool", &claiming(Claim::Permit { permits: 3 }, 0))
        .await
        .unwrap();
    let view = c.get("pool").await.unwrap().expect("held");
    assert_eq!((view.shape.as_str(), view.permits), ("semaphore", 3));
    assert_eq!(view.holders.len(), 1);
    let other = client(&node).await;
    for wrong in [Claim::Lock, Claim::Permit { permits: 5 }, Claim::Read] {
        let refused = other.acquire("pool", &claiming(wrong, 0)).await;
        assert!(
            matches!(refused, Err(ClientError::WrongShape(_))),
            "{refused:?}"
        );
    }
    held.release().await.unwrap();
}

/// Readers share, a writer waits for them and then holds alone, with a token
/// above every reader's; a reader arriving behind the waiting writer waits
/// too (FIFO), and is let in when the writer is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_is_alone_with_a_token_above_theirs() {
    let node = PalisadeNode::single(bin()).unwrap();
    let (r1, r2, w, r3) = (
        client(&node).await,
        client(&node).await,
        client(&node).await,
        client(&node).await,
    );
    let read1 = r1.acquire("doc", &claiming(Claim::Read, 0)).await.unwrap();
    let read2 = r2.acquire("doc", &claiming(Claim::Read, 0)).await.unwrap();
    let view = r1.get("doc").await.unwrap().unwrap();
    assert_eq!(view.holders.len(), 2);
    assert!(view.holders.iter().all(|h| h.shared));
    let reader_tokens = [read1.token(), read2.token()];
    // The status page lists both readers, with their tokens.
    let (code, body) = palisade_testkit::http_get(&node.http_addr(), "/status.json").unwrap();
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let doc = status["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "doc")
        .unwrap_or_else(|| panic!("doc not on the page: {body}"));
    assert_eq!(doc["shape"], "read_write", "{doc}");
    let shown: Vec<(u64, bool)> = doc["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["token"].as_u64().unwrap(), h["shared"].as_bool().unwrap()))
        .collect();
    let expected: Vec<(u64, bool)> = reader_tokens.iter().map(|t| (t.get(), true)).collect();
    assert_eq!(shown, expected, "{doc}");
    // And the metrics count them by shape.
    let (_, metrics) = palisade_testkit::http_get(&node.http_addr(), "/metrics").unwrap();
    assert!(
        metrics.contains("palisade_holders{shape=\"read_write\"} 2"),
        "{metrics}"
    );

    let writer = tokio::spawn(async move {
        let g = w.acquire("doc", &claiming(Claim::Write, 120)).await;
        (w, g)
    });
    let watcher = client(&node).await;
    wait_for(&watcher, "doc", |v| v.waiters.len() == 1).await;
    // Behind a waiting writer a reader does not get in, though it would fit.
    let late = r3.acquire("doc", &claiming(Claim::Read, 0)).await;
    assert!(matches!(late, Err(ClientError::WouldBlock)), "{late:?}");

    read1.release().await.unwrap();
    read2.release().await.unwrap();
    let (_w, written) = writer.await.unwrap();
    let written: FencedGuard = written.expect("the writer got in");
    assert!(reader_tokens.iter().all(|t| written.token() > *t));
    let view = watcher.get("doc").await.unwrap().unwrap();
    assert_eq!(view.holders.len(), 1);
    assert!(!view.holders[0].shared);

    let reader = tokio::spawn(async move {
        let g = r3.acquire("doc", &claiming(Claim::Read, 120)).await;
        (r3, g)
    });
    wait_for(&watcher, "doc", |v| v.waiters.len() == 1).await;
    let writer_token = written.token();
    written.release().await.unwrap();
    let (_r3, read3) = reader.await.unwrap();
    assert!(read3.expect("the reader got in").token() > writer_token);
}

/// Two candidates: the first leads with its value, the second waits; the
/// leader changes its value; when the leader's session ends the other leads,
/// with its own value and a larger token, and the old leader can proclaim
/// nothing any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_hands_leadership_on_with_a_rising_token() {
    let node = PalisadeNode::single(bin()).unwrap();
    let (a, b) = (client(&node).await, client(&node).await);
    let lead = |v: &str| claiming(Claim::Lead { value: v.into() }, 120);
    let leader = a.acquire("primary", &lead("10.0.0.1:5432")).await.unwrap();
    let candidate = tokio::spawn(async move {
        let g = b.acquire("primary", &lead("10.0.0.2:5432")).await;
        (b, g)
    });
    let watcher = client(&node).await;
    wait_for(&watcher, "primary", |v| v.waiters.len() == 1).await;
    leader.proclaim("10.0.0.1:6432").await.unwrap();
    let view = watcher.get("primary").await.unwrap().unwrap();
    assert_eq!(view.shape, "election");
    assert_eq!(view.holders[0].value, "10.0.0.1:6432");

    a.close().await.unwrap();
    let (_b, new_leader) = candidate.await.unwrap();
    let new_leader = new_leader.expect("the candidate leads");
    assert!(new_leader.token() > leader.token());
    let view = watcher.get("primary").await.unwrap().unwrap();
    assert_eq!(view.holders[0].value, "10.0.0.2:5432");
    let stale = leader.proclaim("10.0.0.1:7432").await;
    assert!(stale.is_err(), "the old leader proclaimed: {stale:?}");
    new_leader.proclaim("10.0.0.2:6432").await.unwrap();
    let view = watcher.get("primary").await.unwrap().unwrap();
    assert_eq!(view.holders[0].value, "10.0.0.2:6432");
}

/// The `Observe` stream: the state now first, then every change in apply
/// order — a new leader, a proclaimed value, a successor granted by the
/// entry that ended its predecessor — each pushed without polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_pushes_each_leader_and_value_in_order() {
    let node = PalisadeNode::single(bin()).unwrap();
    let mut cfg = ClientConfig::new([node.addr()]);
    cfg.retry_for = Duration::from_secs(30);
    let admin = palisade_client::Admin::new(&cfg).unwrap();
    let mut changes = admin.observe("primary").await.unwrap();
    // (leader token, value) of each message; `None` when nobody leads.
    let mut seen: Vec<Option<(u64, String)>> = Vec::new();
    let mut until = async |want: Option<(u64, String)>| {
        while seen.last() != Some(&want) {
            let view = tokio::time::timeout(Duration::from_secs(60), changes.next())
                .await
                .expect("a change within a minute")
                .expect("the stream goes on")
                .expect("a lock state");
            let now = view
                .and_then(|v| v.holder)
                .map(|h| (h.token.get(), h.value));
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
    };
    until(None).await;
    let (a, b) = (client(&node).await, client(&node).await);
    let lead = |v: &str| claiming(Claim::Lead { value: v.into() }, 60);
    let first = a.acquire("primary", &lead("a")).await.unwrap();
    let t1 = first.token().get();
    until(Some((t1, "a".into()))).await;
    first.proclaim("a2").await.unwrap();
    until(Some((t1, "a2".into()))).await;
    let waiting = tokio::spawn(async move {
        let g = b.acquire("primary", &lead("b")).await;
        (b, g)
    });
    wait_for(&a, "primary", |v| v.waiters.len() == 1).await;
    first.release().await.unwrap();
    let (_b, second) = waiting.await.unwrap();
    let second = second.unwrap();
    let t2 = second.token().get();
    assert!(t2 > t1);
    until(Some((t2, "b".into()))).await;
    second.release().await.unwrap();
    until(None).await;
    let expected = vec![
        None,
        Some((t1, "a".into())),
        Some((t1, "a2".into())),
        Some((t2, "b".into())),
        None,
    ];
    assert_eq!(seen, expected);
}

async fn wait_for(
    c: &Client,
    name: &str,
    mut check: impl FnMut(&palisade_client::LockView) -> bool,
) {
    for _ in 0..1200 {
        if let Ok(Some(v)) = c.get(name).await
            && check(&v)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never reached the state waited for");
}

/// A request to `palisade fence-store` at `store` for object `key`, with
/// `headers`; the answer's status.
fn store_request(
    store: &str,
    method: &str,
    key: &str,
    headers: &[(&str, String)],
    body: &str,
) -> u16 {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(store).unwrap();
    let mut request = format!("{method} /v1/objects/{key} HTTP/1.1\r\nHost: x\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += &format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u16>()
        .unwrap()
}

/// The token a `palisade lock`/`elect` command wrote into `file` once its
/// holder was granted (waited for, up to a minute).
fn token_in(file: &Path) -> u64 {
    for _ in 0..1200 {
        if let Some(t) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return t;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never written: never granted", file.display());
}

/// Sends `sig` (`-STOP`, `-KILL`…) to `child`'s process group.
fn signal_group(child: &std::process::Child, sig: &str) {
    let group = format!("-{}", child.id());
    let ok = std::process::Command::new("kill")
        .args([sig, "--", &group])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {group}");
}

/// A `palisade` command's line that makes its holder's command write its
/// token into `file` and then work until stopped, in a process group of its
/// own so that a pause or a kill takes the holder and its command together.
fn holding(bin_args: &[&str], endpoints: &str, file: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let script = format!(
        "echo $PALISADE_FENCING_TOKEN > {}; exec sleep 600",
        file.display()
    );
    Command::new(bin())
        .env("PALISADE_ENDPOINTS", endpoints)
        .env("PALISADE_RETRY_FOR", "30s")
        .args(bin_args)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap()
}

/// Readers share; a reader paused past its TTL (SIGSTOP of `palisade lock
/// --read`) loses its read lock; the writer, granted next with a token above
/// the reader's, writes; the woken reader's shared read under its old token
/// is refused by `palisade fence-store`, while a reader granted after the
/// writer reads. With the same story on a store with fencing off, the
/// overtaken reader's read is answered: what fencing prevents.
#[test]
fn a_reader_paused_past_its_ttl_is_refused_by_the_store_after_the_writer_wrote() {
    let node = PalisadeNode::single(bin()).unwrap();
    let endpoints = node.addr();
    let store = palisade_testkit::FenceStoreProcess::start(bin()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = |who: &str| dir.path().join(format!("{who}.token"));
    let write = |token: u64, body: &str| {
        store_request(
            &store.addr(),
            "PUT",
            "doc",
            &[("Fencing-Token", token.to_string())],
            body,
        )
    };
    let read = |token: u64| {
        let headers = [
            ("Fencing-Token", token.to_string()),
            ("Fencing-Read", "shared".to_owned()),
        ];
        store_request(&store.addr(), "GET", "doc", &headers, "")
    };
    let lock = |mode: &str, who: &str| {
        holding(
            &["lock", "doc", mode, "--ttl", "2s", "--wait", "60s"],
            &endpoints,
            &file(who),
        )
    };

    let mut first = lock("--write", "w0");
    let w0 = token_in(&file("w0"));
    assert_eq!(write(w0, "v1"), 200);
    signal_group(&first, "-TERM");
    let _ = first.wait();

    let mut r1 = lock("--read", "r1");
    let mut r2 = lock("--read", "r2");
    let (t1, t2) = (token_in(&file("r1")), token_in(&file("r2")));
    assert!(t1 > w0 && t2 > w0, "readers {t1}, {t2} after writer {w0}");
    // Both read, whichever token is higher: readers do not refuse each other.
    assert_eq!(read(t1.max(t2)), 200);
    assert_eq!(read(t1.min(t2)), 200);
    signal_group(&r2, "-TERM");
    let _ = r2.wait();

    // r1 pauses past its TTL; the writer waits for it and is then granted.
    signal_group(&r1, "-STOP");
    let mut writer = lock("--write", "w1");
    let w1 = token_in(&file("w1"));
    assert!(w1 > t1, "writer {w1} after reader {t1}");
    assert_eq!(write(w1, "v2"), 200);
    // The reader wakes up and reads with the token it had.
    signal_group(&r1, "-CONT");
    assert_eq!(read(t1), 409, "the store answered an overtaken reader");
    // A writer from before the readers is refused too.
    assert_eq!(write(w0, "late"), 409);
    signal_group(&writer, "-TERM");
    let _ = writer.wait();
    let lost = r1.wait().unwrap();
    assert!(
        !lost.success(),
        "a reader that lost its lease exited {lost}"
    );

    let mut r3 = lock("--read", "r3");
    let t3 = token_in(&file("r3"));
    assert!(t3 > w1);
    assert_eq!(read(t3), 200);
    signal_group(&r3, "-TERM");
    let _ = r3.wait();

    // Fencing off: the same late read is answered.
    let unfenced = palisade_testkit::FenceStoreProcess::start_unfenced(bin()).unwrap();
    let put = [("Fencing-Token", w1.to_string())];
    assert_eq!(
        store_request(&unfenced.addr(), "PUT", "doc", &put, "v2"),
        200
    );
    let late = [
        ("Fencing-Token", t1.to_string()),
        ("Fencing-Read", "shared".to_owned()),
    ];
    assert_eq!(
        store_request(&unfenced.addr(), "GET", "doc", &late, ""),
        200
    );
}

/// `palisade elect` on a 3-node cluster with candidates in processes of their
/// own: pausing the leader's process (SIGSTOP, past its TTL) elects the next,
/// and so does killing it; each new leader's token is above the last; a write
/// with a superseded leader's token is refused by `palisade fence-store`;
/// `palisade elect --observe` printed the leaders in order.
#[test]
fn elect_hands_leadership_on_when_the_leader_pauses_or_dies_and_the_store_refuses_the_old_token() {
    use std::process::{Command, Stdio};

    let nodes = PalisadeNode::cluster(bin(), 3, &[]).unwrap();
    let endpoints = nodes
        .iter()
        .map(PalisadeNode::addr)
        .collect::<Vec<_>>()
        .join(",");
    let store = palisade_testkit::FenceStoreProcess::start(bin()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let palisade = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.env("PALISADE_ENDPOINTS", &endpoints)
            .env("PALISADE_RETRY_FOR", "30s")
            .args(args);
        c
    };
    let campaign = |who: &str| {
        let file = dir.path().join(format!("{who}.token"));
        holding(
            &["elect", "primary", "--value", who, "--ttl", "2s"],
            &endpoints,
            &file,
        )
    };
    let token_of = |who: &str| token_in(&dir.path().join(format!("{who}.token")));
    let signal = signal_group;
    let put = |token: u64| {
        let body = format!("written by the leader with token {token}");
        let headers = [("Fencing-Token", token.to_string())];
        store_request(&store.addr(), "PUT", "primary-config", &headers, &body)
    };
    let mut observer = palisade(&["elect", "primary", "--observe"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Every leader token the observer prints, in order.
    let (printed, seen) = std::sync::mpsc::channel();
    let lines = std::io::BufReader::new(observer.stdout.take().unwrap());
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in lines.lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            if let Some(t) = v["token"].as_u64() {
                let _ = printed.send(t);
            }
        }
    });
    let mut tokens_seen = Vec::new();
    let mut observed = |t: u64| {
        while !tokens_seen.contains(&t) {
            let next = seen
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("observe never printed token {t}: {tokens_seen:?}"));
            tokens_seen.push(next);
        }
        assert!(
            tokens_seen.windows(2).all(|w| w[0] < w[1]),
            "{tokens_seen:?}"
        );
    };
    let mut a = campaign("a");
    let ta = token_of("a");
    assert_eq!(put(ta), 200);
    observed(ta);
    let mut b = campaign("b");
    // Paused past its TTL: the cluster ends its session and elects b.
    signal(&a, "-STOP");
    let tb = token_of("b");
    assert!(tb > ta, "{tb} after {ta}");
    assert_eq!(put(tb), 200);
    observed(tb);
    // The paused leader wakes up and writes with the token it had.
    signal(&a, "-CONT");
    assert_eq!(put(ta), 409, "the store took a superseded leader's write");
    let lost = a.wait().unwrap();
    assert!(
        !lost.success(),
        "a leader that lost its lease exited {lost}"
    );

    // Killed outright: the next candidate leads once b's session expires.
    let mut c = campaign("c");
    signal(&b, "-KILL");
    let _ = b.wait();
    let tc = token_of("c");
    assert!(tc > tb, "{tc} after {tb}");
    assert_eq!(put(tc), 200);
    assert_eq!(put(tb), 409);
    observed(tc);
    signal(&c, "-TERM");
    let _ = c.wait();

    observer.kill().unwrap();
    let _ = observer.wait();
}
