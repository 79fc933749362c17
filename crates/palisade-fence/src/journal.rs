//! The store's journal: one JSON line per decision on a fenced request, stamped
//! with the machine's monotonic clock, for audits and for Palisade's fault drills
//! (which read it as the resource's own account of what it accepted, and when).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// One decision of the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// `CLOCK_MONOTONIC` in microseconds when the store decided: for an accepted
    /// request, inside the write transaction (so entries on one store are in
    /// commit order); for a refused one, when it was refused.
    pub at_us: u64,
    /// `put`, `delete`, or `read` (a `GET` that presented a token).
    pub op: String,
    /// The object key.
    pub key: String,
    /// The token presented.
    pub token: u64,
    /// Whether the store accepted the request.
    pub accepted: bool,
    /// The body of a `put`, accepted or refused (lossy UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// An append-only file of [`JournalEntry`] lines, flushed after every line.
#[derive(Debug)]
pub struct Journal {
    file: Mutex<BufWriter<File>>,
}

impl Journal {
    /// Opens `path` for appending, creating it if needed.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Journal {
            file: Mutex::new(BufWriter::new(file)),
        })
    }

    /// Appends one entry. A journal that cannot be written is logged, not fatal:
    /// the store's answers do not depend on it.
    pub fn record(&self, entry: &JournalEntry) {
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(&line).and_then(|()| file.flush()) {
            tracing::error!(error = %e, "cannot write the fence-store journal");
        }
    }

    /// Reads every entry of the journal at `path` (for drills and audits).
    ///
    /// # Errors
    /// When the file cannot be read or a line is not an entry.
    pub fn read_all(path: &Path) -> std::io::Result<Vec<JournalEntry>> {
        std::fs::read_to_string(path)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }
}

/// `CLOCK_MONOTONIC` now, in microseconds: the clock every process on this machine
/// shares, so stamps from different processes can be compared.
pub fn monotonic_us() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000,
        Err(_) => 0,
    }
}
