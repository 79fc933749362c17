//! The test rigs the `palisade` binary runs besides the product (behind its
//! default `lab` feature): the fault drills ([`chaos`]), the benchmarks
//! ([`bench`]), the demonstrations ([`demo`]) and the simulator's command
//! ([`sim`]). All of them start real servers (through `palisade-testkit`) and
//! reach every correctness lock only through the registry of
//! `palisade-backends` and [`palisade_core::FencedLocks`]; the CLI parses their
//! arguments (the `Args` types here) and calls them.

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod sim;

// The registry and the shared conventions live on the product side; the rigs
// use them under the paths they always had.
pub(crate) use palisade_backends::{self as backends, FencingArg, duration_arg, exit};
