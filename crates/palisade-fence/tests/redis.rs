//! The Redis adapter against a real `redis-server` started by the test.

mod common;

use std::collections::BTreeMap;

use common::{Event, Outcome, check_history, t};
use palisade_fence::ResourceError;
use palisade_fence::redis::{RedisFenceError, fenced_set, highest_token, token_key};
use palisade_testkit::RedisServer;
use redis::aio::MultiplexedConnection;

async fn setup() -> (RedisServer, MultiplexedConnection) {
    let server = RedisServer::start().expect("start redis-server");
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (server, conn)
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test]
async fn a_stale_write_is_refused_and_writes_nothing() {
    let (_server, mut c) = setup().await;
    let a = fenced_set(&mut c, "file", t(34), b"client 2")
        .await
        .unwrap();
    assert_eq!(a.previous, None);
    match fenced_set(&mut c, "file", t(33), b"client 1").await {
        Err(RedisFenceError::StaleToken { presented, highest }) => {
            assert_eq!((presented, highest), (t(33), t(34)));
        }
        other => panic!("expected StaleToken, got {other:?}"),
    }
    assert_eq!(get(&mut c, "file").await.as_deref(), Some("client 2"));
    assert_eq!(get(&mut c, &token_key("file")).await.as_deref(), Some("34"));
    assert_eq!(highest_token(&mut c, "file").await.unwrap(), Some(t(34)));
    assert_eq!(highest_token(&mut c, "other").await.unwrap(), None);
}

#[tokio::test]
async fn equal_and_greater_tokens_are_accepted() {
    let (_server, mut c) = setup().await;
    fenced_set(&mut c, "file", t(34), b"one").await.unwrap();
    assert!(
        fenced_set(&mut c, "file", t(34), b"two")
            .await
            .unwrap()
            .is_repeat()
    );
    let a = fenced_set(&mut c, "file", t(35), b"three").await.unwrap();
    assert_eq!(a.previous, Some(t(34)));
    assert_eq!(get(&mut c, "file").await.as_deref(), Some("three"));
    // Binary values pass through untouched.
    fenced_set(&mut c, "bin", t(1), &[0, 255, 10, 13])
        .await
        .unwrap();
    let raw: Vec<u8> = redis::cmd("GET")
        .arg("bin")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(raw, [0, 255, 10, 13]);
}

#[tokio::test]
async fn tokens_beyond_double_precision_compare_exactly() {
    let (_server, mut c) = setup().await;
    // 2^53 + 1 and 2^53 are the same Lua number; the script must still tell them apart.
    let big = (1u64 << 53) + 1;
    fenced_set(&mut c, "r", t(big), b"big").await.unwrap();
    let r = fenced_set(&mut c, "r", t(big - 1), b"smaller").await;
    assert!(
        matches!(r, Err(RedisFenceError::StaleToken { .. })),
        "{r:?}"
    );
    // Longer numbers are larger, shorter ones smaller.
    fenced_set(&mut c, "r", t(u64::MAX), b"max").await.unwrap();
    assert!(
        fenced_set(&mut c, "r", t(u64::MAX - 1), b"x")
            .await
            .is_err()
    );
    assert!(fenced_set(&mut c, "r", t(9), b"x").await.is_err());
    assert_eq!(highest_token(&mut c, "r").await.unwrap(), Some(t(u64::MAX)));
    assert_eq!(get(&mut c, "r").await.as_deref(), Some("max"));
    let a = fenced_set(&mut c, "s", t(9), b"9").await.unwrap();
    assert_eq!(a.previous, None);
    assert_eq!(
        fenced_set(&mut c, "s", t(10), b"10")
            .await
            .unwrap()
            .previous,
        Some(t(9))
    );
    assert!(fenced_set(&mut c, "s", t(9), b"9").await.is_err());
}

#[tokio::test]
async fn bad_input_and_a_corrupt_token_key_write_nothing() {
    let (_server, mut c) = setup().await;
    let r = fenced_set(&mut c, "", t(1), b"x").await;
    assert!(matches!(
        r,
        Err(RedisFenceError::InvalidResource(ResourceError::Empty))
    ));
    let _: () = redis::cmd("SET")
        .arg(token_key("r"))
        .arg("junk")
        .query_async(&mut c)
        .await
        .unwrap();
    let r = fenced_set(&mut c, "r", t(5), b"x").await;
    assert!(matches!(r, Err(RedisFenceError::Redis(_))), "{r:?}");
    assert_eq!(get(&mut c, "r").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_never_let_a_lower_token_write_after_a_higher_one() {
    let (server, mut c) = setup().await;
    const WRITERS: u64 = 6;
    const TOKENS: u64 = 300;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        // A connection each, so the commands really race at the server.
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let tokens: Vec<u64> = (0..TOKENS)
            .filter(|i| i % WRITERS == w)
            .map(|i| (i * 37) % TOKENS + 1)
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::new();
            for token in tokens {
                let value = format!("written with {token}");
                let outcome = match fenced_set(&mut conn, "doc", t(token), value.as_bytes()).await {
                    Ok(a) => Outcome::Accepted(a.previous),
                    Err(RedisFenceError::StaleToken { highest, .. }) => Outcome::Stale(highest),
                    Err(e) => panic!("writer {w}: {e}"),
                };
                events.push(Event {
                    resource: 0,
                    token: t(token),
                    outcome,
                });
            }
            events
        }));
    }
    let mut events = Vec::new();
    for task in tasks {
        events.extend(task.await.unwrap());
    }
    let finals = BTreeMap::from([(0, highest_token(&mut c, "doc").await.unwrap())]);
    check_history(&events, &finals).unwrap();
    assert_eq!(
        get(&mut c, "doc").await,
        Some(format!("written with {TOKENS}")),
        "the value is not the highest holder's"
    );
}

#[tokio::test]
async fn a_verified_set_believes_only_tokens_the_lock_service_granted() {
    use palisade_fence::redis::fenced_set_verified;
    use palisade_fence::verify::{TokenVerifier, VerifyError};
    let (_server, mut c) = setup().await;
    let verifier = TokenVerifier::new(common::OneGrant {
        current: 7,
        issued: 9,
    });
    let conn = c.clone();
    let set = |token: u64, body: &'static [u8]| {
        let mut c = conn.clone();
        let verifier = &verifier;
        async move {
            fenced_set_verified(
                &mut c,
                verifier,
                "jobs/nightly",
                "jobs/nightly",
                t(token),
                body,
            )
            .await
        }
    };
    assert!(matches!(
        set(u64::MAX, b"made up").await,
        Err(RedisFenceError::NotBelieved(
            VerifyError::FromTheFuture { .. }
        ))
    ));
    assert!(matches!(
        set(8, b"not current").await,
        Err(RedisFenceError::NotBelieved(VerifyError::NotCurrent { .. }))
    ));
    assert_eq!(highest_token(&mut c, "jobs/nightly").await.unwrap(), None);
    for body in [&b"one"[..], b"two", b"three"] {
        set(7, body).await.unwrap();
    }
    assert_eq!(
        verifier.checks(),
        3,
        "one question for the grant's three writes"
    );
    // A lower token is stale without a question.
    assert!(matches!(
        set(5, b"old").await,
        Err(RedisFenceError::StaleToken { .. })
    ));
    assert_eq!(verifier.checks(), 3);
    assert_eq!(get(&mut c, "jobs/nightly").await.as_deref(), Some("three"));
}
