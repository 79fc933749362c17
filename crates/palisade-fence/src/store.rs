//! The fenced object store: objects in redb, each fenced by its own token.

use std::path::{Path, PathBuf};

use palisade_core::FencingToken;
use redb::TableDefinition;

use crate::durable::{DurableFence, token_from_db};
use crate::fence::{Admitted, FenceError, Fencing, TokenFence};
use crate::resource::ObjectKey;

/// The objects: key → (token of the write that produced it, body).
const OBJECTS: TableDefinition<&str, (u64, &[u8])> = TableDefinition::new("palisade_objects");

/// The database file inside an object store's data directory.
pub const DB_FILE: &str = "objects.redb";

/// An object as stored: its body and the token of the write that produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The token presented by the write that produced this body.
    pub token: FencingToken,
    /// The object's bytes.
    pub body: Vec<u8>,
}

/// A durable, fenced key → bytes store, the engine of the HTTP service
/// ([`crate::http`]). Every key is its own fenced resource.
///
/// Each `put` and `delete` is one redb write transaction holding the token check,
/// the token advance and the object change, synced to disk before it returns. A
/// delete keeps the key's highest token (a tombstone), so a stale holder cannot
/// recreate the object afterwards. Blocking: call it from a blocking thread in
/// async code. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ObjectStore {
    fence: DurableFence,
    fencing: Fencing,
}

impl ObjectStore {
    /// Opens (or creates) the store in `data_dir`, creating the directory if needed.
    ///
    /// # Errors
    /// [`FenceError::Storage`] when the directory or database cannot be created or
    /// opened (another process holding it open, for one).
    pub fn open(data_dir: &Path, fencing: Fencing) -> Result<Self, FenceError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| FenceError::Storage(redb::Error::Io(e).into()))?;
        let fence = DurableFence::open(Self::db_path(data_dir))?;
        let txn = fence.database().begin_write()?;
        txn.open_table(OBJECTS)?;
        txn.commit()?;
        Ok(Self { fence, fencing })
    }

    /// The database file of a store in `data_dir`.
    pub fn db_path(data_dir: &Path) -> PathBuf {
        data_dir.join(DB_FILE)
    }

    /// Whether this store enforces fencing.
    pub fn fencing(&self) -> Fencing {
        self.fencing
    }

    /// Writes `body` at `key` if `token` is not stale, recording `token` with it.
    ///
    /// # Errors
    /// [`FenceError::StaleToken`] (nothing written; never with [`Fencing::Off`]),
    /// or [`FenceError::Storage`].
    pub fn put(
        &self,
        key: &ObjectKey,
        token: FencingToken,
        body: &[u8],
    ) -> Result<Admitted, FenceError> {
        self.fence
            .write_with(key.as_str(), token, self.fencing, |txn, admitted| {
                let mut objects = txn.open_table(OBJECTS)?;
                objects.insert(key.as_str(), (admitted.token.get(), body))?;
                Ok::<_, FenceError>(())
            })
            .map(|(a, ())| a)
    }

    /// Deletes the object at `key` if `token` is not stale; returns whether there
    /// was one. The key's highest token is kept (and advanced) even so.
    ///
    /// # Errors
    /// As [`ObjectStore::put`].
    pub fn delete(
        &self,
        key: &ObjectKey,
        token: FencingToken,
    ) -> Result<(Admitted, bool), FenceError> {
        self.fence
            .write_with(key.as_str(), token, self.fencing, |txn, _| {
                let mut objects = txn.open_table(OBJECTS)?;
                let existed = objects.remove(key.as_str())?.is_some();
                Ok::<_, FenceError>(existed)
            })
    }

    /// The object at `key`, if any.
    ///
    /// # Errors
    /// [`FenceError::Storage`].
    pub fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, FenceError> {
        let txn = self.fence.database().begin_read()?;
        let objects = txn.open_table(OBJECTS)?;
        let Some(guard) = objects.get(key.as_str())? else {
            return Ok(None);
        };
        let (raw, body) = guard.value();
        Ok(Some(StoredObject {
            token: token_from_db(key.as_str(), raw)?,
            body: body.to_vec(),
        }))
    }

    /// The highest token accepted for `key` (kept after a delete), if any.
    ///
    /// # Errors
    /// [`FenceError::Storage`].
    pub fn highest(&self, key: &ObjectKey) -> Result<Option<FencingToken>, FenceError> {
        self.fence.highest(key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> FencingToken {
        FencingToken::new(n).unwrap()
    }

    #[test]
    fn delete_keeps_a_tombstone_token() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::open(dir.path(), Fencing::On).unwrap();
        let key = ObjectKey::new("a/b").unwrap();
        store.put(&key, t(10), b"x").unwrap();
        let (_, existed) = store.delete(&key, t(11)).unwrap();
        assert!(existed);
        assert_eq!(store.get(&key).unwrap(), None);
        assert!(matches!(
            store.put(&key, t(10), b"stale"),
            Err(FenceError::StaleToken { .. })
        ));
        assert_eq!(store.get(&key).unwrap(), None);
        assert_eq!(store.highest(&key).unwrap(), Some(t(11)));
        let (_, existed) = store.delete(&key, t(11)).unwrap();
        assert!(!existed);
    }
}
