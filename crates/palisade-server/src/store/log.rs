//! The Raft log and vote, durable in Palisade's write-ahead log ([`super::wal`]),
//! with group commit.
//!
//! Every write (entries, truncation, purge, vote, committed index) goes through
//! one writer thread, in order (the committed index, saved on every commit,
//! waits beside the queue for the next batch; see `PendingCommitted`). The
//! writer drains everything queued, writes it as
//! ONE batch (one `write`, one `fdatasync`), and only then reports each append
//! complete to openraft and each vote saved. So an entry is acknowledged only once
//! it is on disk (unlike openraft's rocksdb example, which signals first), and one
//! fsync serves every grant that arrived while the previous one ran.
//!
//! The log is also kept in memory: openraft reads entries for replication right
//! after appending them, possibly before the writer has reached them. Memory is
//! bounded by snapshots: entries up to the last snapshot are purged.
//!
//! Data directories written before the write-ahead log kept the log in redb
//! (`raft-log.redb`); [`LogStore::open`] moves such a log into the new format once,
//! atomically, and then deletes the old file.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, RwLock, mpsc};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::wal::{Record, Wal};
use crate::io::Io;
use crate::typ::{Entry, LogId, TypeConfig, Vote};

type Result<T> = io::Result<T>;

/// The write-ahead log's directory inside the data directory.
const WAL_DIR: &str = "raft-log";
/// Where a log moved from the redb format is built before it takes `WAL_DIR`'s place.
const MIGRATING_DIR: &str = "raft-log.migrating";
/// The redb log of data directories written before the write-ahead log.
const LEGACY_REDB: &str = "raft-log.redb";

/// One durable operation, in the order openraft issued it, with whoever waits
/// for it to be on disk.
enum Op {
    Append(Vec<Record>, IOFlushed<TypeConfig>),
    /// Written when the next batch someone waits for is (see `write_loop`).
    Unawaited(Record),
    /// Answered on a tokio channel: `save_vote` awaits it rather than block a
    /// runtime thread for an fsync.
    Vote(Record, tokio::sync::oneshot::Sender<io::Result<()>>),
}

/// The in-memory mirror of the durable log.
#[derive(Default)]
struct Mem {
    entries: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

impl Mem {
    /// Replays one record read back from the write-ahead log.
    fn replay(&mut self, record: Record) -> io::Result<()> {
        match record {
            Record::Entry { index, bytes } => {
                let entry: Entry = serde_json::from_slice(&bytes).map_err(io_err)?;
                self.entries.insert(index, entry);
            }
            Record::TruncateFrom(index) => {
                self.entries.split_off(&index);
            }
            Record::Vote(bytes) => {
                self.vote = Some(serde_json::from_slice(&bytes).map_err(io_err)?)
            }
            Record::Committed(bytes) => {
                self.committed = serde_json::from_slice(&bytes).map_err(io_err)?;
            }
            Record::Purged { index, bytes } => {
                self.last_purged = Some(serde_json::from_slice(&bytes).map_err(io_err)?);
                self.entries = self.entries.split_off(&(index + 1));
            }
        }
        Ok(())
    }
}

impl Mem {
    /// See [`LogStore::open_beside`]: the records that empty the log down to
    /// `applied`, already applied to `self`; `None` when the log holds
    /// `applied` (or has purged past it) and nothing changes.
    fn align_with_applied(&mut self, applied: Option<LogId>) -> io::Result<Option<Vec<Record>>> {
        let Some(applied) = applied else {
            return Ok(None);
        };
        let holds = self.entries.get(&applied.index).map(|e| e.log_id) == Some(applied)
            || self.last_purged.is_some_and(|p| p.index >= applied.index);
        if holds {
            return Ok(None);
        }
        tracing::warn!(
            applied = %applied,
            log_last = ?self.entries.values().next_back().map(|e| e.log_id.to_string()),
            "the log lost entries the snapshot holds; emptying it down to the snapshot"
        );
        let purged = serde_json::to_vec(&applied).map_err(io_err)?;
        let committed = serde_json::to_vec(&Some(applied)).map_err(io_err)?;
        self.entries.clear();
        self.last_purged = Some(applied);
        self.committed = Some(applied);
        Ok(Some(vec![
            Record::TruncateFrom(0),
            Record::Purged {
                index: applied.index,
                bytes: purged,
            },
            Record::Committed(committed),
        ]))
    }
}

/// Where operations go to the writer: its thread, or (without threads) its task.
#[derive(Clone)]
enum Writer {
    Thread(mpsc::Sender<Op>),
    Task(tokio::sync::mpsc::UnboundedSender<Op>),
}

/// The log store handed to openraft. Cheap to clone (readers share it).
#[derive(Clone)]
pub struct LogStore {
    mem: Arc<RwLock<Mem>>,
    writer: Writer,
    /// The newest committed index not yet handed to the writer (see
    /// [`PendingCommitted`]).
    committed: PendingCommitted,
    /// Told of every appended batch (see [`crate::commit_clock`]).
    clock: Option<Arc<crate::commit_clock::CommitClock>>,
    /// The write-and-fdatasync time of every batch.
    fsync: prometheus::Histogram,
}

/// Wraps a storage error for openraft, keeping it as the `source()`.
fn io_err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::other(e)
}

impl LogStore {
    /// Opens (or creates) the log in `data_dir` and loads it into memory; a log
    /// in the older redb format is converted first.
    ///
    /// # Errors
    /// When another process has the log open, when it holds undecodable or
    /// corrupt data (named in the message), or on I/O failure.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        Self::open_on(data_dir, &Io::os())
    }

    /// [`LogStore::open`] on `io`: its disk, and without threads a writer task
    /// (spawned on the current tokio runtime) instead of the writer thread.
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_on(data_dir: &Path, io: &Io) -> io::Result<Self> {
        Self::open_beside(data_dir, io, None)
    }

    /// [`LogStore::open_on`] beside a state machine whose snapshot has applied
    /// the entries up to `applied`. A follower applies what the leader says is
    /// committed, which a majority holds on disk but this node's own log may
    /// not yet (its write not synced); a snapshot of that state can then
    /// survive a power cut that the log's last writes do not. If the log does
    /// not hold `applied` (it ends before it, or holds another entry at its
    /// index), whatever it holds past the snapshot is off the committed history
    /// (Log Matching: every committed entry after `applied` follows it), and
    /// what it holds before is in the snapshot: the log is emptied down to
    /// `applied`, durably, before anything reads it. (Found by `palisade sim`:
    /// openraft otherwise refuses to start on such a disk, "inverted log order".)
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_beside(data_dir: &Path, io: &Io, applied: Option<LogId>) -> io::Result<Self> {
        let wal_dir = data_dir.join(WAL_DIR);
        let legacy = data_dir.join(LEGACY_REDB);
        // The move from redb is only ever needed on a real disk.
        if io.threads && legacy.exists() && !wal_dir.exists() {
            migrate_from_redb(&legacy, data_dir)?;
        }
        let (mut wal, records) = Wal::open_on(&wal_dir, io)?;
        if io.threads && legacy.exists() {
            // The write-ahead log appears only by the move's final rename, so a
            // redb log beside it is one whose deletion a crash interrupted.
            std::fs::remove_file(&legacy)?;
        }
        let mut mem = Mem::default();
        for record in records {
            mem.replay(record)?;
        }
        if let Some(reset) = mem.align_with_applied(applied)? {
            wal.write(&reset)?;
        }
        // A node never resumes leadership after a restart: it campaigns again.
        // openraft sends a leader's entries to the followers while its own
        // fsync runs (counting itself only once that is done), so a leader can
        // crash having lost entries a follower already holds. Resumed as leader
        // of the same term (which openraft does for a committed vote of its
        // own), it would write other entries at those indices in that term,
        // and the follower, seeing the same term and index, would keep its
        // own: two nodes applying different entries at one index (found by
        // `palisade sim`). As a voter that merely voted for itself, it must
        // win a new term, whose entries replace any the followers hold.
        if let Some(vote) = mem.vote.as_mut()
            && vote.committed
        {
            vote.committed = false;
        }
        {
            let first = mem.entries.keys().next().copied();
            let last = mem.entries.keys().next_back().copied();
            let count = mem.entries.len() as u64;
            let contiguous = match (first, last) {
                (Some(f), Some(l)) => l - f + 1 == count,
                _ => true,
            };
            tracing::debug!(
                ?first,
                ?last,
                count,
                contiguous,
                purged = ?mem.last_purged.map(|l| l.index),
                committed = ?mem.committed.map(|l| l.index),
                "log replayed"
            );
        }
        let fsync = crate::metrics::latency_histogram(
            "palisade_log_fsync_duration_seconds",
            "Time to write one batch of log records and fdatasync it.",
        );
        let timer = fsync.clone();
        let committed = PendingCommitted::default();
        let pending = committed.clone();
        let writer = if io.threads {
            let (tx, rx) = mpsc::channel();
            std::thread::Builder::new()
                .name("palisade-log-writer".into())
                .spawn(move || write_loop(wal, rx, pending, timer))?;
            Writer::Thread(tx)
        } else {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let delay = io.disk.clone();
            let ack_first = io.planted.ack_before_sync;
            tokio::spawn(write_task(wal, rx, pending, timer, ack_first, move || {
                delay.sync_delay()
            }));
            Writer::Task(tx)
        };
        Ok(LogStore {
            mem: Arc::new(RwLock::new(mem)),
            writer,
            committed,
            clock: None,
            fsync,
        })
    }

    /// Tells `clock` of every batch appended from now on.
    #[must_use]
    pub fn with_commit_clock(mut self, clock: Arc<crate::commit_clock::CommitClock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The write-and-fdatasync time of every batch of records.
    pub fn fsync_histogram(&self) -> &prometheus::Histogram {
        &self.fsync
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

    /// The term of the saved vote (0 before any).
    pub fn vote_term(&self) -> u64 {
        self.mem
            .read()
            .expect("poisoned")
            .vote
            .map_or(0, |v| v.leader_id.term)
    }

    /// The index of the last entry in the log (0 when empty).
    pub fn last_index(&self) -> u64 {
        let mem = self.mem.read().expect("poisoned");
        mem.entries
            .keys()
            .next_back()
            .copied()
            .or(mem.last_purged.map(|l| l.index))
            .unwrap_or(0)
    }

    fn send(&self, op: Op) -> Result<()> {
        let sent = match &self.writer {
            Writer::Thread(tx) => tx.send(op).is_ok(),
            Writer::Task(tx) => tx.send(op).is_ok(),
        };
        sent.then_some(())
            .ok_or_else(|| io_err("the log writer thread has stopped"))
    }
}

/// Converts a redb log (the format before the write-ahead log) into a new
/// write-ahead log: built aside, renamed into place, and only then is the old
/// file deleted, so a crash at any point leaves one complete log.
fn migrate_from_redb(legacy: &Path, data_dir: &Path) -> io::Result<()> {
    use redb::{Database, ReadableTable, TableDefinition};
    const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

    let db = Database::open(legacy).map_err(io_err)?;
    let r = db.begin_read().map_err(io_err)?;
    let mut records = Vec::new();
    if let Ok(meta) = r.open_table(META) {
        let get = |key: &str| -> io::Result<Option<Vec<u8>>> {
            Ok(meta.get(key).map_err(io_err)?.map(|v| v.value().to_vec()))
        };
        if let Some(bytes) = get("vote")? {
            records.push(Record::Vote(bytes));
        }
        if let Some(bytes) = get("last_purged")? {
            let id: LogId = serde_json::from_slice(&bytes).map_err(io_err)?;
            records.push(Record::Purged {
                index: id.index,
                bytes,
            });
        }
        if let Some(bytes) = get("committed")? {
            records.push(Record::Committed(bytes));
        }
    }
    if let Ok(log) = r.open_table(LOG) {
        for row in log.iter().map_err(io_err)? {
            let (k, v) = row.map_err(io_err)?;
            // Decoded once here so that undecodable data stops the move.
            let _: Entry = serde_json::from_slice(v.value()).map_err(io_err)?;
            records.push(Record::Entry {
                index: k.value(),
                bytes: v.value().to_vec(),
            });
        }
    }
    drop(r);
    drop(db);
    let aside = data_dir.join(MIGRATING_DIR);
    if aside.exists() {
        std::fs::remove_dir_all(&aside)?;
    }
    {
        let (mut wal, _) = Wal::open(&aside)?;
        wal.write(&records)?;
    }
    std::fs::rename(&aside, data_dir.join(WAL_DIR))?;
    std::fs::File::open(data_dir)?.sync_all()?;
    std::fs::remove_file(legacy)?;
    tracing::info!(
        entries = records.len(),
        "moved the Raft log from redb to the write-ahead log"
    );
    Ok(())
}

/// How long an operation nobody waits for (the committed index, a truncation, a
/// purge) may wait for an acknowledged write to ride along with before the writer
/// writes it on its own.
const CARRY_AT_MOST: std::time::Duration = std::time::Duration::from_millis(500);

/// The committed index is saved on every commit, and nobody waits for it: the
/// newest value waits here, without waking the writer, for the next batch the
/// writer writes anyway (or for `CARRY_AT_MOST` of quiet). Sent through the
/// writer's queue instead, it woke the writer thread once more per grant on
/// every node, to do nothing.
#[derive(Clone, Default)]
struct PendingCommitted(Arc<std::sync::Mutex<Option<Record>>>);

impl PendingCommitted {
    fn set(&self, record: Record) {
        *self.0.lock().expect("poisoned") = Some(record);
    }

    fn take(&self) -> Option<Record> {
        self.0.lock().expect("poisoned").take()
    }

    /// Puts back a value taken for a batch that was not written, unless a newer
    /// one has arrived since.
    fn put_back(&self, record: Record) {
        self.0.lock().expect("poisoned").get_or_insert(record);
    }
}

/// The writer thread: group commit.
///
/// Only an append or a vote has someone waiting for it to be on disk. Operations
/// nobody waits for are carried, in order, into the next batch that does: each
/// costs no fsync of its own on the commit path (the committed index changes with
/// every grant; syncing it separately doubled the fsyncs per grant). Carried
/// operations are written on their own only after `CARRY_AT_MOST` of quiet.
fn write_loop(
    mut wal: Wal,
    rx: mpsc::Receiver<Op>,
    committed: PendingCommitted,
    fsync: prometheus::Histogram,
) {
    let mut carried: Vec<Op> = Vec::new();
    let mut closing = false;
    while !closing {
        let first = match rx.recv_timeout(CARRY_AT_MOST) {
            Ok(op) => Some(op),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                closing = true;
                None
            }
        };
        let Some(batch) = next_batch(&mut carried, first, || rx.try_iter(), &committed) else {
            continue;
        };
        let started = std::time::Instant::now();
        let (records, waiting) = split(batch);
        let result = wal.write(&records);
        fsync.observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            records = records.len(),
            write_us = started.elapsed().as_micros() as u64,
            "log batch on disk"
        );
        if !answer(waiting, result) {
            return;
        }
    }
}

/// [`write_loop`] as a task on the node's own runtime, for a simulation (no
/// thread it cannot schedule): the same batches, with the disk's simulated
/// time between the write and its sync (a crash then may tear the batch).
async fn write_task(
    mut wal: Wal,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Op>,
    committed: PendingCommitted,
    fsync: prometheus::Histogram,
    ack_before_sync: bool,
    sync_delay: impl Fn() -> std::time::Duration,
) {
    let mut carried: Vec<Op> = Vec::new();
    let mut closing = false;
    while !closing {
        let first = match tokio::time::timeout(CARRY_AT_MOST, rx.recv()).await {
            Ok(Some(op)) => Some(op),
            Err(_) => None,
            Ok(None) => {
                closing = true;
                None
            }
        };
        let queue = &mut rx;
        let drained = move || std::iter::from_fn(move || queue.try_recv().ok());
        let Some(batch) = next_batch(&mut carried, first, drained, &committed) else {
            continue;
        };
        let started = tokio::time::Instant::now();
        let (records, waiting) = split(batch);
        let mut result = wal.write_unsynced(&records);
        if ack_before_sync && result.is_ok() {
            // The planted bug (see `io::Planted`): acknowledged, not yet durable.
            answer(waiting, Ok(()));
            tokio::time::sleep(sync_delay()).await;
            if wal.sync_written(&records).is_err() {
                return;
            }
            continue;
        }
        if result.is_ok() {
            tokio::time::sleep(sync_delay()).await;
            result = wal.sync_written(&records);
        }
        fsync.observe(started.elapsed().as_secs_f64());
        if !answer(waiting, result) {
            return;
        }
    }
}

/// Forms the next batch from the carried operations, the first new one (none
/// after a quiet `CARRY_AT_MOST`), everything queued behind it and, last, the
/// newest committed index; `None` (and all of it carried on) while nobody waits
/// for any of it and it was not quiet, or when there is nothing to write.
fn next_batch<I: Iterator<Item = Op>>(
    carried: &mut Vec<Op>,
    first: Option<Op>,
    queued: impl FnOnce() -> I,
    committed: &PendingCommitted,
) -> Option<Vec<Op>> {
    let quiet = first.is_none();
    // Taken before the queue is drained: every entry a committed index covers
    // was appended — queued — before that index was saved, so it is in this
    // batch or an earlier one, and the index is written after it.
    let pending = committed.take();
    let mut batch = std::mem::take(carried);
    batch.extend(first);
    batch.extend(queued());
    let someone_waits = batch.iter().any(|op| !matches!(op, Op::Unawaited(_)));
    if !someone_waits && !quiet {
        *carried = batch;
        if let Some(record) = pending {
            committed.put_back(record);
        }
        return None;
    }
    batch.extend(pending.map(Op::Unawaited));
    (!batch.is_empty()).then_some(batch)
}

/// Who waits for a batch to be on disk.
struct Waiting {
    appended: Vec<IOFlushed<TypeConfig>>,
    votes: Vec<tokio::sync::oneshot::Sender<io::Result<()>>>,
}

/// A batch's records, in order, and who waits for them.
fn split(batch: Vec<Op>) -> (Vec<Record>, Waiting) {
    let mut records = Vec::with_capacity(batch.len());
    let mut waiting = Waiting {
        appended: Vec::new(),
        votes: Vec::new(),
    };
    for op in batch {
        match op {
            Op::Append(entries, done) => {
                records.extend(entries);
                waiting.appended.push(done);
            }
            Op::Unawaited(record) => records.push(record),
            Op::Vote(record, done) => {
                records.push(record);
                waiting.votes.push(done);
            }
        }
    }
    (records, waiting)
}

/// Tells everyone waiting how the batch's write ended; `false` when it failed
/// and the writer must stop.
fn answer(waiting: Waiting, result: io::Result<()>) -> bool {
    let outcome = || {
        result
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))
    };
    for done in waiting.appended {
        done.io_completed(outcome());
    }
    for done in waiting.votes {
        let _ = done.send(outcome());
    }
    if let Err(e) = &result {
        // A log that cannot be written must not keep acknowledging: stop, so
        // that every later append fails instead of being silently lost.
        tracing::error!(error = %e, "log write failed; the log writer stops");
        return false;
    }
    true
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>> {
        let mem = self.mem.read().expect("poisoned");
        Ok(mem.entries.range(range).map(|(_, e)| e.clone()).collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>> {
        Ok(self.mem.read().expect("poisoned").vote)
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
            .map(|e| e.log_id)
            .or(mem.last_purged);
        Ok(LogState {
            last_purged_log_id: mem.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<()> {
        let bytes = serde_json::to_vec(vote).map_err(io_err)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Op::Vote(Record::Vote(bytes), tx))?;
        rx.await
            .map_err(|_| io_err("the log writer thread has stopped"))??;
        self.mem.write().expect("poisoned").vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<()> {
        // Not synced on its own: it only speeds up re-applying after a restart, and
        // it rides along with the next append's fsync.
        let bytes = serde_json::to_vec(&committed).map_err(io_err)?;
        self.committed.set(Record::Committed(bytes));
        self.mem.write().expect("poisoned").committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>> {
        Ok(self.mem.read().expect("poisoned").committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        {
            let mut mem = self.mem.write().expect("poisoned");
            for entry in entries {
                let index = entry.log_id.index;
                let bytes = serde_json::to_vec(&entry).map_err(io_err)?;
                encoded.push(Record::Entry { index, bytes });
                mem.entries.insert(index, entry);
            }
        }
        if let (Some(clock), Some(Record::Entry { index, .. })) = (&self.clock, encoded.last()) {
            clock.appended(*index);
        }
        self.send(Op::Append(encoded, callback))
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<()> {
        // Keeps every entry up to `last` (none when `None`).
        let from = last.map_or(0, |l| l.index + 1);
        self.mem.write().expect("poisoned").entries.split_off(&from);
        self.send(Op::Unawaited(Record::TruncateFrom(from)))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<()> {
        let bytes = serde_json::to_vec(&log_id).map_err(io_err)?;
        {
            let mut mem = self.mem.write().expect("poisoned");
            mem.entries = mem.entries.split_off(&(log_id.index + 1));
            mem.last_purged = Some(log_id);
        }
        self.send(Op::Unawaited(Record::Purged {
            index: log_id.index,
            bytes,
        }))
    }
}
