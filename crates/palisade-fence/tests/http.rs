//! The fenced object store over real HTTP on a loopback port.

use std::path::{Path, PathBuf};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use palisade_fence::Fencing;
use palisade_fence::http::{MAX_BODY_BYTES, serve};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A `serve` task on 127.0.0.1, stopped by `stop`.
struct Server {
    base: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    client: Client<HttpConnector, Body>,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn token(&self) -> Option<&str> {
        self.headers
            .get("fencing-token")
            .map(|v| v.to_str().unwrap())
    }
}

impl Server {
    async fn start(dir: &Path, fencing: Fencing) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let dir: PathBuf = dir.to_owned();
        let task = tokio::spawn(async move {
            serve(listener, &dir, fencing, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        let server = Server {
            base,
            stop: Some(stop),
            task,
            client,
        };
        assert_eq!(
            server
                .call(Method::GET, "/v1/health", None, "")
                .await
                .status,
            StatusCode::OK
        );
        server
    }

    /// Sends a request; `token` becomes the Fencing-Token header.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: impl Into<Body>,
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("Fencing-Token", t);
        }
        self.send(req.body(body.into()).unwrap()).await
    }

    async fn send(&self, req: Request<Body>) -> Reply {
        let res = self.client.request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    async fn put(&self, key: &str, token: &str, body: &'static str) -> Reply {
        self.call(
            Method::PUT,
            &format!("/v1/objects/{key}"),
            Some(token),
            body,
        )
        .await
    }

    async fn get(&self, key: &str) -> Reply {
        self.call(Method::GET, &format!("/v1/objects/{key}"), None, "")
            .await
    }

    /// Graceful shutdown; returns once the store is closed.
    async fn stop(mut self) {
        drop(self.client);
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

#[tokio::test]
async fn the_essay_example_34_then_33() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;

    let r = s.put("file", "34", "written by client 2").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({ "key": "file", "token": 34, "previous": null })
    );

    let r = s.put("file", "33", "written by client 1").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let j = r.json();
    assert_eq!(j["error"], "stale_token");
    assert_eq!(
        (j["presented"].as_u64(), j["highest"].as_u64()),
        (Some(33), Some(34))
    );
    assert!(j["message"].as_str().unwrap().contains("33"));

    let r = s.get("file").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.body[..], b"written by client 2");
    assert_eq!(r.token(), Some("34"));
    assert_eq!(r.headers["content-type"], "application/octet-stream");
    s.stop().await;
}

#[tokio::test]
async fn an_equal_token_is_the_same_holder() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    assert_eq!(s.put("a/b.txt", "7", "one").await.status, StatusCode::OK);
    let r = s.put("a/b.txt", "7", "two").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({ "key": "a/b.txt", "token": 7, "previous": 7 })
    );
    let r = s.put("a/b.txt", "8", "three").await;
    assert_eq!(r.json()["previous"], 7);
    assert_eq!(&s.get("a/b.txt").await.body[..], b"three");
    // Each key is its own resource: a low token is fine elsewhere.
    assert_eq!(s.put("other", "1", "x").await.status, StatusCode::OK);
    s.stop().await;
}

#[tokio::test]
async fn missing_and_malformed_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    for method in [Method::PUT, Method::DELETE] {
        let r = s.call(method.clone(), "/v1/objects/k", None, "body").await;
        assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED, "{method}");
        assert_eq!(r.json()["error"], "missing_token");
        for bad in ["", "0", "-1", "+5", "abc", "3.0", "18446744073709551616"] {
            let r = s
                .call(method.clone(), "/v1/objects/k", Some(bad), "body")
                .await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{method} {bad:?}");
            assert_eq!(r.json()["error"], "malformed_token", "{bad:?}");
        }
    }
    let req = Request::put(format!("{}/v1/objects/k", s.base))
        .header("Fencing-Token", "5")
        .header("Fencing-Token", "6")
        .body(Body::from("x"))
        .unwrap();
    let r = s.send(req).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"], "malformed_token");
    // The largest token is fine.
    assert_eq!(
        s.put("k", "18446744073709551615", "max").await.status,
        StatusCode::OK
    );
    // None of the refused requests wrote anything before it.
    assert_eq!(s.get("k").await.token(), Some("18446744073709551615"));
    s.stop().await;
}

#[tokio::test]
async fn bad_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    let long = "k".repeat(257);
    for path in [
        "/v1/objects/",
        "/v1/objects",
        "/v1/objects/a/../b",
        "/v1/objects/..",
        "/v1/objects/%2E%2E/x",
        "/v1/objects/a//b",
        "/v1/objects/a/",
        "/v1/objects/a%20b",
        "/v1/objects/caf%C3%A9",
        "/v1/objects/%FF",
        &format!("/v1/objects/{long}"),
    ] {
        for method in [Method::PUT, Method::GET, Method::DELETE] {
            let r = s.call(method.clone(), path, Some("1"), "x").await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{method} {path}");
            assert_eq!(r.json()["error"], "bad_key", "{method} {path}");
        }
    }
    let ok = "k".repeat(256);
    assert_eq!(s.put(&ok, "1", "x").await.status, StatusCode::OK);
    assert_eq!(s.put("A-Z_a.z/0-9", "1", "x").await.status, StatusCode::OK);
    // Unknown routes and methods answer in JSON too.
    let r = s.call(Method::GET, "/v2/nothing", None, "").await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let r = s.call(Method::POST, "/v1/objects/k", Some("1"), "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.json()["error"], "method_not_allowed");
    s.stop().await;
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    let exact = vec![b'x'; MAX_BODY_BYTES];
    let r = s
        .call(Method::PUT, "/v1/objects/big", Some("2"), exact.clone())
        .await;
    assert_eq!(r.status, StatusCode::OK);

    let over = vec![b'y'; MAX_BODY_BYTES + 1];
    let r = s
        .call(Method::PUT, "/v1/objects/big", Some("3"), over)
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.json()["error"], "body_too_large");
    assert_eq!(r.json()["limit"], MAX_BODY_BYTES);

    // Chunked, with no Content-Length to refuse early: caught while reading.
    let chunks = (0..17).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'z'; 64 * 1024])));
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    let r = s
        .call(Method::PUT, "/v1/objects/big", Some("4"), body)
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.json()["error"], "body_too_large");

    // Neither refused write changed the object or its token.
    let r = s.get("big").await;
    assert_eq!((r.body.len(), r.token()), (MAX_BODY_BYTES, Some("2")));
    assert_eq!(
        s.put("big", "2", "same holder").await.status,
        StatusCode::OK
    );
    s.stop().await;
}

#[tokio::test]
async fn delete_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    let del = |token: Option<&'static str>| s.call(Method::DELETE, "/v1/objects/doc", token, "");
    assert_eq!(s.put("doc", "10", "v10").await.status, StatusCode::OK);

    let r = del(Some("9")).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        (r.json()["presented"].as_u64(), r.json()["highest"].as_u64()),
        (Some(9), Some(10))
    );
    assert_eq!(&s.get("doc").await.body[..], b"v10");
    assert_eq!(del(None).await.status, StatusCode::PRECONDITION_REQUIRED);

    let r = del(Some("11")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({ "key": "doc", "token": 11, "previous": 10, "deleted": true })
    );
    let r = s.get("doc").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.json(),
        json!({ "error": "not_found", "key": "doc", "message": "no object at \"doc\"" })
    );

    // The tombstone keeps token 11: the superseded holder cannot recreate it.
    let r = s.put("doc", "10", "stale again").await;
    assert_eq!(
        (r.status, r.json()["highest"].as_u64()),
        (StatusCode::CONFLICT, Some(11))
    );
    assert_eq!(s.get("doc").await.status, StatusCode::NOT_FOUND);
    assert_eq!(del(Some("11")).await.json()["deleted"], false);
    s.stop().await;
}

#[tokio::test]
async fn a_restart_keeps_data_and_highest_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    assert_eq!(s.put("file", "34", "client 2").await.status, StatusCode::OK);
    assert_eq!(s.put("gone", "5", "x").await.status, StatusCode::OK);
    assert_eq!(
        s.call(Method::DELETE, "/v1/objects/gone", Some("6"), "")
            .await
            .status,
        StatusCode::OK
    );
    s.stop().await;

    let s = Server::start(dir.path(), Fencing::On).await;
    let r = s.get("file").await;
    assert_eq!((&r.body[..], r.token()), (&b"client 2"[..], Some("34")));
    let r = s.put("file", "33", "client 1").await;
    assert_eq!(
        (r.status, r.json()["highest"].as_u64()),
        (StatusCode::CONFLICT, Some(34))
    );
    assert_eq!(s.put("gone", "5", "x").await.status, StatusCode::CONFLICT);
    assert_eq!(s.get("gone").await.status, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn fencing_off_accepts_the_stale_write() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::Off).await;
    assert_eq!(
        s.call(Method::GET, "/v1/health", None, "").await.json(),
        json!({ "status": "ok", "fencing": "off" })
    );
    assert_eq!(s.put("file", "34", "client 2").await.status, StatusCode::OK);
    let r = s.put("file", "33", "client 1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({ "key": "file", "token": 33, "previous": 34 })
    );
    // The lost update: client 2's write is gone, and the store says who did it.
    let r = s.get("file").await;
    assert_eq!((&r.body[..], r.token()), (&b"client 1"[..], Some("33")));
    // The token is still required, to record who wrote.
    let r = s.call(Method::PUT, "/v1/objects/file", None, "x").await;
    assert_eq!(r.status, StatusCode::PRECONDITION_REQUIRED);
    s.stop().await;

    // The highest token was kept even so: the same data with fencing on refuses 33.
    let s = Server::start(dir.path(), Fencing::On).await;
    assert_eq!(
        s.call(Method::GET, "/v1/health", None, "").await.json()["fencing"],
        "on"
    );
    assert_eq!(
        s.put("file", "33", "client 1 again").await.status,
        StatusCode::CONFLICT
    );
    s.stop().await;
}

#[tokio::test]
async fn serve_refuses_a_store_already_open() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = serve(listener, dir.path(), Fencing::On, std::future::ready(())).await;
    assert!(
        matches!(r, Err(palisade_fence::http::ServeError::Store(_))),
        "{r:?}"
    );
    s.stop().await;
}

/// Sends `raw` bytes on a fresh connection and returns what came back
/// (everything until the server closes or 5 s pass).
async fn raw_exchange(base: &str, raw: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
        if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}") {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn tokens_are_spelled_one_way_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), Fencing::On).await;
    // Byte for byte as a client sends them. Whitespace around a header's value
    // is not part of it (RFC 9110 §5.5): `fencing-token: 5` is token 5.
    for (value, status) in [
        ("05", "400"),
        ("+5", "400"),
        ("0x5", "400"),
        ("5 5", "400"),
        ("5,6", "400"),
        ("5", "200"),
    ] {
        let raw = format!(
            "PUT /v1/objects/k HTTP/1.1\r\nhost: x\r\nconnection: close\r\nfencing-token: {value}\r\ncontent-length: 1\r\n\r\nx"
        );
        let reply = raw_exchange(&s.base, raw.as_bytes()).await;
        let first = reply.lines().next().unwrap_or("");
        assert!(
            first.starts_with(&format!("HTTP/1.1 {status}")),
            "{value:?}: {reply}"
        );
        if status == "400" {
            assert!(reply.contains("malformed_token"), "{value:?}: {reply}");
        }
    }
    assert_eq!(s.get("k").await.token(), Some("5"));
    s.stop().await;
}

/// A store with short deadlines on a loopback port.
async fn start_with_deadlines(dir: &Path, deadline: std::time::Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let store = palisade_fence::ObjectStore::open(dir, Fencing::On).unwrap();
    let options = palisade_fence::http::ServeOptions {
        header_timeout: deadline,
        body_timeout: deadline,
        ..Default::default()
    };
    tokio::spawn(palisade_fence::http::serve_with(
        listener,
        store,
        options,
        std::future::pending(),
    ));
    base
}

#[tokio::test]
async fn a_client_that_sends_no_header_or_no_body_in_time_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let base = start_with_deadlines(dir.path(), std::time::Duration::from_secs(1)).await;
    let addr = base.trim_start_matches("http://").to_owned();
    let started = std::time::Instant::now();

    // Silent, and a slow-loris that never finishes its headers: both closed.
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut loris = tokio::net::TcpStream::connect(&addr).await.unwrap();
    loris
        .write_all(b"PUT /v1/objects/k HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    for conn in [&mut silent, &mut loris] {
        let mut buf = [0u8; 1024];
        // Closed by the store (EOF, or a 408 and then EOF) long before the
        // generous bound; a store without the deadline would hold it forever.
        let mut got = Vec::new();
        loop {
            match tokio::time::timeout(std::time::Duration::from_secs(60), conn.read(&mut buf))
                .await
                .expect("the store did not close a connection that sent no header")
            {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{text}"
        );
    }
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));

    // Headers in time, but a body that never comes: 408 body_timeout.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(
        b"PUT /v1/objects/k HTTP/1.1\r\nhost: x\r\nfencing-token: 5\r\ncontent-length: 10\r\n\r\nabc",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("}") {
        match tokio::time::timeout(std::time::Duration::from_secs(60), slow.read(&mut buf))
            .await
            .expect("no answer to a body that never came")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
    // Nothing was written.
    let reply = raw_exchange(
        &base,
        b"GET /v1/objects/k HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
}
