//! The node's current snapshot, one file: `snapshot/current` under the data
//! directory.
//!
//! Layout: the 8 bytes `PLSDSNPF`, a little-endian `u32` file format (1), the
//! length (`u32`) and JSON of openraft's snapshot metadata (last included log
//! id, membership, snapshot id), the length (`u64`) and bytes of the state
//! machine's snapshot (see `palisade_core`'s snapshot formats), and a CRC-32 of
//! everything before it. A new snapshot is written to `current.tmp`, synced,
//! renamed over `current` and the directory synced: a crash leaves the old
//! snapshot or the new one, never a mix. A file that fails its checksum stops
//! the node with the file named, since the entries it covers are gone from the
//! log.
//!
//! Earlier versions kept the snapshot in `state.redb`, as JSON; it is moved into
//! the file once, at the first start of this version, and the redb file deleted.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use redb::{Database, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::io::{Io, OpenMode};
use crate::typ::SnapshotMeta;

const MAGIC: &[u8; 8] = b"PLSDSNPF";
const FILE_FORMAT: u32 = 1;
/// How much of a snapshot is written between syncs.
const SYNC_EVERY: usize = 1 << 20;
/// The table earlier versions kept their snapshot in, under the key "current".
const LEGACY_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

/// A snapshot as stored: openraft's metadata and the machine's bytes.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoredSnapshot {
    /// Which entries it covers, and the membership as of the last of them.
    pub meta: SnapshotMeta,
    /// `LockMachine::to_snapshot_bytes`.
    pub data: Vec<u8>,
}

/// The snapshot file of one data directory.
pub struct SnapshotFile {
    dir: PathBuf,
    io: Io,
}

impl SnapshotFile {
    /// Opens the snapshot directory under `data_dir` and reads the current
    /// snapshot, moving one of an earlier version's `state.redb` over first.
    ///
    /// # Errors
    /// When the directory cannot be created, or a snapshot exists but cannot be
    /// read or fails its checksum (the error names the file).
    pub fn open(data_dir: &Path) -> io::Result<(Self, Option<StoredSnapshot>)> {
        Self::open_on(data_dir, &Io::os())
    }

    /// [`SnapshotFile::open`] on `io`'s disk.
    ///
    /// # Errors
    /// As [`SnapshotFile::open`].
    pub fn open_on(data_dir: &Path, io: &Io) -> io::Result<(Self, Option<StoredSnapshot>)> {
        let dir = data_dir.join("snapshot");
        io.disk.create_dir_all(&dir)?;
        let file = SnapshotFile {
            dir,
            io: io.clone(),
        };
        // A write that a crash interrupted before its rename.
        match io.disk.remove_file(&file.tmp_path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let legacy = data_dir.join("state.redb");
        // Earlier versions only ever ran on a real disk.
        if io.threads && legacy.exists() {
            if !file.path().exists()
                && let Some(stored) = read_legacy(&legacy)?
            {
                file.save(&stored)?;
                tracing::info!(from = %legacy.display(), "moved the snapshot of an earlier version");
            }
            fs::remove_file(&legacy)?;
            File::open(data_dir)?.sync_all()?;
        }
        let current = file.load()?;
        Ok((file, current))
    }

    fn path(&self) -> PathBuf {
        self.dir.join("current")
    }

    fn tmp_path(&self) -> PathBuf {
        self.dir.join("current.tmp")
    }

    /// Makes `stored` the current snapshot, durably and atomically.
    ///
    /// # Errors
    /// When it cannot be written or synced; the previous snapshot stays.
    pub fn save(&self, stored: &StoredSnapshot) -> io::Result<()> {
        let meta = serde_json::to_vec(&stored.meta).map_err(io::Error::other)?;
        let meta_len = u32::try_from(meta.len()).map_err(io::Error::other)?;
        let mut head = Vec::with_capacity(24 + meta.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FILE_FORMAT.to_le_bytes());
        head.extend_from_slice(&meta_len.to_le_bytes());
        head.extend_from_slice(&meta);
        head.extend_from_slice(&(stored.data.len() as u64).to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.update(&stored.data);
        let disk = &self.io.disk;
        let f = disk.open(&self.tmp_path(), OpenMode::Truncate)?;
        f.write_all_at(&head, 0)?;
        let mut at = head.len() as u64;
        // Written and synced a MiB at a time, then idle three times as long:
        // the log's fsyncs — the commit path — share the disk, and queued
        // behind tens of MiB flushed at once they raised other clients'
        // acquire p99 while a snapshot was saved (`palisade bench scale`).
        for chunk in stored.data.chunks(SYNC_EVERY) {
            let started = std::time::Instant::now();
            f.write_all_at(chunk, at)?;
            at += chunk.len() as u64;
            f.sync_data()?;
            self.io.pace(started.elapsed() * 3);
        }
        f.write_all_at(&crc.finalize().to_le_bytes(), at)?;
        f.sync_data()?;
        drop(f);
        disk.rename(&self.tmp_path(), &self.path())?;
        disk.sync_dir(&self.dir)
    }

    /// The current snapshot, if one was ever saved.
    ///
    /// # Errors
    /// When it cannot be read or is damaged.
    pub fn load(&self) -> io::Result<Option<StoredSnapshot>> {
        let path = self.path();
        let bytes = match self.io.disk.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let damaged = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "snapshot {} is damaged ({why}); restore the data directory from a backup \
                     or remove this node's directory and add it back as a new learner",
                    path.display()
                ),
            )
        };
        let (body, crc) = bytes
            .split_last_chunk::<4>()
            .ok_or_else(|| damaged("too short"))?;
        let rest = body
            .strip_prefix(MAGIC)
            .ok_or_else(|| damaged("not a Palisade snapshot file"))?;
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            return Err(damaged("checksum mismatch"));
        }
        let (format, rest) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| damaged("too short"))?;
        if u32::from_le_bytes(*format) != FILE_FORMAT {
            return Err(damaged(&format!(
                "file format {} is unknown to this version",
                u32::from_le_bytes(*format)
            )));
        }
        let (meta_len, rest) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| damaged("too short"))?;
        let meta_len = u32::from_le_bytes(*meta_len) as usize;
        if rest.len() < meta_len + 8 {
            return Err(damaged("too short"));
        }
        let (meta, rest) = rest.split_at(meta_len);
        let meta = serde_json::from_slice(meta).map_err(|e| damaged(&e.to_string()))?;
        let (data_len, data) = rest
            .split_first_chunk::<8>()
            .ok_or_else(|| damaged("too short"))?;
        if u64::from_le_bytes(*data_len) != data.len() as u64 {
            return Err(damaged("length mismatch"));
        }
        Ok(Some(StoredSnapshot {
            meta,
            data: data.to_vec(),
        }))
    }
}

/// The snapshot an earlier version kept in redb, if any.
fn read_legacy(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    let legacy = |e: &dyn std::fmt::Display| {
        io::Error::other(format!(
            "cannot read the snapshot of an earlier version in {}: {e}",
            path.display()
        ))
    };
    let db = Database::open(path).map_err(|e| legacy(&e))?;
    let read = db.begin_read().map_err(|e| legacy(&e))?;
    let table = match read.open_table(LEGACY_TABLE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(legacy(&e)),
    };
    match table.get("current").map_err(|e| legacy(&e))? {
        Some(v) => serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|e| legacy(&e)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::typ::{LeaderId, LogId, StoredMembership};

    fn snapshot(index: u64, data: &[u8]) -> StoredSnapshot {
        StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: Some(LogId::new(
                    LeaderId {
                        term: 2,
                        node_id: 1,
                    },
                    index,
                )),
                last_membership: StoredMembership::default(),
            },
            data: data.to_vec(),
        }
    }

    fn index(s: &StoredSnapshot) -> u64 {
        s.meta.last_log_id.map_or(0, |l| l.index)
    }

    #[test]
    fn a_saved_snapshot_loads_and_the_next_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let (file, none) = SnapshotFile::open(dir.path()).unwrap();
        assert!(none.is_none());
        file.save(&snapshot(7, b"seven")).unwrap();
        file.save(&snapshot(9, b"nine")).unwrap();
        let (_, loaded) = SnapshotFile::open(dir.path()).unwrap();
        let loaded = loaded.unwrap();
        assert_eq!(index(&loaded), 9);
        assert_eq!(loaded.data, b"nine");
        // A write cut off before its rename leaves the previous snapshot.
        fs::write(dir.path().join("snapshot/current.tmp"), b"half").unwrap();
        let (_, loaded) = SnapshotFile::open(dir.path()).unwrap();
        assert_eq!(loaded.unwrap().data, b"nine");
        assert!(!dir.path().join("snapshot/current.tmp").exists());
    }

    #[test]
    fn a_damaged_snapshot_stops_the_node_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = SnapshotFile::open(dir.path()).unwrap();
        file.save(&snapshot(7, b"some lock state")).unwrap();
        let path = dir.path().join("snapshot/current");
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes.len() - 8;
        bytes[at] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = SnapshotFile::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        fs::write(&path, &bytes[..20]).unwrap();
        let err = SnapshotFile::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains("damaged"), "{err}");
    }

    #[test]
    fn the_redb_snapshot_of_an_earlier_version_is_moved_once() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("state.redb");
        {
            // Exactly as earlier versions (openraft 0.9) wrote it: JSON of meta
            // (with a snapshot id, which openraft 0.10 no longer has) and data.
            let db = Database::create(&legacy).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut t = w.open_table(LEGACY_TABLE).unwrap();
                let data: Vec<String> = b"{\"old\":1}".iter().map(u8::to_string).collect();
                let json = format!(
                    r#"{{"meta":{{"last_log_id":{{"leader_id":{{"term":2,"node_id":1}},"index":5}},"last_membership":{{"log_id":null,"membership":{{"configs":[],"nodes":{{}}}}}},"snapshot_id":"2-5-9"}},"data":[{}]}}"#,
                    data.join(",")
                );
                t.insert("current", json.as_bytes()).unwrap();
            }
            w.commit().unwrap();
        }
        let (_, loaded) = SnapshotFile::open(dir.path()).unwrap();
        let loaded = loaded.unwrap();
        assert_eq!(index(&loaded), 5);
        assert_eq!(loaded.data, b"{\"old\":1}");
        assert!(!legacy.exists());
        let (_, again) = SnapshotFile::open(dir.path()).unwrap();
        assert_eq!(index(&again.unwrap()), 5);
    }
}
