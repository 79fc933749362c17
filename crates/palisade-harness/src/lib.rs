//! What the `palisade` binary runs besides the server and the lock commands: the
//! registry of correctness-lock backends ([`backends`]), the fault drills
//! ([`chaos`]), the benchmarks ([`bench`]) and the demonstrations ([`demo`]).
//! All of them start real servers (through `palisade-testkit`) and reach every
//! correctness lock only through [`palisade_core::FencedLocks`]; the CLI parses
//! their arguments (the `Args` types here) and calls them.

pub mod backends;
pub mod bench;
pub mod chaos;
pub mod demo;
pub mod exit;
pub mod review;
pub mod sim;

use std::time::Duration;

use clap::ValueEnum;
use palisade_fence::Fencing;

/// Parses the CLI's durations: `10s`, `0.2s`, `150ms`, `2m`.
///
/// # Errors
/// The parse error, in words (for clap).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    palisade_core::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// Whether the fenced store checks tokens (`--fencing on|off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FencingArg {
    /// Reject writes whose token is below the highest accepted (409).
    On,
    /// Accept every write (to show what goes wrong without fencing).
    Off,
}

impl From<FencingArg> for Fencing {
    fn from(f: FencingArg) -> Self {
        match f {
            FencingArg::On => Fencing::On,
            FencingArg::Off => Fencing::Off,
        }
    }
}
