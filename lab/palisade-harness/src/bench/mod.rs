//! `palisade bench …`: measurements that start their own servers. Numbers in the
//! README and docs/benchmarks.md come from here, never from tests.

mod http;
mod locks;
mod redis_locks;
mod scale;
mod server;
pub mod stats;
mod svg;

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
    /// Every correctness-lock backend side by side in one run (Palisade 1 and 3
    /// nodes, ZooKeeper 1 and 3, etcd 3, PostgreSQL; or `--backend URL,…`): the same
    /// rows as `bench server`.
    Lock(locks::LockBenchArgs),
    /// One node holding many sessions (and locks): CreateSession and keep-alive
    /// rates and latency at that size, and the node's memory.
    Scale(scale::ScaleBenchArgs),
}

/// Runs a benchmark; returns the exit status.
pub async fn run(command: BenchCommand) -> Result<i32> {
    match command {
        BenchCommand::Redis(a) => redis_locks::run(a).await,
        BenchCommand::Server(a) => server::run(a).await,
        BenchCommand::Lock(a) => locks::run(a).await,
        BenchCommand::Scale(a) => scale::run(a).await,
    }
}

/// Writes the rows as JSON lines and the chart into `dir`, and says where.
fn write_outputs<R: serde::Serialize>(
    dir: &std::path::Path,
    json_name: &str,
    rows: &[R],
    svg_name: &str,
    svg: &str,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut json = String::new();
    for r in rows {
        json.push_str(&serde_json::to_string(r)?);
        json.push('\n');
    }
    std::fs::write(dir.join(json_name), json)?;
    std::fs::write(dir.join(svg_name), svg)?;
    eprintln!(
        "palisade: wrote {} and {}",
        dir.join(json_name).display(),
        dir.join(svg_name).display()
    );
    Ok(())
}
