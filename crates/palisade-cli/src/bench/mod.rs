//! `palisade bench …`: measurements that start their own servers. Numbers in the
//! README come from here, never from tests.

mod redis_locks;
mod server;
pub mod stats;

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Raw SET NX PX + DEL, the single-instance lock and Redlock (N=5), with 1 and
    /// 16 clients, and Redlock with one node slowed by 20 ms.
    Redis(redis_locks::RedisBenchArgs),
    /// The Palisade server (1 and 3 nodes, durable commits): uncontended pairs/s
    /// with 1 and 64 clients, and the contended handoff with 8 clients.
    Server(server::ServerBenchArgs),
}

/// Runs a benchmark; returns the exit status.
pub async fn run(command: BenchCommand) -> Result<i32> {
    match command {
        BenchCommand::Redis(a) => redis_locks::run(a).await,
        BenchCommand::Server(a) => server::run(a).await,
    }
}
