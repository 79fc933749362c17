//! Wall-clock jumps for one server process, through Palisade's own preload.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The preload built by this crate's build script.
pub fn preload_path() -> &'static Path {
    Path::new(env!("PALISADE_CLOCKSHIFT_SO"))
}

/// The offset file of one process: write it to jump that process's wall clock.
#[derive(Debug, Clone)]
pub struct ClockShift {
    file: PathBuf,
}

impl ClockShift {
    /// An offset file at `file`, starting at zero.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn new(file: PathBuf) -> std::io::Result<Self> {
        let shift = ClockShift { file };
        shift.set_ms(0)?;
        Ok(shift)
    }

    /// The environment a process needs to run under this shift.
    pub fn env(&self) -> [(&'static str, std::ffi::OsString); 2] {
        [
            ("LD_PRELOAD", preload_path().as_os_str().to_owned()),
            (
                "PALISADE_CLOCK_SHIFT_FILE",
                self.file.as_os_str().to_owned(),
            ),
        ]
    }

    /// Moves the process's wall clock `by` ahead of the real one (the preload
    /// notices within 5 ms).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn jump_ahead(&self, by: Duration) -> std::io::Result<()> {
        self.set_ms(i64::try_from(by.as_millis()).unwrap_or(i64::MAX))
    }

    /// Sets the offset in milliseconds (negative: behind the real clock).
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn set_ms(&self, ms: i64) -> std::io::Result<()> {
        // Written whole to a temporary file and renamed, so the preload never
        // reads a half-written number.
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, ms.to_string())?;
        std::fs::rename(&tmp, &self.file)
    }
}
