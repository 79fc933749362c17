//! The Raft log and vote, durable in redb, with group commit.
//!
//! Every write (entries, truncation, purge, vote) goes through one writer thread,
//! in order. The writer drains everything queued, applies it in ONE redb write
//! transaction and commits it (one fsync), and only then reports each append
//! complete to openraft and each vote saved. So an entry is acknowledged only once
//! it is on disk (unlike openraft's rocksdb example, which signals first), and one
//! fsync serves every grant that arrived while the previous one ran.
//!
//! The log is also kept in memory: openraft reads entries for replication right
//! after appending them, possibly before the writer has reached them. Memory is
//! bounded by snapshots: entries up to the last snapshot are purged.

// openraft's trait signatures fix `StorageError` (large) as the error type, and
// redb's error is large too; boxing them here would only add an allocation.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, RwLock, mpsc};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{LogId, OptionalSend, RaftLogId, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableTable, TableDefinition};

use crate::typ::{NodeId, TypeConfig};

type Entry = openraft::Entry<TypeConfig>;
type Result<T> = std::result::Result<T, StorageError<NodeId>>;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE_KEY: &str = "vote";
const PURGED_KEY: &str = "last_purged";
const COMMITTED_KEY: &str = "committed";

/// One durable operation, in the order openraft issued it.
enum Op {
    Append(Vec<(u64, Vec<u8>)>, Option<LogFlushed<TypeConfig>>),
    /// Delete entries with index >= the given one.
    Truncate(u64),
    /// Delete entries with index <= the given one, and remember the log id.
    Purge(u64, Vec<u8>),
    Meta(
        &'static str,
        Vec<u8>,
        Option<std::sync::mpsc::SyncSender<io::Result<()>>>,
    ),
}

/// The in-memory mirror of the durable log.
struct Mem {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// The log store handed to openraft. Cheap to clone (readers share it).
#[derive(Clone)]
pub struct LogStore {
    mem: Arc<RwLock<Mem>>,
    writer: mpsc::Sender<Op>,
}

/// Wraps a storage error for openraft, keeping it as the `source()`.
fn io_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::other(e)
}

impl LogStore {
    /// Opens (or creates) the log at `path` and loads it into memory.
    ///
    /// # Errors
    /// When the file cannot be opened or holds undecodable data.
    pub fn open(path: &Path) -> io::Result<Self> {
        let db = Database::create(path).map_err(io_err)?;
        {
            let w = db.begin_write().map_err(io_err)?;
            w.open_table(LOG).map_err(io_err)?;
            w.open_table(META).map_err(io_err)?;
            w.commit().map_err(io_err)?;
        }
        let mut mem = Mem {
            entries: BTreeMap::new(),
            last_purged: None,
            vote: None,
            committed: None,
        };
        {
            let r = db.begin_read().map_err(io_err)?;
            let log = r.open_table(LOG).map_err(io_err)?;
            for row in log.iter().map_err(io_err)? {
                let (k, v) = row.map_err(io_err)?;
                let entry: Entry = serde_json::from_slice(v.value()).map_err(io_err)?;
                mem.entries.insert(k.value(), entry);
            }
            let meta = r.open_table(META).map_err(io_err)?;
            let get = |key: &str| -> io::Result<Option<Vec<u8>>> {
                Ok(meta.get(key).map_err(io_err)?.map(|v| v.value().to_vec()))
            };
            if let Some(b) = get(VOTE_KEY)? {
                mem.vote = Some(serde_json::from_slice(&b).map_err(io_err)?);
            }
            if let Some(b) = get(PURGED_KEY)? {
                mem.last_purged = Some(serde_json::from_slice(&b).map_err(io_err)?);
            }
            if let Some(b) = get(COMMITTED_KEY)? {
                mem.committed = Some(serde_json::from_slice(&b).map_err(io_err)?);
            }
        }
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("palisade-log-writer".into())
            .spawn(move || write_loop(db, rx))?;
        Ok(LogStore {
            mem: Arc::new(RwLock::new(mem)),
            writer: tx,
        })
    }

    /// The index of the last entry known committed (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.mem
            .read()
            .expect("poisoned")
            .committed
            .as_ref()
            .map_or(0, |l| l.index)
    }

    fn send(&self, op: Op) -> Result<()> {
        self.writer.send(op).map_err(|_| {
            StorageError::from(StorageIOError::write_logs(&io_err(
                "the log writer thread has stopped",
            )))
        })
    }

    /// Writes a metadata value and waits until it is on disk.
    fn save_meta(&self, key: &'static str, bytes: Vec<u8>) -> io::Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.writer
            .send(Op::Meta(key, bytes, Some(tx)))
            .map_err(|_| io_err("the log writer thread has stopped"))?;
        rx.recv()
            .map_err(|_| io_err("the log writer thread has stopped"))?
    }
}

/// The writer thread: group commit.
fn write_loop(db: Database, rx: mpsc::Receiver<Op>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let started = std::time::Instant::now();
        let result = (|| -> std::result::Result<(), redb::Error> {
            let w = db.begin_write()?;
            {
                let mut log = w.open_table(LOG)?;
                let mut meta = w.open_table(META)?;
                for op in &batch {
                    match op {
                        Op::Append(entries, _) => {
                            for (i, bytes) in entries {
                                log.insert(*i, bytes.as_slice())?;
                            }
                        }
                        Op::Truncate(from) => {
                            log.retain_in(*from.., |_, _| false)?;
                        }
                        Op::Purge(upto, id) => {
                            log.retain_in(..=*upto, |_, _| false)?;
                            meta.insert(PURGED_KEY, id.as_slice())?;
                        }
                        Op::Meta(key, bytes, _) => {
                            meta.insert(*key, bytes.as_slice())?;
                        }
                    }
                }
            }
            w.commit()?;
            Ok(())
        })();
        tracing::debug!(
            ops = batch.len(),
            commit_us = started.elapsed().as_micros() as u64,
            "log batch committed"
        );
        for op in batch {
            let r = result
                .as_ref()
                .map(|_| ())
                .map_err(|e| io_err(e.to_string()));
            match op {
                Op::Append(_, Some(cb)) => cb.log_io_completed(r),
                Op::Meta(_, _, Some(done)) => {
                    let _ = done.send(r);
                }
                _ => {}
            }
        }
        if let Err(e) = result {
            // A log that cannot be written must not keep acknowledging: stop, so
            // that every later append fails instead of being silently lost.
            tracing::error!(error = %e, "log write failed; the log writer stops");
            return;
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>> {
        let mem = self.mem.read().expect("poisoned");
        Ok(mem.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let mem = self.mem.read().expect("poisoned");
        let last = mem
            .entries
            .values()
            .next_back()
            .map(|e| *e.get_log_id())
            .or(mem.last_purged);
        Ok(LogState {
            last_purged_log_id: mem.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        let bytes = serde_json::to_vec(vote)
            .map_err(|e| StorageError::from(StorageIOError::write_vote(&e)))?;
        self.save_meta(VOTE_KEY, bytes)
            .map_err(|e| StorageError::from(StorageIOError::write_vote(&e)))?;
        self.mem.write().expect("poisoned").vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>> {
        Ok(self.mem.read().expect("poisoned").vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<()> {
        // Not synced on its own: it only speeds up re-applying after a restart, and
        // it rides along with the next append's fsync.
        let bytes = serde_json::to_vec(&committed)
            .map_err(|e| StorageError::from(StorageIOError::write(&e)))?;
        self.send(Op::Meta(COMMITTED_KEY, bytes, None))?;
        self.mem.write().expect("poisoned").committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>> {
        Ok(self.mem.read().expect("poisoned").committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        {
            let mut mem = self.mem.write().expect("poisoned");
            for entry in entries {
                let index = entry.get_log_id().index;
                let bytes = serde_json::to_vec(&entry)
                    .map_err(|e| StorageError::from(StorageIOError::write_logs(&e)))?;
                encoded.push((index, bytes));
                mem.entries.insert(index, entry);
            }
        }
        self.send(Op::Append(encoded, Some(callback)))
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        self.mem
            .write()
            .expect("poisoned")
            .entries
            .retain(|i, _| *i < log_id.index);
        self.send(Op::Truncate(log_id.index))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<()> {
        let bytes = serde_json::to_vec(&log_id)
            .map_err(|e| StorageError::from(StorageIOError::write_logs(&e)))?;
        {
            let mut mem = self.mem.write().expect("poisoned");
            mem.entries.retain(|i, _| *i > log_id.index);
            mem.last_purged = Some(log_id);
        }
        self.send(Op::Purge(log_id.index, bytes))
    }
}
