//! The durable fence: tokens kept in a redb database, committed in the same write
//! transaction as the write they protect.

use std::path::Path;
use std::sync::Arc;

use palisade_core::FencingToken;
use redb::{Database, Durability, ReadableTable, TableDefinition, WriteTransaction};

use crate::fence::{Admitted, FenceError, Fencing, TokenFence, decide};
use crate::resource::validate_resource;

/// The table of highest accepted tokens: resource name → token.
const TOKENS: TableDefinition<&str, u64> = TableDefinition::new("palisade_fence_tokens");

/// The highest token of a shared read per resource (a reader of a read/write
/// lock): a write below it is refused, since a writer's token is above every
/// reader's granted before it. Kept apart from [`TOKENS`] so that readers
/// holding together, with different tokens, do not refuse each other.
const READ_MARKS: TableDefinition<&str, u64> = TableDefinition::new("palisade_fence_read_marks");

/// The durable store failed, or holds something it should not.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb reported an error (I/O, a database already open, corruption…).
    // Boxed: redb's error is large, and every fence result carries this type.
    #[error("fence store: {0}")]
    Redb(Box<redb::Error>),
    /// The database holds a value no fence writes (a token of 0, say).
    #[error("fence store is corrupt: {0}")]
    Corrupt(String),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Redb(Box::new(e.into()))
            }
        }
        impl From<$t> for FenceError {
            fn from(e: $t) -> Self {
                FenceError::Storage(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        StoreError::Redb(Box::new(e))
    }
}

impl From<redb::Error> for FenceError {
    fn from(e: redb::Error) -> Self {
        FenceError::Storage(e.into())
    }
}

pub(crate) fn token_from_db(resource: &str, raw: u64) -> Result<FencingToken, StoreError> {
    FencingToken::new(raw)
        .ok_or_else(|| StoreError::Corrupt(format!("token 0 recorded for {resource:?}")))
}

/// A fence whose tokens live in a redb database file and commit together with the
/// protected write.
///
/// [`DurableFence::admit_with`] opens one redb write transaction, checks and
/// advances the resource's token in it, runs the caller's write in it, and
/// commits with [`Durability::Immediate`] (fsync) before returning. So either the
/// token and the write are both on disk, or neither is: after a crash the resource
/// can neither hold data newer than its token nor a token without its data.
///
/// redb runs one write transaction at a time, which is what makes the check and the
/// write atomic; the price is that all resources of one database share that single
/// writer, one fsync per write. The database file is locked while open: one
/// `DurableFence` per file per process, and not shared between processes. Cheap to
/// clone (the clones share the database).
#[derive(Clone)]
pub struct DurableFence {
    db: Arc<Database>,
}

impl std::fmt::Debug for DurableFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableFence").finish_non_exhaustive()
    }
}

impl DurableFence {
    /// Opens the database file at `path`, creating it if missing.
    ///
    /// # Errors
    /// [`FenceError::Storage`]: the file cannot be created or read, is not a redb
    /// database, or is already open.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, FenceError> {
        let db = Database::create(path)?;
        // Create the table now, so that readers never find it missing.
        let txn = db.begin_write()?;
        txn.open_table(TOKENS)?;
        txn.open_table(READ_MARKS)?;
        txn.commit()?;
        Ok(Self { db: Arc::new(db) })
    }

    /// The database, for reading the tables the protected writes fill.
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Admits `token` for `resource` and runs `write` in the same redb write
    /// transaction, then commits both with an fsync. `write` runs only if the token
    /// is admitted; if it fails, nothing is committed — not even the token.
    ///
    /// `E` is the caller's error type; it must absorb [`FenceError`] (a stale token,
    /// a bad name, a storage failure), and redb's errors convert into `FenceError`.
    ///
    /// # Errors
    /// `FenceError::StaleToken` (converted into `E`) for a lower token, any error
    /// `write` returns, and storage errors.
    pub fn admit_with<T, E>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce(&WriteTransaction, &Admitted) -> Result<T, E>,
    ) -> Result<(Admitted, T), E>
    where
        E: From<FenceError>,
    {
        self.write_with(resource, token, Fencing::On, write)
    }

    /// Like [`DurableFence::admit_with`] with a choice of [`Fencing`]. With
    /// [`Fencing::Off`] every write is committed; the recorded highest token never
    /// goes down either way.
    ///
    /// # Errors
    /// As [`DurableFence::admit_with`].
    pub fn write_with<T, E>(
        &self,
        resource: &str,
        token: FencingToken,
        fencing: Fencing,
        write: impl FnOnce(&WriteTransaction, &Admitted) -> Result<T, E>,
    ) -> Result<(Admitted, T), E>
    where
        E: From<FenceError>,
    {
        let txn = self.begin(resource)?;
        let admitted = {
            let mark = stored_token(&txn, READ_MARKS, resource)?;
            let mut tokens = txn.open_table(TOKENS).map_err(FenceError::from)?;
            let previous = match tokens.get(resource).map_err(FenceError::from)? {
                Some(raw) => Some(token_from_db(resource, raw.value()).map_err(FenceError::from)?),
                None => None,
            };
            // Below a shared read is as stale as below a write.
            // A stale token returns here; dropping `txn` aborts it, writing nothing.
            let admitted = decide(previous.max(mark), token, fencing)?;
            let highest = previous.map_or(token, |p| p.max(token));
            tokens
                .insert(resource, highest.get())
                .map_err(FenceError::from)?;
            admitted
        };
        let out = write(&txn, &admitted)?;
        txn.commit().map_err(FenceError::from)?;
        Ok((admitted, out))
    }
}

impl DurableFence {
    /// A write transaction on `resource` (its name checked), committed with
    /// an fsync: every decision of the fence is durable before it is answered.
    fn begin(&self, resource: &str) -> Result<WriteTransaction, FenceError> {
        validate_resource(resource)?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate);
        Ok(txn)
    }

    /// A shared read (a reader of a read/write lock): admits `token` for
    /// `resource` if no write under a higher token was accepted, raises the
    /// resource's read mark to it so that no write below it lands afterwards,
    /// and runs `read` in the same transaction, committed with an fsync (the
    /// mark must outlive a crash). Unlike a write, it does not raise the fence
    /// the other readers are checked against: readers holding together with
    /// different tokens all read.
    ///
    /// # Errors
    /// `FenceError::StaleToken` for a token below an accepted write's (never
    /// with [`Fencing::Off`]), any error `read` returns, and storage errors.
    pub fn read_shared_with<T, E>(
        &self,
        resource: &str,
        token: FencingToken,
        fencing: Fencing,
        read: impl FnOnce(&WriteTransaction) -> Result<T, E>,
    ) -> Result<(Admitted, T), E>
    where
        E: From<FenceError>,
    {
        let txn = self.begin(resource)?;
        let written = stored_token(&txn, TOKENS, resource)?;
        let admitted = decide(written, token, fencing)?;
        {
            let mark = stored_token(&txn, READ_MARKS, resource)?;
            let mut marks = txn.open_table(READ_MARKS).map_err(FenceError::from)?;
            let raised = mark.map_or(token, |m| m.max(token));
            marks
                .insert(resource, raised.get())
                .map_err(FenceError::from)?;
        }
        let out = read(&txn)?;
        txn.commit().map_err(FenceError::from)?;
        Ok((admitted, out))
    }
}

/// The token `table` holds for `resource`, if any.
fn stored_token(
    txn: &WriteTransaction,
    table: TableDefinition<&str, u64>,
    resource: &str,
) -> Result<Option<FencingToken>, FenceError> {
    let table = txn.open_table(table)?;
    let raw = table.get(resource)?.map(|g| g.value());
    Ok(raw.map(|r| token_from_db(resource, r)).transpose()?)
}

impl TokenFence for DurableFence {
    fn admit(&self, resource: &str, token: FencingToken) -> Result<Admitted, FenceError> {
        self.admit_with(resource, token, |_, _| Ok::<_, FenceError>(()))
            .map(|(a, ())| a)
    }

    fn highest(&self, resource: &str) -> Result<Option<FencingToken>, FenceError> {
        validate_resource(resource)?;
        let txn = self.db.begin_read()?;
        let tokens = txn.open_table(TOKENS)?;
        let raw = tokens.get(resource)?.map(|g| g.value());
        Ok(raw.map(|r| token_from_db(resource, r)).transpose()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: TableDefinition<&str, &str> = TableDefinition::new("test_data");

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    fn read(fence: &DurableFence, key: &str) -> Option<String> {
        let txn = fence.database().begin_read().unwrap();
        let table = txn.open_table(DATA).ok()?;
        table.get(key).unwrap().map(|v| v.value().to_owned())
    }

    fn put(fence: &DurableFence, token: u64, value: &str) -> Result<Admitted, FenceError> {
        fence
            .admit_with("doc", t(token), |txn, _| {
                txn.open_table(DATA)?.insert("doc", value)?;
                Ok::<_, FenceError>(())
            })
            .map(|(a, ())| a)
    }

    #[test]
    fn data_and_token_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.redb");
        {
            let fence = DurableFence::open(&path).unwrap();
            put(&fence, 34, "from 34").unwrap();
            assert!(matches!(
                put(&fence, 33, "from 33"),
                Err(FenceError::StaleToken { .. })
            ));
        }
        let fence = DurableFence::open(&path).unwrap();
        assert_eq!(read(&fence, "doc").as_deref(), Some("from 34"));
        assert_eq!(fence.highest("doc").unwrap(), Some(t(34)));
        match put(&fence, 33, "from 33 again") {
            Err(FenceError::StaleToken { presented, highest }) => {
                assert_eq!((presented, highest), (t(33), t(34)));
            }
            other => panic!("expected StaleToken, got {other:?}"),
        }
        assert!(put(&fence, 34, "34 again").unwrap().is_repeat());
        assert_eq!(read(&fence, "doc").as_deref(), Some("34 again"));
    }

    #[test]
    fn a_failed_write_commits_no_token() {
        #[derive(Debug)]
        enum AppError {
            Fence,
            Refused,
        }
        impl From<FenceError> for AppError {
            fn from(_: FenceError) -> Self {
                AppError::Fence
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let fence = DurableFence::open(dir.path().join("f.redb")).unwrap();
        fence.admit("doc", t(5)).unwrap();
        let r = fence.admit_with("doc", t(9), |_, _| Err::<(), _>(AppError::Refused));
        assert!(matches!(r, Err(AppError::Refused)));
        assert_eq!(fence.highest("doc").unwrap(), Some(t(5)));
        let r = fence.admit_with("doc", t(4), |_, _| Ok::<_, AppError>(()));
        assert!(matches!(r, Err(AppError::Fence)));
    }

    #[test]
    fn the_file_is_locked_while_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.redb");
        let _fence = DurableFence::open(&path).unwrap();
        assert!(matches!(
            DurableFence::open(&path),
            Err(FenceError::Storage(_))
        ));
    }
}
