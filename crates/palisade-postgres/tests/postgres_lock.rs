//! The PostgreSQL backend against a real PostgreSQL server (Debian's package,
//! started by the testkit on a loopback port): the lock contract's suite
//! (`lock_contract::*`: crashed with `kill -9`, cut off through the fault
//! proxy), then what is PostgreSQL's own. No assertion depends on how fast the
//! machine is.

use std::time::{Duration, Instant};

use palisade_core::conformance::{Cut, Fixture, Opening, Session};
use palisade_core::lock::BoxFuture;
use palisade_core::{FencedLease, FencedLocks, LockError, LockOptions};
use palisade_faultproxy::FaultProxy;
use palisade_postgres::PgLocks;
use palisade_testkit::PostgresServer;

const TTL: Duration = Duration::from_secs(2);

fn now_or_never() -> LockOptions {
    LockOptions::default()
}

fn waiting(secs: u64) -> LockOptions {
    LockOptions {
        wait: Duration::from_secs(secs),
        ..Default::default()
    }
}

/// PostgreSQL as the lock contract's suite needs it: one server (it has no
/// replicated shape here), reached directly or through the fault proxy.
struct Postgres {
    server: PostgresServer,
}

impl Fixture for Postgres {
    fn start(_replicated: bool) -> Result<Self, String> {
        let server = PostgresServer::start().map_err(|e| e.to_string())?;
        Ok(Postgres { server })
    }

    fn session(&self, ttl: Duration) -> Opening<'_, Session> {
        Box::pin(async move {
            let locks = PgLocks::connect(&self.server.url(), ttl).await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    }

    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)> {
        Box::pin(async move {
            let upstream = format!("127.0.0.1:{}", self.server.port()).parse().unwrap();
            let proxy = FaultProxy::start(upstream).await.unwrap();
            let via = format!("postgres://postgres@{}/postgres", proxy.addr());
            let locks = PgLocks::connect(&via, ttl).await?;
            let link = proxy.link().clone();
            let cut = Cut::new(move || proxy.link().partition(), move || link.heal());
            Ok((Box::new(locks) as Box<dyn FencedLocks>, cut))
        })
    }

    fn kill_and_restart(&mut self) -> Result<(), String> {
        self.server.kill9();
        self.server.restart().map_err(|e| e.to_string())
    }

    /// Waiters are woken together and race: no arrival order is promised.
    fn queued<'a>(&'a self, _name: &'a str) -> Option<BoxFuture<'a, usize>> {
        None
    }
}

palisade_core::conformance_suite!(Postgres);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_and_servers_it_cannot_serve_get_typed_errors_and_leave_nothing() {
    let pg = PostgresServer::start().unwrap();
    let locks = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let e = locks
        .acquire(
            "x",
            &LockOptions {
                lock_delay: Duration::from_secs(1),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidInput(_)), "{e:?}");
    assert!(matches!(
        PgLocks::connect("postgres://x@127.0.0.1:notaport/db", TTL)
            .await
            .err()
            .unwrap(),
        LockError::InvalidInput(_)
    ));
    let closed = palisade_testkit::free_port().unwrap();
    assert!(matches!(
        PgLocks::connect(
            &format!("postgres://postgres@127.0.0.1:{closed}/postgres"),
            TTL
        )
        .await
        .err()
        .unwrap(),
        LockError::Unavailable { .. }
    ));
    assert!(matches!(
        PgLocks::connect(
            &format!("postgres://postgres@127.0.0.1:{}/nosuchdb", pg.port()),
            TTL
        )
        .await
        .err()
        .unwrap(),
        LockError::InvalidInput(_)
    ));

    // A role without rights on the lock table is told so, and changes nothing.
    let (admin, conn) = tokio_postgres_connect(&pg.url()).await;
    admin
        .batch_execute("CREATE ROLE weak LOGIN; REVOKE ALL ON palisade_locks FROM PUBLIC")
        .await
        .unwrap();
    drop(conn);
    let weak = PgLocks::connect(
        &format!("postgres://weak@127.0.0.1:{}/postgres", pg.port()),
        TTL,
    )
    .await;
    match weak {
        Err(e) => assert!(matches!(e, LockError::PermissionDenied(_)), "{e:?}"),
        Ok(weak) => {
            let e = weak.acquire("w", &now_or_never()).await.unwrap_err();
            assert!(matches!(e, LockError::PermissionDenied(_)), "{e:?}");
        }
    }

    // A wait that runs out leaves no row behind; the holder's row is its own.
    let held = locks.acquire("busy", &now_or_never()).await.unwrap();
    let other = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let e = other
        .acquire(
            "busy",
            &LockOptions {
                wait: Duration::from_millis(300),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WaitTimeout);
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM palisade_locks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "only the holder's row");
    held.release().await.unwrap();
}

async fn tokio_postgres_connect(
    url: &str,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_adapter_takes_these_tokens_and_refuses_a_superseded_one() {
    let pg = PostgresServer::start().unwrap();
    let locks = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let (mut db, _conn) = tokio_postgres_connect(&pg.url()).await;
    palisade_fence::postgres::ensure_schema(&db).await.unwrap();
    let old = locks.acquire("ledger", &now_or_never()).await.unwrap();
    let old_token = old.token();
    old.release().await.unwrap();
    let new = locks.acquire("ledger", &now_or_never()).await.unwrap();
    let write =
        async |_: &tokio_postgres::Transaction<'_>, _| Ok::<_, std::convert::Infallible>(());
    palisade_fence::postgres::fenced_write(&mut db, "ledger", new.token(), write)
        .await
        .expect("the current holder's write");
    let stale = palisade_fence::postgres::fenced_write(&mut db, "ledger", old_token, write).await;
    assert!(
        matches!(
            stale,
            Err(palisade_fence::postgres::PgFenceError::StaleToken { .. })
        ),
        "{stale:?}"
    );
}

/// A grant whose answer arrives after its guarantee ran out (here: every packet
/// held 300 ms, the TTL 100 ms) is given back and refused, never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_guarantee_is_given_back() {
    let pg = PostgresServer::start().unwrap();
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap())
        .await
        .unwrap();
    let via_proxy = format!("postgres://postgres@{}/postgres", proxy.addr());
    let slow = PgLocks::connect(&via_proxy, Duration::from_millis(100))
        .await
        .unwrap();
    proxy.link().set_delay(Duration::from_millis(300));
    let e = slow.acquire("late", &now_or_never()).await.unwrap_err();
    assert_eq!(e, LockError::GrantTooLate);
    // Nothing was left behind: the lock is free for the next client at once.
    let other = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    other.acquire("late", &now_or_never()).await.unwrap();
}

/// A waiter marks the held row `waited`; the release of a waited row sends
/// `NOTIFY palisade_locks` with the lock's name (seen here by a connection of
/// our own that LISTENs), and the waiter is granted. A waiter with
/// `palisade_wait=poll` marks nothing and still gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notifies_the_waiters_of_its_lock() {
    let pg = PostgresServer::start().unwrap();
    let a = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let b = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let (listener, mut connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut notified) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", palisade_postgres::CHANNEL))
        .await
        .unwrap();
    let waited = || async {
        listener
            .query_opt("SELECT waited FROM palisade_locks WHERE name = 'n'", &[])
            .await
            .unwrap()
            .is_some_and(|r| r.get::<_, bool>(0))
    };

    let held = a.acquire("n", &now_or_never()).await.unwrap();
    assert!(!waited().await, "nobody waits yet");
    let first = held.token();
    let waiter = tokio::spawn(async move { b.acquire("n", &waiting(60)).await.map(|l| l.token()) });
    let start = Instant::now();
    while !waited().await {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the waiter never marked the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    let payload = tokio::time::timeout(Duration::from_secs(60), notified.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(payload, "n");
    assert!(waiter.await.unwrap().unwrap() > first);

    // Polling only: nothing is marked, the lock still changes hands.
    let poll = PgLocks::connect(&format!("{}?palisade_wait=poll", pg.url()), TTL)
        .await
        .unwrap();
    let held = a.acquire("p", &now_or_never()).await.unwrap();
    let waiter =
        tokio::spawn(async move { poll.acquire("p", &waiting(60)).await.map(|l| l.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marked: bool = listener
        .query_one("SELECT waited FROM palisade_locks WHERE name = 'p'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!marked, "a polling waiter marks nothing");
    let first = held.token();
    held.release().await.unwrap();
    assert!(waiter.await.unwrap().unwrap() > first);
}

/// A table made by an earlier version (no `waited` column) gains it on the
/// first connect, and its locks go on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_an_earlier_version_is_upgraded() {
    let pg = PostgresServer::start().unwrap();
    let (admin, _conn) = tokio_postgres_connect(&pg.url()).await;
    admin
        .batch_execute(
            "CREATE SEQUENCE palisade_lock_token;
             CREATE TABLE palisade_locks (name text PRIMARY KEY, holder text NOT NULL,
                 token bigint NOT NULL CHECK (token > 0), expires_at timestamptz NOT NULL)",
        )
        .await
        .unwrap();
    let locks = PgLocks::connect(&pg.url(), TTL).await.unwrap();
    let has_column: bool = admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'palisade_locks'::regclass AND attname = 'waited')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(has_column);
    let lease = locks.acquire("old", &now_or_never()).await.unwrap();
    lease.release().await.unwrap();
    // A second connect finds it there and changes nothing.
    PgLocks::connect(&pg.url(), TTL).await.unwrap();
}
