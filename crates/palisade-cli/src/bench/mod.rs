//! `palisade bench …`: measurements that start their own servers. Numbers in the
//! README come from here, never from tests.

mod redis_locks;
pub mod stats;

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Raw SET NX PX + DEL, the single-instance lock and Redlock (N=5), with 1 and
    /// 16 clients, and Redlock with one node slowed by 20 ms.
    Redis(redis_locks::RedisBenchArgs),
}

/// Runs a benchmark; returns the exit status.
pub async fn run(command: BenchCommand) -> Result<i32> {
    match command {
        BenchCommand::Redis(a) => redis_locks::run(a).await,
    }
}
