//! One process per data directory.
//!
//! The first thing a node does with its data directory is take an exclusive
//! `flock` on `serve.lock` in it and write its pid there, so that a second
//! `palisade serve` on the same directory is refused before it reads or writes
//! anything else, with the pid of the process that has it. The kernel drops the
//! lock when the process ends, however it ends; a stale pid left in the file
//! means nothing.

use std::io;
use std::path::{Path, PathBuf};

use crate::io::{DiskLock, Io};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "serve.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another process holds the lock.
    #[error("another palisade serve is using {}{}", dir.display(), pid.map_or(String::new(), |p| format!(" (pid {p})")))]
    InUse {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, when it wrote one.
        pid: Option<u32>,
    },
    /// The directory or its lock file could not be created or opened.
    #[error("data directory {}", dir.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Held while this process uses the data directory; dropping it unlocks.
#[derive(Debug)]
pub struct DirLock {
    _lock: Box<dyn DiskLock>,
}

impl DirLock {
    /// Creates `dir` if needed and locks it for this process.
    ///
    /// # Errors
    /// [`DirLockError::InUse`] when another process holds it,
    /// [`DirLockError::Io`] when it cannot be created or opened.
    pub fn acquire(dir: &Path) -> Result<DirLock, DirLockError> {
        Self::acquire_on(dir, &Io::os())
    }

    /// [`DirLock::acquire`] on `io`'s disk.
    ///
    /// # Errors
    /// As [`DirLock::acquire`].
    pub fn acquire_on(dir: &Path, io: &Io) -> Result<DirLock, DirLockError> {
        let io_err = |source| DirLockError::Io {
            dir: dir.to_owned(),
            source,
        };
        io.disk.create_dir_all(dir).map_err(io_err)?;
        let pid = format!("{}\n", std::process::id());
        match io
            .disk
            .lock(&dir.join(LOCK_FILE), pid.as_bytes())
            .map_err(io_err)?
        {
            Ok(lock) => Ok(DirLock { _lock: lock }),
            Err(text) => Err(DirLockError::InUse {
                dir: dir.to_owned(),
                pid: text.trim().parse().ok(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_first_holders_pid_and_the_lock_frees_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = DirLock::acquire(&data).unwrap();
        match DirLock::acquire(&data) {
            Err(DirLockError::InUse { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected InUse, got {other:?}"),
        }
        let message = DirLock::acquire(&data).unwrap_err().to_string();
        assert!(
            message.starts_with("another palisade serve is using"),
            "{message}"
        );
        drop(first);
        DirLock::acquire(&data).expect("free again once the holder is gone");
    }

    #[test]
    fn an_uncreatable_directory_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            DirLock::acquire(&file.join("data")),
            Err(DirLockError::Io { .. })
        ));
    }
}
