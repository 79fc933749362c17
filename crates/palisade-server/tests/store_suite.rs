//! openraft's storage conformance suite, run on Palisade's stores.

use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};
use palisade_server::store::log::LogStore;
use palisade_server::store::sm::StateMachineStore;
use palisade_server::typ::TypeConfig;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(dir.path()).expect("log store");
        let sm = StateMachineStore::open(&dir.path().join("state.redb")).expect("state store");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("the stores conform");
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
        let vote = openraft::Vote::new(3, 1);
        log.save_vote(&vote).await.unwrap();
        let entries: Vec<openraft::Entry<TypeConfig>> = (1..=50)
            .map(|i| openraft::Entry {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), i),
                payload: openraft::EntryPayload::Blank,
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
    let leader = openraft::CommittedLeaderId::new(2, 1);
    let vote = openraft::Vote::new_committed(2, 1);
    let purged = openraft::LogId::new(leader, 3);
    let committed = openraft::LogId::new(leader, 6);
    {
        // Exactly what the redb log store wrote: JSON values in two tables.
        let db = Database::create(&legacy).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut log = w.open_table(LOG).unwrap();
            for i in 4..=7u64 {
                let entry = openraft::Entry::<TypeConfig> {
                    log_id: openraft::LogId::new(leader, i),
                    payload: openraft::EntryPayload::Blank,
                };
                log.insert(i, serde_json::to_vec(&entry).unwrap().as_slice())
                    .unwrap();
            }
            let mut meta = w.open_table(META).unwrap();
            meta.insert("vote", serde_json::to_vec(&vote).unwrap().as_slice())
                .unwrap();
            let purged_json = serde_json::to_vec(&purged).unwrap();
            meta.insert("last_purged", purged_json.as_slice()).unwrap();
            let committed_json = serde_json::to_vec(&Some(committed)).unwrap();
            meta.insert("committed", committed_json.as_slice()).unwrap();
        }
        w.commit().unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut log = LogStore::open(dir.path()).unwrap();
        assert!(!legacy.exists(), "the redb file is deleted once moved");
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(log.read_committed().await.unwrap(), Some(committed));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(purged));
        assert_eq!(state.last_log_id, Some(openraft::LogId::new(leader, 7)));
        let back = log.try_get_log_entries(0..100).await.unwrap();
        let indices: Vec<u64> = back.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indices, vec![4, 5, 6, 7]);
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
