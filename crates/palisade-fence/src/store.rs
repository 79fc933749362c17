//! The fenced object store: objects in redb, each fenced by its own token.

use std::path::{Path, PathBuf};

use palisade_core::FencingToken;
use redb::{ReadableTable, TableDefinition};

use std::sync::Arc;

use crate::durable::{DurableFence, token_from_db};
use crate::fence::{Admitted, FenceError, Fencing, TokenFence};
use crate::journal::{Journal, JournalEntry, monotonic_us};
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
    journal: Option<Arc<Journal>>,
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
        Ok(Self {
            fence,
            fencing,
            journal: None,
        })
    }

    /// Records every decision on a fenced request in `journal` from now on.
    #[must_use]
    pub fn with_journal(mut self, journal: Journal) -> Self {
        self.journal = Some(Arc::new(journal));
        self
    }

    fn record(
        &self,
        op: &str,
        key: &ObjectKey,
        token: FencingToken,
        accepted: bool,
        body: Option<&[u8]>,
    ) {
        if let Some(journal) = &self.journal {
            journal.record(&JournalEntry {
                at_us: monotonic_us(),
                op: op.to_owned(),
                key: key.as_str().to_owned(),
                token: token.get(),
                accepted,
                body: body.map(|b| String::from_utf8_lossy(b).into_owned()),
            });
        }
    }

    /// Journals a refusal (a stale token) of `op`; passes the result through.
    fn note_refusal<T>(
        &self,
        op: &str,
        key: &ObjectKey,
        token: FencingToken,
        body: Option<&[u8]>,
        result: Result<T, FenceError>,
    ) -> Result<T, FenceError> {
        if let Err(FenceError::StaleToken { .. }) = &result {
            self.record(op, key, token, false, body);
        }
        result
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
        let result = self
            .fence
            .write_with(key.as_str(), token, self.fencing, |txn, admitted| {
                let mut objects = txn.open_table(OBJECTS)?;
                objects.insert(key.as_str(), (admitted.token.get(), body))?;
                // Stamped inside the transaction: one writer at a time, so the
                // journal's order is the commit order.
                self.record("put", key, token, true, Some(body));
                Ok::<_, FenceError>(())
            })
            .map(|(a, ())| a);
        self.note_refusal("put", key, token, Some(body), result)
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
        let result = self
            .fence
            .write_with(key.as_str(), token, self.fencing, |txn, _| {
                let mut objects = txn.open_table(OBJECTS)?;
                let existed = objects.remove(key.as_str())?.is_some();
                self.record("delete", key, token, true, None);
                Ok::<_, FenceError>(existed)
            });
        self.note_refusal("delete", key, token, None, result)
    }

    /// A fenced read: admits `token` for `key` (raising its fence, durably) and
    /// reads the object in the same transaction. After it, no write with a lower
    /// token can land, so a read-modify-write under the lock is not lost to a
    /// stale holder's write racing between the read and the write.
    ///
    /// # Errors
    /// [`FenceError::StaleToken`] (nothing read; never with [`Fencing::Off`]), or
    /// [`FenceError::Storage`].
    pub fn get_fenced(
        &self,
        key: &ObjectKey,
        token: FencingToken,
    ) -> Result<(Admitted, Option<StoredObject>), FenceError> {
        let result = self
            .fence
            .write_with(key.as_str(), token, self.fencing, |txn, _| {
                let object = stored_object(txn, key)?;
                self.record("read", key, token, true, None);
                Ok::<_, FenceError>(object)
            });
        self.note_refusal("read", key, token, None, result)
    }

    /// A shared fenced read, for a reader of a read/write lock: answered if no
    /// write under a higher token was accepted for `key` (the reader was not
    /// overtaken by a writer), and afterwards no write below `token` lands.
    /// Other readers, with lower or higher tokens, still read (see
    /// [`DurableFence::read_shared_with`]).
    ///
    /// # Errors
    /// [`FenceError::StaleToken`] (nothing read; never with [`Fencing::Off`]), or
    /// [`FenceError::Storage`].
    pub fn get_shared(
        &self,
        key: &ObjectKey,
        token: FencingToken,
    ) -> Result<(Admitted, Option<StoredObject>), FenceError> {
        let result = self
            .fence
            .read_shared_with(key.as_str(), token, self.fencing, |txn| {
                let object = stored_object(txn, key)?;
                self.record("read_shared", key, token, true, None);
                Ok::<_, FenceError>(object)
            });
        self.note_refusal("read_shared", key, token, None, result)
    }

    /// The object at `key`, if any.
    ///
    /// # Errors
    /// [`FenceError::Storage`].
    pub fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, FenceError> {
        let txn = self.fence.database().begin_read()?;
        object_in(&txn.open_table(OBJECTS)?, key)
    }

    /// The highest token accepted for `key` (kept after a delete), if any.
    ///
    /// # Errors
    /// [`FenceError::Storage`].
    pub fn highest(&self, key: &ObjectKey) -> Result<Option<FencingToken>, FenceError> {
        self.fence.highest(key.as_str())
    }
}

/// The object at `key` as `txn` sees it.
fn stored_object(
    txn: &redb::WriteTransaction,
    key: &ObjectKey,
) -> Result<Option<StoredObject>, FenceError> {
    object_in(&txn.open_table(OBJECTS)?, key)
}

/// The object at `key` in `objects` (read or written: one decoding for both).
fn object_in(
    objects: &impl ReadableTable<&'static str, (u64, &'static [u8])>,
    key: &ObjectKey,
) -> Result<Option<StoredObject>, FenceError> {
    let Some(guard) = objects.get(key.as_str())? else {
        return Ok(None);
    };
    let (raw, body) = guard.value();
    Ok(Some(StoredObject {
        token: token_from_db(key.as_str(), raw)?,
        body: body.to_vec(),
    }))
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

    #[test]
    fn a_fenced_read_raises_the_fence_and_is_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let journal_path = dir.path().join("journal.jsonl");
        let store = ObjectStore::open(&dir.path().join("db"), Fencing::On)
            .unwrap()
            .with_journal(Journal::open(&journal_path).unwrap());
        let key = ObjectKey::new("counter").unwrap();
        store.put(&key, t(5), b"1").unwrap();
        // The new holder (6) reads before writing; the old holder's (5) late
        // write must now fail although 6 has written nothing yet.
        let (_, object) = store.get_fenced(&key, t(6)).unwrap();
        assert_eq!(object.unwrap().body, b"1");
        assert!(matches!(
            store.put(&key, t(5), b"2"),
            Err(FenceError::StaleToken { .. })
        ));
        assert!(matches!(
            store.get_fenced(&key, t(4)),
            Err(FenceError::StaleToken { .. })
        ));
        let entries = Journal::read_all(&journal_path).unwrap();
        let summary: Vec<(&str, u64, bool)> = entries
            .iter()
            .map(|e| (e.op.as_str(), e.token, e.accepted))
            .collect();
        assert_eq!(
            summary,
            [
                ("put", 5, true),
                ("read", 6, true),
                ("put", 5, false),
                ("read", 4, false)
            ]
        );
        assert_eq!(entries[0].body.as_deref(), Some("1"));
        assert!(entries.windows(2).all(|w| w[0].at_us <= w[1].at_us));
    }

    /// The read/write lock's story: readers 7 and 9 hold together and both
    /// read; the writer (11) writes; the reader 9, paused past its TTL, comes
    /// back and is refused; a writer below a reader's mark is refused too; and
    /// the marks survive reopening the store.
    #[test]
    fn shared_reads_share_refuse_an_overtaken_reader_and_hold_off_older_writers() {
        let dir = tempfile::tempdir().unwrap();
        let key = ObjectKey::new("doc").unwrap();
        {
            let store = ObjectStore::open(dir.path(), Fencing::On).unwrap();
            store.put(&key, t(5), b"v1").unwrap();
            let (_, a) = store.get_shared(&key, t(9)).unwrap();
            let (_, b) = store.get_shared(&key, t(7)).unwrap();
            assert_eq!(a.unwrap().body, b"v1");
            assert_eq!(b.unwrap().body, b"v1", "a reader below another reads");
            // A write under 6 (granted before reader 9) lands after its read:
            // refused, so reader 9's data did not change under it.
            assert!(matches!(
                store.put(&key, t(6), b"late"),
                Err(FenceError::StaleToken { .. })
            ));
        }
        let store = ObjectStore::open(dir.path(), Fencing::On).unwrap();
        assert!(
            matches!(
                store.put(&key, t(8), b"late"),
                Err(FenceError::StaleToken { .. })
            ),
            "the read mark is durable"
        );
        store.put(&key, t(11), b"v2").unwrap();
        assert!(matches!(
            store.get_shared(&key, t(9)),
            Err(FenceError::StaleToken { presented, highest })
                if presented == t(9) && highest == t(11)
        ));
        let (_, after) = store.get_shared(&key, t(13)).unwrap();
        assert_eq!(after.unwrap().body, b"v2");
        // Fencing off (the demonstration twin): the overtaken reader reads.
        let off_dir = tempfile::tempdir().unwrap();
        let off = ObjectStore::open(off_dir.path(), Fencing::Off).unwrap();
        off.put(&key, t(11), b"v2").unwrap();
        assert!(off.get_shared(&key, t(9)).is_ok());
    }
}
