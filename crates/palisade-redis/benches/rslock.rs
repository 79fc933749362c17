//! Palisade's Redlock against the `rslock` crate (0.10), in one run, on the same
//! five local `redis-server`s (no persistence), with the same loop: acquire a
//! lock of the task's own, release it, again, for a fixed time. Rows:
//!
//! - `raw-set-del × 1`: one task sending `SET key v NX PX` + `DEL` to the first
//!   node on a multiplexed connection (redis-rs defaults): the floor.
//! - `palisade × 1`, `rslock × 1`: one task, Redlock over the five nodes.
//! - `palisade × 16`, `rslock × 16`: sixteen tasks sharing one manager.
//!
//! Rows are measured in interleaved rounds and pooled, so that a passing
//! disturbance does not land on one row only. Each row also says how much CPU
//! the bench process (`client_us`) and the five servers (`servers_us`) used per
//! pair: on a small machine they share the cores, so a client that costs less
//! leaves more to the servers.
//!
//! ```text
//! cargo bench -p palisade-redis --bench rslock [-- --seconds 6 --rounds 3 --tasks 16]
//! cargo bench -p palisade-redis --bench rslock -- --only palisade16,rslock16
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_redis::{AcquireOptions, Redlock, RedlockConfig};
use palisade_testkit::{RedisServer, cpu_time};

type Error = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Contender {
    Raw,
    Palisade,
    Rslock,
}

/// A shared handle of one row.
#[derive(Clone)]
enum Manager {
    Raw(redis::aio::MultiplexedConnection),
    Palisade(Redlock),
    Rslock(Arc<rslock::LockManager>),
}

/// Acquire latencies (µs) and completed pairs of one row.
#[derive(Default)]
struct Row {
    acquire_us: Vec<u64>,
    pairs: usize,
    failed: usize,
    wall: Duration,
    /// CPU time of the bench process and of the servers during the row.
    client_cpu: Duration,
    servers_cpu: Duration,
    /// Palisade's batches and the requests they carried (`Redlock::batch_stats`).
    batches: u64,
    requests: u64,
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seconds = arg("--seconds", 6);
    let rounds = arg("--rounds", 3).max(1) as u32;
    let tasks = arg("--tasks", 16) as usize;
    // Rows to run, by name and tasks (`palisade16`); all of them by default.
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(Duration::from_secs(seconds), rounds, tasks, only))
}

async fn run(
    duration: Duration,
    rounds: u32,
    tasks: usize,
    only: Option<Vec<String>>,
) -> Result<(), Error> {
    let servers = (0..5)
        .map(|_| RedisServer::start())
        .collect::<std::io::Result<Vec<_>>>()?;
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let server_pids: Vec<u32> = servers.iter().filter_map(RedisServer::pid).collect();
    let me = [std::process::id()];
    let plan: Vec<(Contender, usize)> = [
        (Contender::Raw, 1),
        (Contender::Palisade, 1),
        (Contender::Rslock, 1),
        (Contender::Palisade, tasks),
        (Contender::Rslock, tasks),
    ]
    .into_iter()
    .filter(|(c, t)| only.as_ref().is_none_or(|o| o.contains(&key(*c, *t))))
    .collect();
    let mut rows: Vec<Row> = plan.iter().map(|_| Row::default()).collect();
    let slice = duration / rounds;
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        for ((contender, tasks), row) in plan.iter().zip(rows.iter_mut()) {
            let cpu_before = (cpu_time(&me), cpu_time(&server_pids));
            let m = measure(*contender, *tasks, &urls, slice).await?;
            let spent = |before: Option<Duration>, now: Option<Duration>| {
                now.zip(before)
                    .map(|(n, b)| n.saturating_sub(b))
                    .unwrap_or_default()
            };
            row.client_cpu += spent(cpu_before.0, cpu_time(&me));
            row.servers_cpu += spent(cpu_before.1, cpu_time(&server_pids));
            row.acquire_us.extend(m.acquire_us);
            row.pairs += m.pairs;
            row.failed += m.failed;
            row.wall += m.wall;
            row.batches += m.batches;
            row.requests += m.requests;
        }
    }
    println!(
        "{:<13} {:>6} {:>9} {:>9} {:>10} {:>7} {:>10} {:>10} {:>6}",
        "contender",
        "tasks",
        "acq_p50",
        "acq_p99",
        "pairs/s",
        "failed",
        "client_us",
        "servers_us",
        "batch"
    );
    let mut rates = Vec::new();
    let mut p50s = Vec::new();
    for ((contender, tasks), row) in plan.iter().zip(rows.iter_mut()) {
        row.acquire_us.sort_unstable();
        let p = |q: f64| percentile(&row.acquire_us, q);
        let rate = row.pairs as f64 / row.wall.as_secs_f64();
        let per_pair = |cpu: Duration| cpu.as_micros() as f64 / row.pairs.max(1) as f64;
        let name = match contender {
            Contender::Raw => "raw-set-del",
            Contender::Palisade => "palisade",
            Contender::Rslock => "rslock",
        };
        let batch = if row.batches > 0 {
            format!("{:.1}", row.requests as f64 / row.batches as f64)
        } else {
            "-".to_owned()
        };
        println!(
            "{name:<13} {tasks:>6} {:>9} {:>9} {rate:>10.0} {:>7} {:>10.1} {:>10.1} {batch:>6}",
            p(50.0),
            p(99.0),
            row.failed,
            per_pair(row.client_cpu),
            per_pair(row.servers_cpu),
        );
        rates.push((key(*contender, *tasks), rate));
        p50s.push((key(*contender, *tasks), p(50.0) as f64));
    }
    println!(
        "(acquire latencies in µs; acquire+release pairs per second over all tasks; \
         CPU µs per pair of the bench process and of the five servers; \
         batch: Palisade's mean requests per pipeline)"
    );
    let find = |v: &[(String, f64)], c: Contender, t: usize| {
        v.iter().find(|(k, _)| *k == key(c, t)).map(|(_, x)| *x)
    };
    let (p, r) = (Contender::Palisade, Contender::Rslock);
    if let (Some(a), Some(b)) = (find(&rates, p, tasks), find(&rates, r, tasks)) {
        println!(
            "palisade ×{tasks} shared ÷ rslock ×{tasks} shared: {:.2} (goal ≥ 2)",
            a / b
        );
    }
    if let (Some(a), Some(b)) = (find(&rates, p, 1), find(&rates, Contender::Raw, 1)) {
        println!("palisade ×1 ÷ raw SET+DEL ×1: {:.2} (goal ≥ 0.9)", a / b);
    }
    if let (Some(a), Some(b)) = (find(&p50s, p, 1), find(&p50s, r, 1)) {
        println!(
            "palisade ×1 acquire p50 ÷ rslock ×1's: {:.2} (goal ≤ 0.6)",
            a / b
        );
    }
    Ok(())
}

/// A row's name for `--only`: the contender and its tasks, as `palisade16`.
fn key(contender: Contender, tasks: usize) -> String {
    let name = match contender {
        Contender::Raw => "raw",
        Contender::Palisade => "palisade",
        Contender::Rslock => "rslock",
    };
    format!("{name}{tasks}")
}

async fn measure(
    contender: Contender,
    tasks: usize,
    urls: &[String],
    duration: Duration,
) -> Result<Row, Error> {
    let manager = match contender {
        Contender::Raw => Manager::Raw(
            redis::Client::open(urls[0].as_str())?
                .get_multiplexed_async_connection()
                .await?,
        ),
        Contender::Palisade => Manager::Palisade(
            Redlock::connect(
                urls,
                RedlockConfig {
                    retry_count: 0,
                    ..RedlockConfig::default()
                },
                Duration::from_secs(2),
            )
            .await?,
        ),
        Contender::Rslock => {
            let mut m = rslock::LockManager::new(urls.to_vec());
            m.set_retry(1, Duration::from_millis(1));
            Manager::Rslock(Arc::new(m))
        }
    };
    let mut handles = Vec::new();
    for task in 0..tasks {
        let manager = manager.clone();
        handles.push(tokio::spawn(task_loop(manager, task, duration)));
    }
    let mut row = Row::default();
    for h in handles {
        let r = h.await??;
        row.acquire_us.extend(r.acquire_us);
        row.pairs += r.pairs;
        row.failed += r.failed;
        row.wall = row.wall.max(r.wall);
    }
    if let Manager::Palisade(m) = &manager {
        let stats = m.batch_stats();
        (row.batches, row.requests) = (stats.batches, stats.requests);
    }
    Ok(row)
}

async fn task_loop(manager: Manager, task: usize, duration: Duration) -> Result<Row, Error> {
    let key = format!("bench:rslock-vs:{task}");
    let opts = AcquireOptions::new(TTL);
    let mut row = Row::default();
    // The first pairs warm connections; their latencies are left out.
    let warmup = 50;
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        let acquired = match &manager {
            Manager::Raw(conn) => {
                let mut conn = conn.clone();
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("v")
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut conn)
                    .await?;
                let took = t.elapsed();
                let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
                set.map(|_| took)
            }
            Manager::Palisade(m) => match m.acquire(&key, &opts).await {
                Ok(guard) => {
                    let took = t.elapsed();
                    guard.release().await?;
                    Some(took)
                }
                Err(_) => None,
            },
            Manager::Rslock(m) => match m.lock(key.as_bytes(), TTL).await {
                Ok(lock) => {
                    let took = t.elapsed();
                    m.unlock(&lock).await;
                    Some(took)
                }
                Err(_) => None,
            },
        };
        match acquired {
            Some(took) => {
                if row.pairs >= warmup {
                    row.acquire_us.push(took.as_micros() as u64);
                }
                row.pairs += 1;
            }
            None => row.failed += 1,
        }
    }
    row.wall = started.elapsed();
    Ok(row)
}

/// Nearest-rank percentile of sorted samples; 0 without samples.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
