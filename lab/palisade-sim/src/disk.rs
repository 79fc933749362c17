//! A simulated disk: what was written, and what of it was synced.
//!
//! Every file keeps two images: what a reader sees now (every write so far),
//! and what survives a crash (its content at its last `fdatasync`). A crash
//! ([`SimDisk::crash`]) brings every file back to its synced image; with
//! `torn`, a file's writes since its last sync may survive in part — a prefix
//! of them, the last one cut at a random byte — as a power cut can leave them.
//! Creations, renames and removals of files count as durable when made (the
//! storage code syncs its directories after each; a simulator that lost them
//! would test the file system, not Palisade).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use palisade_server::io::{Disk, DiskFile, DiskLock, OpenMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One file's images and the writes between them.
#[derive(Debug, Default, Clone)]
struct FileData {
    /// What a reader sees.
    now: Vec<u8>,
    /// What a crash keeps.
    synced: Vec<u8>,
    /// Writes since the last sync, oldest first: `(offset, bytes)`.
    unsynced: Vec<(u64, Vec<u8>)>,
}

fn write_into(image: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let offset = offset as usize;
    if image.len() < offset + bytes.len() {
        image.resize(offset + bytes.len(), 0);
    }
    image[offset..offset + bytes.len()].copy_from_slice(bytes);
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, Arc<Mutex<FileData>>>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    rng: Option<SmallRng>,
    /// Bounds of a simulated log sync.
    sync_delay: (Duration, Duration),
}

/// A node's disk in a simulation. Cloning shares it (it outlives the node's
/// crashes: the same disk is given to the node when it restarts).
#[derive(Debug, Clone)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

impl SimDisk {
    /// An empty disk whose log syncs take between `min` and `max` of simulated
    /// time, drawn from `seed`.
    pub fn new(seed: u64, min: Duration, max: Duration) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State {
                rng: Some(SmallRng::seed_from_u64(seed)),
                sync_delay: (min, max),
                ..State::default()
            })),
        }
    }

    /// Whether some file has writes that are not synced yet (a crash now
    /// would lose them).
    pub fn has_unsynced(&self) -> bool {
        let state = self.state.lock().expect("poisoned");
        state
            .files
            .values()
            .any(|f| !f.lock().expect("poisoned").unsynced.is_empty())
    }

    /// The power goes out: every file is left as of its last sync (with
    /// `torn`, plus part of what was written after it), and every lock is
    /// released. Returns how many files lost unsynced writes.
    pub fn crash(&self, torn: bool) -> usize {
        let mut state = self.state.lock().expect("poisoned");
        state.locks.clear();
        let files: Vec<_> = state.files.values().cloned().collect();
        let mut lost = 0;
        for file in files {
            let mut f = file.lock().expect("poisoned");
            if f.unsynced.is_empty() {
                continue;
            }
            lost += 1;
            let mut image = f.synced.clone();
            if torn {
                let rng = state.rng.as_mut().expect("rng");
                let kept = rng.random_range(0..=f.unsynced.len());
                for (i, (offset, bytes)) in f.unsynced.iter().enumerate().take(kept) {
                    let cut = if i + 1 == kept {
                        rng.random_range(0..=bytes.len())
                    } else {
                        bytes.len()
                    };
                    write_into(&mut image, *offset, &bytes[..cut]);
                }
            }
            f.now = image.clone();
            f.synced = image;
            f.unsynced.clear();
        }
        lost
    }
}

#[derive(Debug)]
struct SimFile {
    data: Arc<Mutex<FileData>>,
}

impl DiskFile for SimFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut f = self.data.lock().expect("poisoned");
        write_into(&mut f.now, offset, buf);
        f.unsynced.push((offset, buf.to_vec()));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut f = self.data.lock().expect("poisoned");
        f.synced = f.now.clone();
        f.unsynced.clear();
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.data.lock().expect("poisoned").now.len() as u64)
    }
}

#[derive(Debug)]
struct SimLock {
    path: PathBuf,
    disk: Arc<Mutex<State>>,
}

impl DiskLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.disk.lock().expect("poisoned").locks.remove(&self.path);
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl Disk for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state.lock().expect("poisoned");
        for d in dir.ancestors() {
            state.dirs.insert(d.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.state.lock().expect("poisoned");
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let files = state.files.keys().filter(|p| p.parent() == Some(dir));
        let dirs = state.dirs.iter().filter(|p| p.parent() == Some(dir));
        Ok(files
            .chain(dirs)
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let state = self.state.lock().expect("poisoned");
        state.files.contains_key(path) || state.dirs.contains(path)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let state = self.state.lock().expect("poisoned");
        let file = state.files.get(path).ok_or_else(|| not_found(path))?;
        Ok(file.lock().expect("poisoned").now.clone())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn DiskFile>> {
        let mut state = self.state.lock().expect("poisoned");
        let data = match (mode, state.files.get(path)) {
            (OpenMode::Existing, None) => return Err(not_found(path)),
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            (OpenMode::Existing, Some(data)) => data.clone(),
            (OpenMode::Truncate, Some(data)) => {
                let mut f = data.lock().expect("poisoned");
                // Truncation is a metadata change: durable, like a creation.
                *f = FileData::default();
                drop(f);
                data.clone()
            }
            (_, None) => {
                let data = Arc::new(Mutex::new(FileData::default()));
                state.files.insert(path.to_path_buf(), data.clone());
                data
            }
        };
        Ok(Arc::new(SimFile { data }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.lock().expect("poisoned");
        let data = state.files.remove(from).ok_or_else(|| not_found(from))?;
        state.files.insert(to.to_path_buf(), data);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.lock().expect("poisoned");
        state
            .files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state.lock().expect("poisoned");
        state.files.retain(|p, _| !p.starts_with(dir));
        state.dirs.retain(|p| !p.starts_with(dir));
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn lock(&self, path: &Path, content: &[u8]) -> io::Result<Result<Box<dyn DiskLock>, String>> {
        let mut state = self.state.lock().expect("poisoned");
        if !state.locks.insert(path.to_path_buf()) {
            let held = state
                .files
                .get(path)
                .map(|f| String::from_utf8_lossy(&f.lock().expect("poisoned").now).into_owned())
                .unwrap_or_default();
            return Ok(Err(held));
        }
        let data = FileData {
            now: content.to_vec(),
            synced: content.to_vec(),
            unsynced: Vec::new(),
        };
        state
            .files
            .insert(path.to_path_buf(), Arc::new(Mutex::new(data)));
        Ok(Ok(Box::new(SimLock {
            path: path.to_path_buf(),
            disk: self.state.clone(),
        })))
    }

    fn sync_delay(&self) -> Duration {
        let mut state = self.state.lock().expect("poisoned");
        let (min, max) = state.sync_delay;
        if max <= min {
            return min;
        }
        let rng = state.rng.as_mut().expect("rng");
        rng.random_range(min..=max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> SimDisk {
        SimDisk::new(7, Duration::ZERO, Duration::ZERO)
    }

    #[test]
    fn a_crash_keeps_what_was_synced_and_drops_the_rest() {
        let d = disk();
        let f = d.open(Path::new("/a"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b" world", 5).unwrap();
        assert_eq!(d.read(Path::new("/a")).unwrap(), b"hello world");
        assert_eq!(d.crash(false), 1);
        assert_eq!(d.read(Path::new("/a")).unwrap(), b"hello");
    }

    #[test]
    fn a_torn_crash_keeps_a_prefix_of_the_unsynced_writes() {
        for seed in 0..50 {
            let d = SimDisk::new(seed, Duration::ZERO, Duration::ZERO);
            let f = d.open(Path::new("/a"), OpenMode::CreateNew).unwrap();
            f.write_all_at(b"abc", 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(b"def", 3).unwrap();
            f.write_all_at(b"ghi", 6).unwrap();
            d.crash(true);
            let after = d.read(Path::new("/a")).unwrap();
            assert!(b"abcdefghi".starts_with(&after), "{after:?}");
            assert!(after.starts_with(b"abc"), "{after:?}");
        }
    }

    #[test]
    fn a_lock_is_exclusive_until_dropped_or_crashed() {
        let d = disk();
        let held = d.lock(Path::new("/LOCK"), b"1").unwrap().unwrap();
        assert_eq!(d.lock(Path::new("/LOCK"), b"2").unwrap().unwrap_err(), "1");
        drop(held);
        let again = d.lock(Path::new("/LOCK"), b"3").unwrap().unwrap();
        std::mem::forget(again);
        d.crash(false);
        assert!(d.lock(Path::new("/LOCK"), b"4").unwrap().is_ok());
    }
}
