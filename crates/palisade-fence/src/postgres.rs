//! Fencing for data in PostgreSQL: the token check-and-advance and the caller's
//! write commit in one transaction.
//!
//! The highest token per resource lives in the table [`SCHEMA`] creates. Within a
//! transaction, [`check_and_advance`] locks the resource's row (creating it if
//! needed), compares, and advances it; the lock is held until the transaction ends,
//! so fenced writers to one resource run one after another in token order, and a
//! stale one changes nothing. [`fenced_write`] wraps the whole transaction.
//!
//! Limits: tokens are stored as `bigint`, so a token above `i64::MAX` is refused
//! ([`PgFenceError::TokenOutOfRange`]). The guarantee covers only writes made
//! through the fence; a writer that bypasses it is not stopped. At `REPEATABLE
//! READ` or `SERIALIZABLE`, two concurrent fenced writers to one resource end in a
//! serialization failure for one of them (a [`PgFenceError::Postgres`] to retry)
//! rather than a wait.

use palisade_core::FencingToken;
use tokio_postgres::{Client, Transaction};

use crate::fence::Admitted;
use crate::resource::{ResourceError, validate_resource};
use crate::verify::{TokenVerifier, VerifyError};

/// The table of highest accepted tokens. Idempotent; [`ensure_schema`] runs it.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS palisade_fence (
    resource text PRIMARY KEY,
    token bigint NOT NULL CHECK (token > 0)
)";

/// Why a fenced PostgreSQL write did not happen. `E` is the error type of the
/// caller's write.
#[derive(Debug, thiserror::Error)]
pub enum PgFenceError<E = std::convert::Infallible> {
    /// The token is lower than one already accepted for the resource; the
    /// transaction was rolled back and nothing was written.
    #[error("stale fencing token {presented}: the resource has already accepted token {highest}")]
    StaleToken {
        /// The token the write presented.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },
    /// The resource name breaks the naming rules; nothing was sent.
    #[error(transparent)]
    InvalidResource(#[from] ResourceError),
    /// The token does not fit the `bigint` column; nothing was sent.
    #[error("fencing token {0} exceeds the largest PostgreSQL bigint")]
    TokenOutOfRange(FencingToken),
    /// The table holds a value no fence writes.
    #[error("palisade_fence holds token {token} for {resource:?}, which is not a fencing token")]
    Corrupt {
        /// The resource whose row is bad.
        resource: String,
        /// The value found.
        token: i64,
    },
    /// The token is above the resource's highest and the lock service did not
    /// vouch for it ([`fenced_write_verified`]); nothing was written.
    #[error(transparent)]
    NotBelieved(#[from] VerifyError),
    /// PostgreSQL reported an error; the transaction was not committed.
    #[error("postgres: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    /// The caller's write failed; the transaction (token advance included) was
    /// rolled back.
    #[error("the fenced write failed: {0}")]
    Write(#[source] E),
}

impl<E> From<tokio_postgres::Error> for PgFenceError<E> {
    fn from(e: tokio_postgres::Error) -> Self {
        PgFenceError::Postgres(e)
    }
}

impl PgFenceError {
    /// Widens an error of [`check_and_advance`] to any write error type.
    pub fn widen<E>(self) -> PgFenceError<E> {
        match self {
            PgFenceError::StaleToken { presented, highest } => {
                PgFenceError::StaleToken { presented, highest }
            }
            PgFenceError::InvalidResource(e) => PgFenceError::InvalidResource(e),
            PgFenceError::TokenOutOfRange(t) => PgFenceError::TokenOutOfRange(t),
            PgFenceError::Corrupt { resource, token } => PgFenceError::Corrupt { resource, token },
            PgFenceError::NotBelieved(e) => PgFenceError::NotBelieved(e),
            PgFenceError::Postgres(e) => PgFenceError::Postgres(e),
            PgFenceError::Write(never) => match never {},
        }
    }
}

/// Creates the `palisade_fence` table if it does not exist.
///
/// # Errors
/// Whatever PostgreSQL reports (e.g. no `CREATE` privilege).
pub async fn ensure_schema(client: &Client) -> Result<(), tokio_postgres::Error> {
    // Concurrent `CREATE TABLE IF NOT EXISTS` can still collide on the catalog's
    // unique index; a transaction-scoped advisory lock serialises them. The simple
    // query protocol runs both statements in one implicit transaction.
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_xact_lock(hashtext('palisade_fence')); {SCHEMA}"
        ))
        .await
}

fn to_db(token: FencingToken) -> Result<i64, PgFenceError> {
    i64::try_from(token.get()).map_err(|_| PgFenceError::TokenOutOfRange(token))
}

/// Checks `token` against the highest accepted for `resource` and advances it,
/// inside the caller's transaction `tx`; the resource's row stays locked until `tx`
/// ends. Call it before the protected write, in the same transaction, and commit
/// only after both. On an error, roll `tx` back (dropping it does).
///
/// # Errors
/// [`PgFenceError::StaleToken`], [`PgFenceError::InvalidResource`],
/// [`PgFenceError::TokenOutOfRange`], [`PgFenceError::Corrupt`],
/// [`PgFenceError::Postgres`].
pub async fn check_and_advance(
    tx: &Transaction<'_>,
    resource: &str,
    token: FencingToken,
) -> Result<Admitted, PgFenceError> {
    validate_resource(resource)?;
    let raw = to_db(token)?;
    // A first writer creates the row. If another transaction is creating it right
    // now, this waits for that one to end, so the SELECT below always finds a row.
    let inserted = tx
        .execute(
            "INSERT INTO palisade_fence (resource, token) VALUES ($1, $2) \
             ON CONFLICT (resource) DO NOTHING",
            &[&resource, &raw],
        )
        .await?;
    if inserted == 1 {
        return Ok(Admitted {
            token,
            previous: None,
        });
    }
    // FOR UPDATE: rows are never deleted, and the lock orders us after any writer
    // that advanced the token before us, reading its committed value.
    let row = tx
        .query_one(
            "SELECT token FROM palisade_fence WHERE resource = $1 FOR UPDATE",
            &[&resource],
        )
        .await?;
    let stored: i64 = row.get(0);
    let previous = u64::try_from(stored)
        .ok()
        .and_then(FencingToken::new)
        .ok_or_else(|| PgFenceError::Corrupt {
            resource: resource.to_owned(),
            token: stored,
        })?;
    if previous > token {
        return Err(PgFenceError::StaleToken {
            presented: token,
            highest: previous,
        });
    }
    if previous < token {
        tx.execute(
            "UPDATE palisade_fence SET token = $2 WHERE resource = $1",
            &[&resource, &raw],
        )
        .await?;
    }
    Ok(Admitted {
        token,
        previous: Some(previous),
    })
}

/// Runs `write` fenced by `token`: in one transaction, [`check_and_advance`], then
/// `write(&tx, admitted)`, then commit. Both or neither: a stale token rolls back
/// before `write` runs; a failing `write` rolls the token advance back too.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client, token: palisade_core::FencingToken)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// palisade_fence::postgres::fenced_write(client, "accounts/7", token, async |tx, _| {
///     tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 7", &[]).await
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`check_and_advance`], plus [`PgFenceError::Write`] with `write`'s error and
/// [`PgFenceError::Postgres`] if the commit fails (then neither is written).
pub async fn fenced_write<T, E, F>(
    client: &mut Client,
    resource: &str,
    token: FencingToken,
    write: F,
) -> Result<(Admitted, T), PgFenceError<E>>
where
    F: AsyncFnOnce(&Transaction<'_>, Admitted) -> Result<T, E>,
{
    validate_resource(resource)?;
    to_db(token).map_err(PgFenceError::widen)?;
    let tx = client.transaction().await?;
    let admitted = match check_and_advance(&tx, resource, token).await {
        Ok(a) => a,
        Err(e) => {
            // Best effort: the server rolls back anyway when the transaction is dropped.
            let _ = tx.rollback().await;
            return Err(e.widen());
        }
    };
    match write(&tx, admitted).await {
        Ok(out) => {
            tx.commit().await?;
            Ok((admitted, out))
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(PgFenceError::Write(e))
        }
    }
}

/// [`fenced_write`], believing a token above the resource's highest only once
/// `verifier` has it from the lock service as a grant of `lock`
/// ([`crate::verify`]: one question per new token; none for a token believed
/// before or at most the highest). The question comes before the transaction,
/// which still makes the decisive check: a token granted for the lock stays so.
///
/// # Errors
/// As [`fenced_write`], plus [`PgFenceError::NotBelieved`].
pub async fn fenced_write_verified<T, E, F>(
    client: &mut Client,
    verifier: &TokenVerifier,
    lock: &str,
    resource: &str,
    token: FencingToken,
    write: F,
) -> Result<(Admitted, T), PgFenceError<E>>
where
    F: AsyncFnOnce(&Transaction<'_>, Admitted) -> Result<T, E>,
{
    let highest = highest_token(client, resource)
        .await
        .map_err(PgFenceError::widen)?;
    if highest.is_none_or(|h| token > h) {
        verifier.verify(lock, token).await?;
    }
    fenced_write(client, resource, token, write).await
}

/// The highest token accepted for `resource`, `None` if none yet.
///
/// # Errors
/// [`PgFenceError::InvalidResource`], [`PgFenceError::Corrupt`],
/// [`PgFenceError::Postgres`].
pub async fn highest_token(
    client: &Client,
    resource: &str,
) -> Result<Option<FencingToken>, PgFenceError> {
    validate_resource(resource)?;
    let row = client
        .query_opt(
            "SELECT token FROM palisade_fence WHERE resource = $1",
            &[&resource],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let stored: i64 = row.get(0);
    u64::try_from(stored)
        .ok()
        .and_then(FencingToken::new)
        .map(Some)
        .ok_or_else(|| PgFenceError::Corrupt {
            resource: resource.to_owned(),
            token: stored,
        })
}
