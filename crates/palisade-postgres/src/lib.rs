//! Correctness locks in PostgreSQL, behind [`FencedLocks`]: for teams whose
//! "database with transactional guarantees" (the essay's words) is PostgreSQL.
//!
//! # Design
//! One row per held lock in `palisade_locks` ([`SCHEMA`]): the holder (128
//! random bits per session, then 128 per grant), the fencing token, and
//! `expires_at`.
//!
//! - **Grant**: one statement, one transaction — insert the row, or take over a
//!   row whose `expires_at` has passed, with `token = nextval(...)` of the
//!   sequence `palisade_lock_token`. The token is written in the same transaction
//!   as the grant, so the commit that makes the grant durable also makes the
//!   sequence's advance durable: after a crash the sequence resumes above every
//!   token a committed grant carried, and a token is never issued twice. A
//!   take-over also requires the new token to be higher than the row's, so two
//!   racing grants cannot install a lower token after a higher one.
//! - **What ends a hold** is decided by the database: the row is deleted by the
//!   holder's release, or, once the *database server's* `clock_timestamp()` has
//!   passed `expires_at`, the next grant takes the row over. Keep-alives move
//!   `expires_at` to `clock_timestamp() + TTL` and never revive a row that has
//!   already expired. Nothing is decided by this client's clock.
//! - **What the client knows**: [`FencedLease::remaining`] counts from the moment
//!   the last successful grant or keep-alive was *sent*, on this process's
//!   monotonic clock, minus a safety margin. That ends before `expires_at` as
//!   long as the database server's clock runs at the normal rate. **Clock
//!   caveat**: a forward jump of the database server's wall clock ends holds
//!   early (the next grant sees them as expired); a holder may then still believe
//!   it holds the lock. The fencing token is what keeps its late writes out: the
//!   resource must check it (the `palisade-fence` PostgreSQL adapter accepts
//!   these tokens as they are).
//! - **Waiting** is woken by the release: a waiter whose attempt failed marks
//!   the row `waited`, and a release (or a close) of a `waited` row deletes it
//!   and sends `NOTIFY palisade_locks, 'NAME'` in the same statement, so the
//!   notification goes out when the row is gone, and every connection that
//!   `LISTEN`s ([`CHANNEL`]) wakes its waiters for that name, who try again at
//!   once. A release nobody waits for sends nothing (a notifying commit takes
//!   a database-wide lock in PostgreSQL, which uncontended locks should not
//!   pay). If the row is gone by the time the waiter marks it, the waiter tries
//!   again at once. A hold that *expires* sends nothing (nobody commits at expiry), so
//!   waiters also poll with a bounded, jittered backoff (10 ms doubling to
//!   250 ms); with `palisade_wait=poll` in the URL (for a pooler that cannot
//!   `LISTEN`, such as PgBouncer in transaction mode) they only poll. A waiter
//!   subscribes before its first attempt, so a release between its attempt and
//!   its wait still wakes it. A waiter leaves nothing in the database.
//! - **Closing** the session ([`FencedLocks::close`]) first ends every live
//!   lease's guarantee, then deletes every row the session holds.
//! - No lock-delay: a non-zero [`LockOptions::lock_delay`] is refused.
//! - **TLS** in libpq's words in the URL: `sslmode=verify-full&sslrootcert=CA`
//!   (the server's certificate must chain to CA and name the host), and
//!   `sslcert=FILE&sslkey=FILE` to authenticate by client certificate
//!   (PostgreSQL's `cert` method in `pg_hba.conf`). Modes that would not check
//!   the server's name (`require`, `verify-ca`, `prefer`, `allow`) are refused;
//!   without TLS options the connection is plaintext (`sslmode=disable`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::backend::{Descriptor, Facts, Scheme};
use palisade_core::guarantee::Guarantee;
use palisade_core::lock::BoxFuture;
use palisade_core::{
    FencedLease, FencedLocks, FencingToken, GuaranteedLease, LockError, LockOptions,
};
use tokio::sync::broadcast;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// The backend's name in errors and URLs.
pub const BACKEND: &str = "postgres";

/// The schema the locks live in. Idempotent; [`PgLocks::connect`] runs it.
pub const SCHEMA: &str = "
CREATE SEQUENCE IF NOT EXISTS palisade_lock_token;
CREATE TABLE IF NOT EXISTS palisade_locks (
    name text PRIMARY KEY,
    holder text NOT NULL,
    token bigint NOT NULL CHECK (token > 0),
    expires_at timestamptz NOT NULL,
    waited boolean NOT NULL DEFAULT false
);
-- Tables of earlier versions lack `waited`; ALTER only then, since it takes
-- the table's strongest lock even when there is nothing to add.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'palisade_locks'::regclass
                     AND attname = 'waited' AND NOT attisdropped) THEN
        ALTER TABLE palisade_locks ADD COLUMN waited boolean NOT NULL DEFAULT false;
    END IF;
END $$";

/// Grants `$1` to holder `$2` for `$3` ms if it is free or its holder expired.
const GRANT: &str = "
INSERT INTO palisade_locks AS l (name, holder, token, expires_at)
VALUES ($1, $2, nextval('palisade_lock_token'), clock_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE
    SET holder = EXCLUDED.holder, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at < clock_timestamp() AND l.token < EXCLUDED.token
RETURNING token";

/// Moves the deadline of a hold that has not expired.
const KEEP_ALIVE: &str = "
UPDATE palisade_locks
    SET expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
    WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > clock_timestamp()";

/// The channel a release notifies, with the lock's name as the payload.
pub const CHANNEL: &str = "palisade_locks";

/// Makes sure the release of a held lock will notify: true if the row was
/// already marked `waited` when this statement began, or this statement marked
/// it; false if it is gone (released meanwhile: try again). Only the first
/// waiter of a hold writes.
const WAITING: &str = "
WITH seen AS (SELECT waited FROM palisade_locks WHERE name = $1),
marked AS (UPDATE palisade_locks SET waited = true WHERE name = $1 AND NOT waited RETURNING 1)
SELECT coalesce((SELECT bool_or(waited) FROM seen), false) OR EXISTS (SELECT 1 FROM marked)";

/// Ends every hold of one session (`$1`: `SESSION-%`), waking the waiters of
/// those that have some.
const CLOSE: &str = "
WITH gone AS (DELETE FROM palisade_locks WHERE holder LIKE $1 RETURNING name, waited),
woken AS (SELECT pg_notify('palisade_locks', name) FROM gone WHERE waited)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM woken)";

/// Ends a hold (only this grant's), waking its waiters if it has some: how
/// many rows it deleted (one if it did).
const RELEASE: &str = "
WITH gone AS (DELETE FROM palisade_locks WHERE name = $1 AND holder = $2 AND token = $3 RETURNING name, waited),
woken AS (SELECT pg_notify('palisade_locks', name) FROM gone WHERE waited)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM woken)";

/// The URL parameter that chooses how waiters wait (`notify`, the default, or
/// `poll`); Palisade's own, taken out before the URL reaches the driver.
pub const WAIT_PARAMETER: &str = "palisade_wait";

/// What Palisade reads from a PostgreSQL URL itself, before the driver gets
/// the rest: how waiters wait, and TLS in libpq's words (`sslmode=verify-full`
/// with `sslrootcert`, and `sslcert`/`sslkey` to authenticate by
/// certificate).
#[derive(Debug, PartialEq, Eq)]
struct UrlOptions {
    /// The URL the driver gets.
    url: String,
    /// Whether waiters listen for releases.
    listen: bool,
    /// TLS: the CA file, and the client certificate and key files.
    tls: Option<(String, Option<(String, String)>)>,
}

impl UrlOptions {
    fn parse(url: &str) -> Result<UrlOptions, LockError> {
        let bad = |why: String| LockError::InvalidInput(format!("postgres URL: {why}"));
        let Some((base, query)) = url.split_once('?') else {
            return Ok(UrlOptions {
                url: url.to_owned(),
                listen: true,
                tls: None,
            });
        };
        let (mut listen, mut mode, mut root, mut cert, mut key) = (true, None, None, None, None);
        let mut rest = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some((WAIT_PARAMETER, "notify")) => listen = true,
                Some((WAIT_PARAMETER, "poll")) => listen = false,
                Some((WAIT_PARAMETER, other)) => {
                    return Err(bad(format!(
                        "{WAIT_PARAMETER}={other:?} (expected notify or poll)"
                    )));
                }
                Some(("sslmode", m)) => mode = Some(m.to_owned()),
                Some(("sslrootcert", v)) => root = Some(v.to_owned()),
                Some(("sslcert", v)) => cert = Some(v.to_owned()),
                Some(("sslkey", v)) => key = Some(v.to_owned()),
                _ => rest.push(pair.to_owned()),
            }
        }
        let tls = match (mode.as_deref(), root) {
            (Some("verify-full"), Some(root)) => {
                let identity = match (cert, key) {
                    (Some(c), Some(k)) => Some((c, k)),
                    (None, None) => None,
                    _ => return Err(bad("sslcert and sslkey go together".into())),
                };
                Some((root, identity))
            }
            (Some("verify-full"), None) => {
                return Err(bad(
                    "sslmode=verify-full needs sslrootcert (the server's CA)".into(),
                ));
            }
            (Some(m @ ("require" | "verify-ca" | "prefer" | "allow")), _) => {
                return Err(bad(format!(
                    "sslmode={m} would not check the server's name; use sslmode=verify-full with \
                     sslrootcert, or sslmode=disable"
                )));
            }
            (Some("disable") | None, None) if cert.is_none() && key.is_none() => {
                if mode.is_some() {
                    rest.push("sslmode=disable".into());
                }
                None
            }
            (None, None) => {
                return Err(bad("sslcert and sslkey need sslmode=verify-full".into()));
            }
            (Some(m), _) => return Err(bad(format!("sslmode={m:?} with these options"))),
            (None, Some(_)) => {
                return Err(bad("sslrootcert needs sslmode=verify-full".into()));
            }
        };
        let url = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        Ok(UrlOptions { url, listen, tls })
    }

    /// The rustls connector for [`UrlOptions::tls`].
    fn connector(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, LockError> {
        let Some((root, identity)) = &self.tls else {
            return Ok(None);
        };
        let read = |path: &str| {
            std::fs::read(path)
                .map_err(|e| LockError::InvalidInput(format!("postgres TLS: {path}: {e}")))
        };
        let ca = read(root)?;
        let identity = match identity {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        let config = palisade_proto::h2_channel::client_config(
            &ca,
            identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
            &[],
        )
        .map_err(|e| LockError::InvalidInput(format!("postgres TLS: {e}")))?;
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }
}

fn unavailable(detail: impl std::fmt::Display) -> LockError {
    LockError::Unavailable {
        backend: BACKEND,
        detail: detail.to_string(),
        why: palisade_core::Unreachable::Unknown,
    }
}

/// Maps a database error to the lock API's: credentials and rights are not
/// retryable, the rest is "unavailable".
fn pg_error(e: tokio_postgres::Error) -> LockError {
    match e.code() {
        Some(c)
            if *c == SqlState::INVALID_PASSWORD
                || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            LockError::Unauthenticated(format!(
                "postgres: {}",
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned())
            ))
        }
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => LockError::PermissionDenied(format!(
            "postgres: {e} (the role needs CREATE on the schema the first time, then \
             SELECT/INSERT/UPDATE/DELETE on palisade_locks and USAGE on palisade_lock_token)"
        )),
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => {
            LockError::InvalidInput(format!("postgres: {e}"))
        }
        _ => match e.as_db_error() {
            Some(db) => unavailable(db.message()),
            None => {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(": ");
                    text.push_str(&s.to_string());
                    source = s.source();
                }
                // A server certificate we do not trust fails the same way on
                // every try: not "unavailable", which callers retry. rustls'
                // error reaches here only as text.
                if text.contains("invalid peer certificate") {
                    LockError::Unauthenticated(format!(
                        "postgres: the server's certificate is not trusted ({text})"
                    ))
                } else {
                    unavailable(text)
                }
            }
        },
    }
}

struct Inner {
    client: Client,
    ttl: Duration,
    /// This session's prefix of every holder it writes (`SESSION-LEASE`), so
    /// that closing it can end all its holds in one statement.
    session: String,
    /// The live leases' guarantees and keep-alives, by holder: closing the
    /// session ends them before it deletes the rows.
    live:
        std::sync::Mutex<std::collections::HashMap<String, (Guarantee, tokio::task::AbortHandle)>>,
    /// The names of released locks, as the connection's notifications bring
    /// them (`None`: waiters only poll).
    released: Option<broadcast::Sender<String>>,
}

impl Inner {
    fn forget(&self, holder: &str) {
        self.live.lock().expect("poisoned").remove(holder);
    }
}

/// Correctness locks on one PostgreSQL connection. Leases share the connection;
/// each keeps itself alive.
pub struct PgLocks {
    inner: Arc<Inner>,
}

impl PgLocks {
    /// Connects to `url` (`postgres://USER@HOST:PORT/DB`, or `key=value` form),
    /// and creates the schema if it is missing. `ttl` is how long a hold outlives
    /// this process going silent.
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] for a bad URL or TTL, or a database that does
    /// not exist; [`LockError::Unauthenticated`] / [`LockError::PermissionDenied`]
    /// for a role that may not log in or create the schema;
    /// [`LockError::Unavailable`] when the server cannot be reached.
    pub async fn connect(url: &str, ttl: Duration) -> Result<PgLocks, LockError> {
        palisade_core::limits::validate_ttl(ttl)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        let options = UrlOptions::parse(url)?;
        let mut config: tokio_postgres::Config = options
            .url
            .parse()
            .map_err(|e| LockError::InvalidInput(format!("postgres URL: {e}")))?;
        let released = options.listen.then(|| broadcast::channel(1024).0);
        let client = match options.connector()? {
            None => open(&config, NoTls, released.clone()).await?,
            Some(tls) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                open(&config, tls, released.clone()).await?
            }
        };
        let listen = options.listen;
        // Two first-time clients may race to create the schema; the loser of
        // that race sees a unique violation in the catalog and simply retries.
        let mut attempts = 0;
        loop {
            match client.batch_execute(SCHEMA).await {
                Ok(()) => break,
                Err(e) if attempts < 3 && e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                    attempts += 1;
                }
                Err(e) => return Err(pg_error(e)),
            }
        }
        if listen {
            client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .map_err(pg_error)?;
        }
        Ok(PgLocks {
            inner: Arc::new(Inner {
                client,
                ttl,
                session: format!("{:032x}", rand::random::<u128>()),
                live: std::sync::Mutex::default(),
                released,
            }),
        })
    }

    async fn try_grant(&self, name: &str, holder: &str) -> Result<Option<FencingToken>, LockError> {
        let ttl_ms = self.inner.ttl.as_millis() as i64;
        let row = self
            .inner
            .client
            .query_opt(GRANT, &[&name, &holder, &ttl_ms])
            .await
            .map_err(pg_error)?;
        match row {
            None => Ok(None),
            Some(row) => {
                let token: i64 = row.get(0);
                u64::try_from(token)
                    .ok()
                    .and_then(FencingToken::new)
                    .map(Some)
                    .ok_or_else(|| unavailable(format!("the sequence returned token {token}")))
            }
        }
    }

    /// Acquires `name`; see [`FencedLocks::acquire`].
    ///
    /// # Errors
    /// [`LockError::InvalidInput`] (name, lock-delay), [`LockError::WouldBlock`],
    /// [`LockError::WaitTimeout`], [`LockError::Unavailable`].
    pub async fn acquire(&self, name: &str, options: &LockOptions) -> Result<PgLease, LockError> {
        palisade_core::limits::validate_name(name)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        if !options.lock_delay.is_zero() {
            return Err(LockError::InvalidInput(
                "the postgres backend has no lock-delay".into(),
            ));
        }
        let holder = format!("{}-{:032x}", self.inner.session, rand::random::<u128>());
        let give_up = Instant::now() + options.wait;
        let mut backoff = Duration::from_millis(10);
        // Subscribed before the first attempt: a release after it fails
        // wakes this waiter even if it comes before the wait begins.
        let mut released = self
            .inner
            .released
            .as_ref()
            .map(broadcast::Sender::subscribe);
        loop {
            let sent = Instant::now();
            if let Some(token) = self.try_grant(name, &holder).await? {
                let lease = PgLease::start(self.inner.clone(), name, holder, token, sent);
                if lease.remaining().is_zero() {
                    // The grant's answer arrived after its guarantee ran out
                    // (this process paused, or the reply was held): it may be
                    // superseded already, so it is given back, never handed out.
                    let _ = lease.release().await;
                    return Err(LockError::GrantTooLate);
                }
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= give_up {
                return Err(if options.wait.is_zero() {
                    LockError::WouldBlock
                } else {
                    LockError::WaitTimeout
                });
            }
            if released.is_some() {
                let marked: bool = self
                    .inner
                    .client
                    .query_one(WAITING, &[&name])
                    .await
                    .map_err(pg_error)?
                    .get(0);
                if !marked {
                    // Released between the attempt and the mark: no
                    // notification will come for it, so try again now.
                    continue;
                }
            }
            let jitter =
                Duration::from_millis(rand::random_range(0..=backoff.as_millis() as u64 / 2));
            let poll = tokio::time::sleep((backoff + jitter).min(give_up - now));
            match &mut released {
                Some(released) => {
                    tokio::select! {
                        () = poll => {}
                        () = released_lock(released, name) => {}
                    }
                }
                None => poll.await,
            }
            backoff = (backoff * 2).min(Duration::from_millis(250));
        }
    }
}

/// Connects with `tls` (10 s at most) and drives the connection in a task of
/// its own ([`drive`]).
async fn open<T>(
    config: &tokio_postgres::Config,
    tls: T,
    released: Option<broadcast::Sender<String>>,
) -> Result<Client, LockError>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
{
    let (client, connection) = tokio::time::timeout(Duration::from_secs(10), config.connect(tls))
        .await
        .map_err(|_| unavailable("connecting timed out after 10 s"))?
        .map_err(pg_error)?;
    tokio::spawn(drive(connection, released));
    Ok(client)
}

/// Runs a connection, handing its notifications (released locks' names) to
/// `released`. Driving it by hand, rather than awaiting it, is what hands them
/// over.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    released: Option<broadcast::Sender<String>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
        match message {
            Ok(AsyncMessage::Notification(n)) => {
                if let Some(tx) = &released {
                    // No waiter listening is no error.
                    let _ = tx.send(n.payload().to_owned());
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "postgres connection ended");
                break;
            }
        }
    }
}

/// Returns once `name` is released (or a notification may have been missed:
/// the receiver lagged); never, once the connection has ended.
async fn released_lock(released: &mut broadcast::Receiver<String>, name: &str) {
    loop {
        match released.recv().await {
            Ok(released) if released == name => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

impl FencedLocks for PgLocks {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>> {
        Box::pin(async move {
            options.plain_lock_only(BACKEND)?;
            let lease = PgLocks::acquire(self, name, options).await?;
            Ok(Box::new(lease) as Box<dyn FencedLease>)
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            // First every lease stops claiming its hold, then the rows go: never
            // the other way round, or a lease could look held after another
            // client was granted its lock.
            let live = std::mem::take(&mut *self.inner.live.lock().expect("poisoned"));
            for (guarantee, keep_alive) in live.values() {
                keep_alive.abort();
                guarantee.end();
            }
            // Hex digits and '-' are not LIKE wildcards.
            let pattern = format!("{}-%", self.inner.session);
            self.inner
                .client
                .query(CLOSE, &[&pattern])
                .await
                .map(|_| ())
                .map_err(pg_error)
        })
    }
}

/// One hold of a PostgreSQL lock. Dropping it releases the lock in the
/// background (best effort).
pub struct PgLease {
    inner: Arc<Inner>,
    name: String,
    holder: String,
    token: FencingToken,
    guarantee: Guarantee,
    keep_alive: tokio::task::AbortHandle,
    released: bool,
}

impl PgLease {
    fn start(
        inner: Arc<Inner>,
        name: &str,
        holder: String,
        token: FencingToken,
        sent: Instant,
    ) -> Self {
        let guarantee = Guarantee::new(sent, inner.ttl);
        let task = tokio::spawn(keep_alive(
            inner.clone(),
            name.to_owned(),
            holder.clone(),
            token,
            guarantee.clone(),
        ));
        inner
            .live
            .lock()
            .expect("poisoned")
            .insert(holder.clone(), (guarantee.clone(), task.abort_handle()));
        PgLease {
            inner,
            name: name.to_owned(),
            holder,
            token,
            guarantee,
            keep_alive: task.abort_handle(),
            released: false,
        }
    }

    /// Releases the hold.
    ///
    /// # Errors
    /// [`LockError::NotHolder`] when the hold had already ended (expired and
    /// perhaps granted again); [`LockError::Unavailable`].
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        self.keep_alive.abort();
        self.guarantee.end();
        self.inner.forget(&self.holder);
        release(&self.inner, &self.name, &self.holder, self.token).await
    }
}

async fn release(
    inner: &Inner,
    name: &str,
    holder: &str,
    token: FencingToken,
) -> Result<(), LockError> {
    let token = token.get() as i64;
    let deleted: i64 = inner
        .client
        .query_one(RELEASE, &[&name, &holder, &token])
        .await
        .map_err(pg_error)?
        .get(0);
    if deleted == 1 {
        Ok(())
    } else {
        Err(LockError::NotHolder(format!(
            "the hold on {name:?} had already ended (expired, perhaps granted again)"
        )))
    }
}

/// Moves the deadline every third of the TTL (sooner after a failure) until the
/// hold ends; marks the lease lost when the database says it has expired.
async fn keep_alive(
    inner: Arc<Inner>,
    name: String,
    holder: String,
    token: FencingToken,
    guarantee: Guarantee,
) {
    let every = inner.ttl / 3;
    let (ttl_ms, token_i64) = (inner.ttl.as_millis() as i64, token.get() as i64);
    let mut pause = every;
    loop {
        tokio::time::sleep(pause).await;
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            every.max(Duration::from_millis(10)),
            inner
                .client
                .execute(KEEP_ALIVE, &[&name, &holder, &token_i64, &ttl_ms]),
        )
        .await;
        match attempt {
            Ok(Ok(1)) => {
                guarantee.renewed(sent);
                pause = every;
            }
            Ok(Ok(_)) => {
                tracing::warn!(name, "postgres lock expired before its keep-alive");
                guarantee.end();
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(name, error = %e, "keep-alive failed; retrying");
                pause = Duration::from_millis(100).min(every);
            }
            Err(_) => {
                tracing::debug!(name, "keep-alive timed out; retrying");
                pause = Duration::from_millis(100).min(every);
            }
        }
        if guarantee.remaining().is_zero() {
            // The guarantee ran out while the database could not be reached: the
            // hold may have been taken over. Stop pretending.
            return;
        }
    }
}

impl GuaranteedLease for PgLease {
    fn lock_name(&self) -> &str {
        &self.name
    }

    fn fencing_token(&self) -> FencingToken {
        self.token
    }

    fn guarantee(&self) -> &Guarantee {
        &self.guarantee
    }

    fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move { (*self).release().await })
    }
}

impl Drop for PgLease {
    fn drop(&mut self) {
        self.keep_alive.abort();
        self.inner.forget(&self.holder);
        if self.released {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (inner, name, holder, token) = (
                self.inner.clone(),
                std::mem::take(&mut self.name),
                std::mem::take(&mut self.holder),
                self.token,
            );
            rt.spawn(async move {
                let _ = release(&inner, &name, &holder, token).await;
            });
        }
    }
}

impl std::fmt::Debug for PgLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLease")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// The PostgreSQL backend, as the registry in `palisade-backends` lists it.
pub static DESCRIPTOR: Descriptor = Descriptor {
    name: BACKEND,
    schemes: &[
        Scheme {
            scheme: "postgres",
            shape: "postgres://USER@HOST:PORT/DB",
        },
        Scheme {
            scheme: "postgresql",
            shape: "postgresql://USER@HOST:PORT/DB",
        },
    ],
    facts: Facts {
        title: "PostgreSQL (a row per hold)",
        lease_on: "the database's clock_timestamp() (its wall clock): a clock jump on the \
                   database host can end leases early or late",
        token: "a sequence advanced in the granting transaction",
        clocks: "yes for leases (the database's wall clock); no for tokens",
    },
    connect: |scheme, rest, session| {
        Box::pin(async move {
            if session.tls.is_some() || session.bearer_token.is_some() {
                return Err(LockError::InvalidInput(
                    "the postgres backend takes its credentials in the URL; \
                     --ca/--cert/--token-file are for palisade://"
                        .into(),
                ));
            }
            let locks = PgLocks::connect(&format!("{scheme}://{rest}"), session.ttl).await?;
            Ok(Box::new(locks) as Box<dyn FencedLocks>)
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn palisade_reads_its_own_url_options_and_passes_the_rest() {
        let ok = |url: &str| UrlOptions::parse(url).unwrap();
        let plain = ok("postgres://u@h/db");
        assert_eq!(
            (plain.url.as_str(), plain.listen, plain.tls),
            ("postgres://u@h/db", true, None)
        );
        let poll = ok("postgres://u@h/db?palisade_wait=poll");
        assert_eq!(
            (poll.url.as_str(), poll.listen),
            ("postgres://u@h/db", false)
        );
        let mixed = ok("postgres://u@h/db?application_name=x&palisade_wait=notify&sslmode=disable");
        assert_eq!(
            mixed.url,
            "postgres://u@h/db?application_name=x&sslmode=disable"
        );
        let tls = ok(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=ca.pem&sslcert=c.pem&sslkey=k.pem",
        );
        assert_eq!(tls.url, "postgres://u@h/db");
        assert_eq!(
            tls.tls,
            Some(("ca.pem".into(), Some(("c.pem".into(), "k.pem".into()))))
        );
        for bad in [
            "postgres://u@h/db?palisade_wait=sometimes",
            "postgres://u@h/db?sslmode=require",
            "postgres://u@h/db?sslmode=verify-ca&sslrootcert=ca.pem",
            "postgres://u@h/db?sslmode=verify-full",
            "postgres://u@h/db?sslrootcert=ca.pem",
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=ca.pem&sslcert=c.pem",
            "postgres://u@h/db?sslcert=c.pem&sslkey=k.pem",
        ] {
            assert!(
                matches!(UrlOptions::parse(bad), Err(LockError::InvalidInput(_))),
                "{bad}"
            );
        }
    }
}
