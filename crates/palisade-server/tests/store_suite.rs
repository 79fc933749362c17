//! openraft's storage conformance suite, run on Palisade's stores.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use palisade_server::store::log::LogStore;
use palisade_server::store::sm::StateMachineStore;
use palisade_server::typ::{Entry, EntryPayload, LeaderId, LogId, TypeConfig, Vote};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(dir.path()).expect("log store");
        let sm = StateMachineStore::open(dir.path()).expect("state store");
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(Builder).await.expect("the stores conform");
}

/// What a crash leaves: everything acknowledged is read back by a fresh open.
#[test]
fn acknowledged_entries_survive_reopening() {
    use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut log = LogStore::open(&path).unwrap();
        let vote = Vote::new(3, 1);
        log.save_vote(&vote).await.unwrap();
        let entries: Vec<Entry> = (1..=50)
            .map(|i| Entry {
                log_id: LogId::new(
                    LeaderId {
                        term: 3,
                        node_id: 1,
                    },
                    i,
                ),
                payload: EntryPayload::Blank,
            })
            .collect();
        // Returns once the append callback reported the entries synced.
        log.blocking_append(entries).await.unwrap();
        drop(log);
        // The writer thread closes the file once it sees the store dropped; a
        // new process would not wait, this test has to.
        let mut reopened = loop {
            match LogStore::open(&path) {
                Ok(l) => break l,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        assert_eq!(reopened.read_vote().await.unwrap(), Some(vote));
        let back = reopened.try_get_log_entries(1..=50).await.unwrap();
        assert_eq!(back.len(), 50);
        assert_eq!(back[49].log_id.index, 50);
    });
}

/// The committed index is not queued to the writer: the newest one saved waits
/// for the next batch (or a quiet spell, or the store's close). Saved several
/// times between appends, a reopen reads the newest.
#[test]
fn the_newest_committed_index_saved_is_read_back_after_reopening() {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let at = |i| {
        LogId::new(
            LeaderId {
                term: 2,
                node_id: 1,
            },
            i,
        )
    };
    let entry = |i| Entry {
        log_id: at(i),
        payload: EntryPayload::Blank,
    };
    let reopen = || loop {
        match LogStore::open(&path) {
            Ok(l) => break l,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    rt.block_on(async {
        let mut log = LogStore::open(&path).unwrap();
        log.blocking_append(vec![entry(1), entry(2)]).await.unwrap();
        log.save_committed(Some(at(1))).await.unwrap();
        log.save_committed(Some(at(2))).await.unwrap();
        // The next append carries the newest committed index with it.
        log.blocking_append(vec![entry(3)]).await.unwrap();
        drop(log);
        let mut log = reopen();
        assert_eq!(log.read_committed().await.unwrap(), Some(at(2)));

        // With no append to ride on.
        log.save_committed(Some(at(3))).await.unwrap();
        drop(log);
        let mut log = reopen();
        assert_eq!(log.read_committed().await.unwrap(), Some(at(3)));
    });
}

/// A data directory written before the write-ahead log (the log in
/// `raft-log.redb`) still loads: entries, vote, purged and committed ids move
/// into the new log and the old file is gone.
#[test]
fn a_log_in_the_older_redb_format_is_moved_and_loads() {
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    use redb::{Database, TableDefinition};
    const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("raft-log.redb");
    let leader = LeaderId {
        term: 2,
        node_id: 1,
    };
    let vote = Vote::new_committed(2, 1);
    let purged = LogId::new(leader, 3);
    let committed = LogId::new(leader, 6);
    {
        // Exactly what the redb log store wrote under openraft 0.9: JSON values
        // in two tables, written out literally so that a change of openraft's
        // serialization cannot hide here.
        let log_id = |i: u64| format!(r#"{{"leader_id":{{"term":2,"node_id":1}},"index":{i}}}"#);
        let db = Database::create(&legacy).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut log = w.open_table(LOG).unwrap();
            for i in 4..=7u64 {
                let entry = match i {
                    5 => format!(
                        r#"{{"log_id":{},"payload":{{"Normal":[{{"op":"create_session","ttl_ms":10000,"label":"x"}}]}}}}"#,
                        log_id(i)
                    ),
                    _ => format!(r#"{{"log_id":{},"payload":"Blank"}}"#, log_id(i)),
                };
                log.insert(i, entry.as_bytes()).unwrap();
            }
            let mut meta = w.open_table(META).unwrap();
            let vote_json = r#"{"leader_id":{"term":2,"node_id":1},"committed":true}"#;
            meta.insert("vote", vote_json.as_bytes()).unwrap();
            meta.insert("last_purged", log_id(3).as_bytes()).unwrap();
            meta.insert("committed", log_id(6).as_bytes()).unwrap();
        }
        w.commit().unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert!(!legacy.exists(), "the redb file is deleted once moved");
        // The leader's committed vote comes back as a plain vote for itself:
        // a restarted node campaigns again rather than resume its term.
        assert!(vote.committed);
        let as_candidate = Vote {
            leader_id: vote.leader_id,
            committed: false,
        };
        assert_eq!(log.read_vote().await.unwrap(), Some(as_candidate));
        assert_eq!(log.read_committed().await.unwrap(), Some(committed));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(purged));
        assert_eq!(state.last_log_id, Some(LogId::new(leader, 7)));
        let back = log.try_get_log_entries(0..100).await.unwrap();
        let indices: Vec<u64> = back.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indices, vec![4, 5, 6, 7]);
        assert!(
            matches!(&back[1].payload, EntryPayload::Normal(c) if c.0.len() == 1),
            "{:?}",
            back[1]
        );
    });
    // A crash between the move's rename and the old file's deletion leaves both:
    // the next start keeps the moved log and finishes the deletion.
    std::fs::write(&legacy, b"left over").unwrap();
    // The first store's writer thread may still hold the log's lock a moment.
    let reopened = (0..3000)
        .find_map(|_| {
            LogStore::open(dir.path())
                .inspect_err(|_| std::thread::sleep(std::time::Duration::from_millis(10)))
                .ok()
        })
        .expect("the log opens again");
    assert!(!legacy.exists());
    assert_eq!(reopened.last_index(), 7);
}

/// A snapshot that holds entries the log lost in a crash (a follower applies
/// what a majority holds before its own write is synced): the log is emptied
/// down to the snapshot, durably, instead of openraft refusing to start on an
/// "inverted log order". A log that holds the snapshot's entry is left alone.
#[test]
fn a_log_behind_its_snapshot_is_emptied_down_to_it() {
    use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt};
    let at = |term: u64, node_id: u64, index: u64| LogId::new(LeaderId { term, node_id }, index);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let io = palisade_server::io::Io::os();
    let reopen = |applied: Option<LogId>| loop {
        // The previous store's writer thread may still hold the log a moment.
        match LogStore::open_beside(&path, &io, applied) {
            Ok(l) => break l,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    rt.block_on(async {
        let mut log = LogStore::open(&path).unwrap();
        let entries: Vec<Entry> = (1..=6)
            .map(|i| Entry {
                log_id: at(1, 1, i),
                payload: EntryPayload::Blank,
            })
            .collect();
        log.blocking_append(entries).await.unwrap();
        drop(log);

        // The snapshot's entry is in the log: nothing changes.
        let mut log = reopen(Some(at(1, 1, 4)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(at(1, 1, 6)));
        assert_eq!(state.last_purged_log_id, None);
        drop(log);

        // Term 2 wrote index 5 (applied, in the snapshot); the log still holds
        // term 1's 5 and 6, off the committed history.
        let mut log = reopen(Some(at(2, 3, 5)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(at(2, 3, 5)));
        assert_eq!(state.last_log_id, Some(at(2, 3, 5)));
        assert!(log.try_get_log_entries(0..100).await.unwrap().is_empty());
        assert_eq!(log.read_committed().await.unwrap(), Some(at(2, 3, 5)));
        drop(log);

        // Durably: a plain reopen reads the same.
        let mut log = reopen(None);
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(at(2, 3, 5)));
        assert!(log.try_get_log_entries(0..100).await.unwrap().is_empty());
    });
}
