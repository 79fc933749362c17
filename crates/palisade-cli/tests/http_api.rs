//! The HTTP/JSON API (docs/http.md) end to end, with `curl` against real nodes:
//! long polls answered by a grant, a wait that runs out, a caller that goes
//! away, followers naming the leader, and bad input — each refused with a JSON
//! error of the right code and status, none reaching the log. (Over TLS, with
//! roles and bearer tokens: `security.rs`.) No assertion depends on how fast
//! the machine is: waits poll for a state, with generous bounds.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_testkit::PalisadeNode;
use serde_json::{Value, json};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_palisade"))
}

/// `curl` with `args`, returning the HTTP status and the JSON body.
fn curl(args: &[&str]) -> (u16, Value) {
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl (scripts/test installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code: u16 = code.trim().parse().unwrap_or(0);
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (code, body)
}

fn post(node: &str, path: &str, body: &Value) -> (u16, Value) {
    curl(&[
        "-X",
        "POST",
        &format!("http://{node}{path}"),
        "-H",
        "content-type: application/json",
        "-d",
        &body.to_string(),
    ])
}

fn get(node: &str, path_and_query: &str) -> (u16, Value) {
    curl(&[&format!("http://{node}{path_and_query}")])
}

/// A session: its id and key, as the JSON calls take them.
#[derive(Clone)]
struct Session {
    id: String,
    key: String,
}

impl Session {
    fn open(node: &str) -> Session {
        let (code, body) = post(
            node,
            "/v1/sessions",
            &json!({"ttl_ms": 60000, "label": "t"}),
        );
        assert_eq!(code, 200, "{body}");
        Session {
            id: body["session_id"].as_str().unwrap().to_owned(),
            key: body["session_key"].as_str().unwrap().to_owned(),
        }
    }

    fn with(&self, mut fields: Value) -> Value {
        fields["session_id"] = json!(self.id);
        fields["session_key"] = json!(self.key);
        fields
    }
}

fn token(body: &Value) -> u64 {
    body["token"]
        .as_str()
        .expect("token as a string")
        .parse()
        .unwrap()
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<none>")
}

/// Polls `probe` until it holds, for at most a minute.
fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !probe() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn waiters(node: &str, name: &str) -> Vec<String> {
    let (code, body) = get(node, &format!("/v1/lock?name={name}"));
    assert_eq!(code, 200, "{body}");
    body["lock"]["waiters"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// An acquire that waits, as a `curl` in the background.
fn waiting_acquire(node: &str, s: &Session, name: &str) -> Child {
    let body = s.with(json!({"name": name, "wait_ms": 120000}));
    Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-X", "POST"])
        .arg(format!("http://{node}/v1/locks/acquire"))
        .args(["-H", "content-type: application/json", "-d"])
        .arg(body.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_long_poll_is_answered_by_the_grant_and_a_caller_that_leaves_leaves_the_queue() {
    let node = PalisadeNode::single(bin()).unwrap();
    let addr = node.addr();
    let (a, b, c) = (
        Session::open(&addr),
        Session::open(&addr),
        Session::open(&addr),
    );
    let (code, held) = post(
        &addr,
        "/v1/locks/acquire",
        &a.with(json!({"name": "jobs/x"})),
    );
    assert_eq!(code, 200, "{held}");
    let first = token(&held);
    // A second acquire of a lock the session holds gives the same grant back:
    // retrying an acquire whose answer was lost is safe.
    let (_, again) = post(
        &addr,
        "/v1/locks/acquire",
        &a.with(json!({"name": "jobs/x"})),
    );
    assert_eq!(token(&again), first);

    let (code, busy) = post(
        &addr,
        "/v1/locks/acquire",
        &b.with(json!({"name": "jobs/x"})),
    );
    assert_eq!((code, error_code(&busy)), (409, "would_block"), "{busy}");
    let (code, timed_out) = post(
        &addr,
        "/v1/locks/acquire",
        &b.with(json!({"name": "jobs/x", "wait_ms": 300})),
    );
    assert_eq!((code, error_code(&timed_out)), (409, "wait_timeout"));

    // B and C wait; C's caller goes away, and C leaves the queue.
    let b_wait = waiting_acquire(&addr, &b, "jobs/x");
    eventually("B queued", || waiters(&addr, "jobs/x") == [b.id.clone()]);
    let mut c_wait = waiting_acquire(&addr, &c, "jobs/x");
    eventually("C queued behind B", || {
        waiters(&addr, "jobs/x") == [b.id.clone(), c.id.clone()]
    });
    c_wait.kill().unwrap();
    let _ = c_wait.wait();
    eventually("C out of the queue", || {
        waiters(&addr, "jobs/x") == [b.id.clone()]
    });

    // A releases: B's long poll is answered with the next token.
    let (code, _) = post(
        &addr,
        "/v1/locks/release",
        &a.with(json!({"name": "jobs/x", "token": first.to_string()})),
    );
    assert_eq!(code, 200);
    let out = b_wait.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n').unwrap();
    assert_eq!(status, "200", "{text}");
    let second = token(&serde_json::from_str(body).unwrap());
    assert!(second > first, "{second} after {first}");
    let (_, lock) = get(&addr, "/v1/lock?name=jobs/x");
    assert_eq!(lock["lock"]["holder"], json!(b.id));
    assert_eq!(lock["lock"]["token"], json!(second.to_string()));

    // The released token is stale; the current one is current.
    let (_, stale) = get(&addr, &format!("/v1/check-token?name=jobs/x&token={first}"));
    let issued: u64 = stale["issued_through"].as_str().unwrap().parse().unwrap();
    assert!(issued >= second, "{stale}");
    assert_eq!(
        stale,
        json!({"current": false, "current_token": second.to_string(),
            "issued_through": issued.to_string()})
    );
    let (code, stale) = post(
        &addr,
        "/v1/locks/release",
        &b.with(json!({"name": "jobs/x", "token": first.to_string()})),
    );
    assert_eq!((code, error_code(&stale)), (409, "stale_token"), "{stale}");
    assert_eq!(stale["error"]["current_token"], json!(second.to_string()));
    assert_eq!(stale["error"]["presented_token"], json!(first.to_string()));

    // Closing B's session releases its lock at once.
    let (code, _) = post(&addr, "/v1/sessions/close", &b.with(json!({})));
    assert_eq!(code, 200);
    let (_, lock) = get(&addr, "/v1/lock?name=jobs/x");
    assert_eq!(lock, json!({"lock": null}));
    let (code, gone) = post(&addr, "/v1/sessions/keepalive", &b.with(json!({})));
    // The one answer for "no such session" and "wrong key"; `session_id` tells
    // a client holding the right key that its session is gone.
    assert_eq!((code, error_code(&gone)), (401, "unauthenticated"));
    assert_eq!(gone["error"]["session_id"], json!(b.id));
}

#[test]
fn bad_input_gets_a_json_error_and_never_reaches_the_log() {
    let node = PalisadeNode::single(bin()).unwrap();
    let addr = node.addr();
    let s = Session::open(&addr);
    let commit_index = || {
        let (_, status) = get(&addr, "/v1/status");
        status["commit_index"].as_str().unwrap().to_owned()
    };
    let before = commit_index();
    let long_name = "n".repeat(300);
    let big = "x".repeat(100 * 1024);
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("/v1/sessions", json!({"ttl_ms": 0}), 400, "invalid_input"),
        (
            "/v1/sessions",
            json!({"ttl_ms": 1u64 << 40}),
            400,
            "invalid_input",
        ),
        ("/v1/sessions", json!({"ttl_ms": -5}), 400, "invalid_input"),
        ("/v1/sessions", json!({}), 400, "invalid_input"),
        (
            "/v1/sessions",
            json!({"ttl_ms": 1000, "tll": 1}),
            400,
            "invalid_input",
        ),
        (
            "/v1/sessions",
            json!({"ttl_ms": 1000, "label": big}),
            413,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            s.with(json!({"name": ""})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            s.with(json!({"name": long_name})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            s.with(json!({"name": "a", "wait_ms": 3_600_001})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            s.with(json!({"name": "a", "lock_delay_ms": 60_001})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            s.with(json!({"name": "a", "wiat_ms": 5})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            json!({"session_id": s.id, "session_key": "00ff", "name": "a"}),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            json!({"session_id": " 2", "session_key": s.key, "name": "a"}),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/release",
            s.with(json!({"name": "a", "token": "07"})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/release",
            s.with(json!({"name": "a", "token": "0"})),
            400,
            "invalid_input",
        ),
        (
            "/v1/locks/acquire",
            json!({"session_id": s.id, "session_key": "0".repeat(32), "name": "a"}),
            401,
            "unauthenticated",
        ),
        (
            "/v1/locks/acquire",
            json!({"session_id": "999999", "session_key": s.key, "name": "a"}),
            401,
            "unauthenticated",
        ),
    ];
    for (path, body, status, code) in &cases {
        let (got, answer) = post(&addr, path, body);
        assert_eq!(
            (got, error_code(&answer)),
            (*status, *code),
            "POST {path} {}: {answer}",
            body.to_string().chars().take(200).collect::<String>()
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    let raw_cases: Vec<(Vec<&str>, u16)> = vec![
        // Not JSON, or not said to be.
        (
            vec![
                "-X",
                "POST",
                "-H",
                "content-type: application/json",
                "-d",
                "{\"ttl_ms\":",
            ],
            400,
        ),
        (vec!["-X", "POST", "-d", "{\"ttl_ms\": 1000}"], 415),
        (vec!["-X", "DELETE"], 405),
    ];
    for (args, status) in raw_cases {
        let mut all = args.clone();
        let url = format!("http://{addr}/v1/sessions");
        all.push(&url);
        let (got, answer) = curl(&all);
        assert_eq!(
            (got, error_code(&answer)),
            (status, "invalid_input"),
            "{args:?}: {answer}"
        );
    }
    for query in [
        "/v1/nothing",
        "/v1/lock",
        "/v1/lock?name=",
        "/v1/check-token?name=a&token=-1",
        "/v1/check-token?name=a&token=1&x=2",
        "/v1/locks?all=1",
    ] {
        let (got, answer) = get(&addr, query);
        assert!(matches!(got, 400 | 404), "GET {query}: {got} {answer}");
        assert_eq!(
            error_code(&answer),
            "invalid_input",
            "GET {query}: {answer}"
        );
    }
    assert_eq!(commit_index(), before, "bad input reached the log");
    // Refusals that depend on the state are decided by the log's order.
    let (code, answer) = post(
        &addr,
        "/v1/locks/release",
        &s.with(json!({"name": "a", "token": "5"})),
    );
    assert_eq!((code, error_code(&answer)), (409, "not_holder"), "{answer}");
    // The session is untouched and still works.
    let (code, _) = post(&addr, "/v1/sessions/keepalive", &s.with(json!({})));
    assert_eq!(code, 200);
}

#[test]
fn followers_name_the_leader_and_grpc_still_answers_on_the_same_port() {
    let nodes = PalisadeNode::cluster(bin(), 3, &[]).unwrap();
    let leader = {
        let mut found = None;
        eventually("a leader", || {
            for n in &nodes {
                let (_, st) = get(&n.addr(), "/v1/status");
                if st["state"] == "leader" {
                    found = Some(n.addr());
                    return true;
                }
            }
            false
        });
        found.unwrap()
    };
    let follower = nodes
        .iter()
        .map(PalisadeNode::addr)
        .find(|a| *a != leader)
        .unwrap();
    let out = Command::new("curl")
        .args(["-s", "-D", "-", "-X", "POST"])
        .arg(format!("http://{follower}/v1/sessions"))
        .args([
            "-H",
            "content-type: application/json",
            "-d",
            "{\"ttl_ms\": 5000}",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 503"), "{text}");
    assert!(
        text.contains(&format!("palisade-leader: {leader}")),
        "{text}"
    );
    let body: Value = serde_json::from_str(text.rsplit("\r\n\r\n").next().unwrap()).unwrap();
    assert_eq!(error_code(&body), "not_leader");
    assert_eq!(body["error"]["leader"], json!(leader));
    // The CLI's gRPC on the same port.
    let status = Command::new(bin())
        .args(["status", "--endpoints", &follower])
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
}

/// The recipes over JSON: a permit answers its slot, a recipe's LOCK says
/// what it is and lists every holder, a leader proclaims, and a claim of the
/// wrong shape is `wrong_shape` (409) and changes nothing.
#[test]
fn recipes_over_json_answer_slots_list_holders_and_refuse_the_wrong_shape() {
    let node = PalisadeNode::single(bin()).unwrap();
    let addr = node.addr();
    let (a, b) = (Session::open(&addr), Session::open(&addr));
    let permit = |s: &Session| {
        post(
            &addr,
            "/v1/locks/acquire",
            &s.with(json!({"name": "pool", "claim": "permit", "permits": 2})),
        )
    };
    let (code, first) = permit(&a);
    assert_eq!((code, first["slot"].as_u64()), (200, Some(0)), "{first}");
    let (code, second) = permit(&b);
    assert_eq!((code, second["slot"].as_u64()), (200, Some(1)), "{second}");
    let (code, body) = get(&addr, "/v1/lock?name=pool");
    assert_eq!(code, 200);
    let lock = &body["lock"];
    assert_eq!(
        (lock["shape"].as_str(), lock["permits"].as_u64()),
        (Some("semaphore"), Some(2))
    );
    assert_eq!(lock["holders"].as_array().map(Vec::len), Some(2), "{lock}");

    let before = get(&addr, "/v1/lock?name=pool").1;
    let c = Session::open(&addr);
    for wrong in [
        json!({"name": "pool"}),
        json!({"name": "pool", "claim": "permit", "permits": 3}),
        json!({"name": "pool", "claim": "read"}),
    ] {
        let (code, body) = post(&addr, "/v1/locks/acquire", &c.with(wrong));
        assert_eq!((code, error_code(&body)), (409, "wrong_shape"), "{body}");
    }
    assert_eq!(get(&addr, "/v1/lock?name=pool").1, before);
    let (code, body) = post(
        &addr,
        "/v1/locks/acquire",
        &c.with(json!({"name": "x", "permits": 3})),
    );
    assert_eq!((code, error_code(&body)), (400, "invalid_input"), "{body}");

    let (code, led) = post(
        &addr,
        "/v1/locks/acquire",
        &c.with(json!({"name": "primary", "claim": "lead", "value": "10.0.0.7:5432"})),
    );
    assert_eq!(code, 200, "{led}");
    let proclaim = |s: &Session, name: &str, value: &str| {
        post(
            &addr,
            "/v1/locks/proclaim",
            &s.with(json!({"name": name, "token": led["token"], "value": value})),
        )
    };
    assert_eq!(proclaim(&c, "primary", "10.0.0.7:6432").0, 200);
    let (_, body) = get(&addr, "/v1/lock?name=primary");
    assert_eq!(body["lock"]["holders"][0]["value"], "10.0.0.7:6432");
    let (code, body) = proclaim(&a, "primary", "me");
    assert_eq!((code, error_code(&body)), (409, "not_holder"), "{body}");
}
