//! `palisade redis lock|audit|budget`.

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use palisade_redis::budget::{Budget, default_drift};
use palisade_redis::{AcquireOptions, Redlock, RedlockConfig};

use crate::child::{Ended, run_holding, shell_status};
use crate::{duration_arg, exit};

/// The Redis subcommands.
#[derive(Subcommand)]
pub enum RedisCommand {
    /// Run CMD while holding an efficiency lock (single node, or Redlock with
    /// several). CMD is stopped if an extension fails or the validity runs out.
    Lock(LockArgs),
    /// Check that a set of nodes meets Redlock's independence assumption.
    Audit(AuditArgs),
    /// The usable window of a lease: ttl - acquisition time - drift.
    Budget(BudgetArgs),
}

#[derive(Args)]
pub struct Nodes {
    /// Node URLs, comma-separated: redis://HOST:PORT,…
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        env = "PALISADE_REDIS_NODES"
    )]
    nodes: Vec<String>,
}

#[derive(Args)]
pub struct LockArgs {
    /// The lock name (the Redis key).
    name: String,
    #[command(flatten)]
    nodes: Nodes,
    /// Lease length; extended every third of it while CMD runs.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    ttl: Duration,
    /// Time CMD needs: refuse to start it with less validity than this.
    #[arg(long, value_parser = duration_arg)]
    work: Option<Duration>,
    /// Give up acquiring after this long (retries included).
    #[arg(long, value_parser = duration_arg)]
    wait: Option<Duration>,
    /// Per-node request timeout (default: derived from the TTL).
    #[arg(long, value_parser = duration_arg)]
    node_timeout: Option<Duration>,
    /// Clock-drift allowance (default: 1% of the TTL + 2 ms).
    #[arg(long, value_parser = duration_arg)]
    drift: Option<Duration>,
    /// Do not count nodes up for less than this (the delayed-restart rule); set it
    /// to the longest TTL in use.
    #[arg(long, value_parser = duration_arg)]
    min_uptime: Option<Duration>,
    /// Time CMD gets between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    grace: Duration,
    /// At exit, write the lock-safety figures (validity at grant, validity
    /// left at release, time CMD ran past it) to this file in Prometheus' text
    /// format — for node_exporter's textfile collector.
    #[arg(long)]
    metrics_file: Option<std::path::PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(Args)]
pub struct AuditArgs {
    #[command(flatten)]
    nodes: Nodes,
    /// The longest TTL the set is used for; nodes up for less are reported.
    #[arg(long, value_parser = duration_arg)]
    max_ttl: Option<Duration>,
    /// Time allowed to each node.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    timeout: Duration,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct BudgetArgs {
    /// Lease length.
    #[arg(long, value_parser = duration_arg)]
    ttl: Duration,
    /// Time the acquisition took (or is expected to take).
    #[arg(long, value_parser = duration_arg)]
    acquire: Duration,
    /// Clock-drift allowance (default: 1% of the TTL + 2 ms).
    #[arg(long, value_parser = duration_arg)]
    drift: Option<Duration>,
    /// Time the work needs.
    #[arg(long, value_parser = duration_arg)]
    work: Option<Duration>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs a Redis subcommand; returns the exit status.
pub async fn run(command: RedisCommand) -> Result<i32> {
    match command {
        RedisCommand::Lock(a) => lock(a).await,
        RedisCommand::Audit(a) => audit(a).await,
        RedisCommand::Budget(a) => Ok(budget(a)),
    }
}

async fn lock(a: LockArgs) -> Result<i32> {
    let config = RedlockConfig {
        node_timeout: a.node_timeout,
        drift: a.drift,
        min_uptime: a.min_uptime,
        ..RedlockConfig::default()
    };
    let manager = match Redlock::new(&a.nodes.nodes, config) {
        Ok(m) => m,
        Err(e) => {
            // Bad input, said once (not again as its own cause).
            eprintln!("palisade: {e}");
            return Ok(exit::USAGE);
        }
    };
    let options = AcquireOptions {
        ttl: a.ttl,
        work: a.work.unwrap_or_default(),
        wait: a.wait,
    };
    let guard = match manager.acquire(&a.name, &options).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("palisade: lock {:?} not obtained: {e}", a.name);
            return Ok(if e.is_retryable() {
                exit::NOT_OBTAINED
            } else {
                exit::USAGE
            });
        }
    };
    let safety = palisade_core::safety::LockSafety::new();
    safety.granted_with_validity(guard.remaining());
    eprintln!(
        "palisade: holding {:?} on {} node(s) (quorum {}), validity {:.3} s; no fencing token (efficiency lock)",
        a.name,
        manager.node_count(),
        manager.quorum(),
        guard.remaining().as_secs_f64()
    );
    let env = [
        ("PALISADE_LOCK".to_owned(), a.name.clone()),
        (
            "PALISADE_LOCK_VALIDITY_MS".to_owned(),
            guard.remaining().as_millis().to_string(),
        ),
    ];
    let renew_every = a.ttl / 3;
    let lost = async {
        let expiry = guard.lost();
        tokio::pin!(expiry);
        loop {
            tokio::select! {
                () = &mut expiry => return "the validity ran out".to_owned(),
                () = tokio::time::sleep(renew_every) => {
                    if let Err(e) = guard.extend().await {
                        return format!("extension failed: {e}");
                    }
                }
            }
        }
    };
    let ended = run_holding(&a.command, &env, lost, a.grace).await;
    safety.work_ended(
        palisade_core::EfficiencyLease::guaranteed_until(&guard),
        std::time::Instant::now(),
    );
    // The process exits next: wait until every node has the delete.
    let released = guard.release_everywhere().await;
    crate::server_cmd::write_safety(a.metrics_file.as_deref(), &safety);
    match ended? {
        Ended::Exited(status) => {
            if let Err(e) = released {
                eprintln!("palisade: release of {:?}: {e}", a.name);
            }
            Ok(shell_status(status))
        }
        Ended::Lost { reason, status } => {
            eprintln!(
                "palisade: lock {:?} lost ({reason}); stopped the command ({status})",
                a.name
            );
            Ok(exit::LOST)
        }
    }
}

async fn audit(a: AuditArgs) -> Result<i32> {
    let report = palisade_redis::audit::audit(&a.nodes.nodes, a.max_ttl, a.timeout).await?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{:<28} {:<9} {:<7} {:<10} {:<10} {:<9} {:>9}  run_id",
            "node", "host", "role", "appendonly", "fsync", "replicas", "uptime_s"
        );
        for n in &report.nodes {
            let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            println!(
                "{:<28} {:<9} {:<7} {:<10} {:<10} {:<9} {:>9}  {}",
                n.url,
                or(&n.host),
                if n.reachable {
                    or(&n.role)
                } else {
                    "DOWN".into()
                },
                or(&n.appendonly),
                or(&n.appendfsync),
                n.replicas.len(),
                n.uptime_s.map_or("-".into(), |u| u.to_string()),
                n.run_id.as_deref().map_or("-", |r| &r[..r.len().min(12)]),
            );
        }
        println!();
        for f in &report.findings {
            let tag = match f.severity {
                palisade_redis::audit::Severity::Violation => "VIOLATION",
                palisade_redis::audit::Severity::Warning => "warning",
            };
            println!("{tag:<9} {:<22} {}", f.kind, f.message);
        }
        println!(
            "\n{}",
            if report.independent {
                "verdict: the nodes meet Redlock's independence assumption"
            } else {
                "verdict: the nodes do NOT meet Redlock's independence assumption"
            }
        );
    }
    Ok(if report.independent { 0 } else { exit::FAILURE })
}

fn budget(a: BudgetArgs) -> i32 {
    let b = Budget {
        ttl: a.ttl,
        acquire: a.acquire,
        drift: a.drift.unwrap_or_else(|| default_drift(a.ttl)),
        work: a.work,
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let may_start = b.may_start();
    if a.json {
        let v = serde_json::json!({
            "ttl_ms": ms(b.ttl),
            "acquire_ms": ms(b.acquire),
            "drift_ms": ms(b.drift),
            "usable_ms": b.usable_ms(),
            "work_ms": b.work.map(ms),
            "may_start": may_start,
        });
        println!("{v}");
    } else {
        let s = |d: Duration| format!("{:>9.3} s", d.as_secs_f64());
        println!("ttl      {}", s(b.ttl));
        println!("acquire  {}", s(b.acquire));
        println!("drift    {}", s(b.drift));
        println!(
            "usable   {:>9.3} s   (ttl - acquire - drift)",
            b.usable_ms() as f64 / 1000.0
        );
        if let Some(w) = b.work {
            println!("work     {}", s(w));
        }
        let usable = b.usable_ms() as f64 / 1000.0;
        match (may_start, b.work) {
            (true, Some(w)) => println!(
                "verdict  the work may start: it needs {:.3} s of the {usable:.3} s usable",
                w.as_secs_f64()
            ),
            (true, None) => println!("verdict  work that fits in {usable:.3} s may start"),
            (false, Some(w)) => println!(
                "verdict  the work must NOT start: it needs {:.3} s, only {usable:.3} s are usable",
                w.as_secs_f64()
            ),
            (false, None) => println!("verdict  nothing is usable: no work may start"),
        }
    }
    if may_start { 0 } else { exit::FAILURE }
}
