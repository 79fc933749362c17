//! The PostgreSQL adapter against a real server started by the test.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Event, Outcome, check_history, t};
use palisade_fence::ResourceError;
use palisade_fence::postgres::{PgFenceError, ensure_schema, fenced_write, highest_token};
use palisade_testkit::PostgresServer;
use tokio_postgres::{Client, NoTls};

async fn connect(pg: &PostgresServer) -> Client {
    let (client, connection) = tokio_postgres::connect(&pg.connection_string(), NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", pg.url(), pg.log()));
    tokio::spawn(connection);
    client
}

/// A server with the fence schema and a one-row table `doc` to protect.
async fn setup() -> (PostgresServer, Client) {
    let pg = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap()
        .expect("start postgres");
    let client = connect(&pg).await;
    ensure_schema(&client).await.unwrap();
    ensure_schema(&client).await.unwrap(); // idempotent
    client
        .batch_execute(
            "CREATE TABLE doc (id int PRIMARY KEY, body text NOT NULL, token bigint NOT NULL);
             INSERT INTO doc VALUES (1, 'initial', 0);
             CREATE TABLE write_log (seq bigserial PRIMARY KEY, token bigint NOT NULL);",
        )
        .await
        .unwrap();
    (pg, client)
}

/// Writes `body` to the doc under `token`, logging the write.
async fn write_doc(
    client: &mut Client,
    token: u64,
    body: &str,
) -> Result<palisade_fence::Admitted, PgFenceError<tokio_postgres::Error>> {
    let raw = i64::try_from(token).unwrap();
    fenced_write(client, "doc/1", t(token), async |tx, _| {
        tx.execute(
            "UPDATE doc SET body = $1, token = $2 WHERE id = 1",
            &[&body, &raw],
        )
        .await?;
        tx.execute("INSERT INTO write_log (token) VALUES ($1)", &[&raw])
            .await
    })
    .await
    .map(|(a, _)| a)
}

async fn doc(client: &Client) -> (String, i64) {
    let row = client
        .query_one("SELECT body, token FROM doc WHERE id = 1", &[])
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_stale_write_is_refused_and_writes_nothing() {
    let (_pg, mut client) = setup().await;
    let a = write_doc(&mut client, 34, "client 2").await.unwrap();
    assert_eq!(a.previous, None);

    let ran = AtomicBool::new(false);
    let r = fenced_write(&mut client, "doc/1", t(33), async |tx, _| {
        ran.store(true, Ordering::SeqCst);
        tx.execute("UPDATE doc SET body = 'client 1' WHERE id = 1", &[])
            .await
    })
    .await;
    match r {
        Err(PgFenceError::StaleToken { presented, highest }) => {
            assert_eq!((presented, highest), (t(33), t(34)));
        }
        other => panic!("expected StaleToken, got {other:?}"),
    }
    assert!(
        !ran.load(Ordering::SeqCst),
        "the write ran for a stale token"
    );
    assert_eq!(doc(&client).await, ("client 2".into(), 34));
    assert_eq!(highest_token(&client, "doc/1").await.unwrap(), Some(t(34)));
    // The connection is usable afterwards: the transaction was closed.
    assert_eq!(highest_token(&client, "elsewhere").await.unwrap(), None);
}

#[tokio::test]
async fn equal_and_greater_tokens_are_accepted() {
    let (_pg, mut client) = setup().await;
    write_doc(&mut client, 34, "first").await.unwrap();
    let a = write_doc(&mut client, 34, "same holder").await.unwrap();
    assert!(a.is_repeat());
    let a = write_doc(&mut client, 35, "next holder").await.unwrap();
    assert_eq!(a.previous, Some(t(34)));
    assert_eq!(doc(&client).await, ("next holder".into(), 35));
    assert_eq!(highest_token(&client, "doc/1").await.unwrap(), Some(t(35)));
}

#[tokio::test]
async fn a_failed_write_rolls_the_token_back_too() {
    let (_pg, mut client) = setup().await;
    write_doc(&mut client, 5, "five").await.unwrap();
    // The write fails (a constraint violation); the advance to 9 must not stick.
    let r = fenced_write(&mut client, "doc/1", t(9), async |tx, _| {
        tx.execute("UPDATE doc SET body = 'nine' WHERE id = 1", &[])
            .await?;
        tx.execute("INSERT INTO doc VALUES (1, 'duplicate', 9)", &[])
            .await
    })
    .await;
    assert!(matches!(r, Err(PgFenceError::Write(_))), "{r:?}");
    assert_eq!(highest_token(&client, "doc/1").await.unwrap(), Some(t(5)));
    assert_eq!(doc(&client).await, ("five".into(), 5));
    write_doc(&mut client, 6, "six").await.unwrap();

    // Refused before anything is sent.
    let r = write_doc_at(&mut client, "", 7).await;
    assert!(matches!(
        r,
        Err(PgFenceError::InvalidResource(ResourceError::Empty))
    ));
    let r = fenced_write(&mut client, "doc/1", t(u64::MAX), async |_, _| {
        Ok::<_, tokio_postgres::Error>(())
    })
    .await;
    assert!(matches!(r, Err(PgFenceError::TokenOutOfRange(_))), "{r:?}");
    assert_eq!(highest_token(&client, "doc/1").await.unwrap(), Some(t(6)));
}

async fn write_doc_at(
    client: &mut Client,
    resource: &str,
    token: u64,
) -> Result<(), PgFenceError<tokio_postgres::Error>> {
    fenced_write(client, resource, t(token), async |_, _| Ok(()))
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_never_let_a_lower_token_write_after_a_higher_one() {
    let (pg, client) = setup().await;
    const WRITERS: u64 = 6;
    const TOKENS: u64 = 60;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut client = connect(&pg).await;
        // Each writer takes every WRITERS-th token of a scrambled order, so lower
        // and higher tokens race against each other.
        let tokens: Vec<u64> = (0..TOKENS)
            .filter(|i| i % WRITERS == w)
            .map(|i| (i * 37) % TOKENS + 1)
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::new();
            for token in tokens {
                let outcome = match write_doc(&mut client, token, &format!("w{w} t{token}")).await {
                    Ok(a) => Outcome::Accepted(a.previous),
                    Err(PgFenceError::StaleToken { highest, .. }) => Outcome::Stale(highest),
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
    let finals = BTreeMap::from([(0, highest_token(&client, "doc/1").await.unwrap())]);
    check_history(&events, &finals).unwrap();

    // The writes themselves, in the order they happened (the fence's row lock
    // serialises them, so the log's sequence is their commit order): never down.
    let logged: Vec<i64> = client
        .query("SELECT token FROM write_log ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        logged.windows(2).all(|w| w[0] <= w[1]),
        "writes went backwards: {logged:?}"
    );
    let accepted = events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Accepted(_)))
        .count();
    assert_eq!(logged.len(), accepted);
    assert_eq!(*logged.last().unwrap(), TOKENS as i64);
    assert_eq!(doc(&client).await.1, TOKENS as i64);
}

#[tokio::test]
async fn a_verified_write_believes_only_tokens_the_lock_service_granted() {
    use palisade_fence::postgres::fenced_write_verified;
    use palisade_fence::verify::{TokenVerifier, VerifyError};
    let (_pg, mut client) = setup().await;
    let verifier = TokenVerifier::new(common::OneGrant {
        current: 7,
        issued: 9,
    });
    for (token, expect_future) in [(i64::MAX as u64, true), (8, false)] {
        let r = fenced_write_verified(
            &mut client,
            &verifier,
            "jobs/nightly",
            "doc/1",
            t(token),
            async |tx, _| {
                tx.execute("UPDATE doc SET body = 'forged' WHERE id = 1", &[])
                    .await
            },
        )
        .await;
        match r {
            Err(PgFenceError::NotBelieved(VerifyError::FromTheFuture { .. })) => {
                assert!(expect_future)
            }
            Err(PgFenceError::NotBelieved(VerifyError::NotCurrent { .. })) => {
                assert!(!expect_future)
            }
            other => panic!("{token}: {other:?}"),
        }
    }
    for _ in 0..3 {
        fenced_write_verified(
            &mut client,
            &verifier,
            "jobs/nightly",
            "doc/1",
            t(7),
            async |tx, _| {
                tx.execute("UPDATE doc SET body = 'by the holder' WHERE id = 1", &[])
                    .await
            },
        )
        .await
        .unwrap();
    }
    assert_eq!(
        verifier.checks(),
        3,
        "two refusals and one question for three writes"
    );
    let body: String = client
        .query_one("SELECT body FROM doc WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(body, "by the holder");
    assert_eq!(highest_token(&client, "doc/1").await.unwrap(), Some(t(7)));
}
