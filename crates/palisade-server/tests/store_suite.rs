//! openraft's storage conformance suite, run on Palisade's redb stores.

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
        let log = LogStore::open(&dir.path().join("log.redb")).expect("log store");
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
    let path = dir.path().join("log.redb");
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
