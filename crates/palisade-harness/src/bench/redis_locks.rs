//! `palisade bench redis`.
//!
//! One run, the same servers for every row: the raw `SET NX PX` + `DEL` round
//! trips (the floor), the single-instance lock, Redlock with N=5, and Redlock with
//! one of the five nodes behind a proxy that adds 20 ms to every round trip. Each
//! with 1 client and with 16 concurrent clients on distinct keys; each client has
//! its own connections, as separate processes would.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_faultproxy::FaultProxy;
use palisade_redis::{AcquireOptions, Redlock, RedlockConfig};
use palisade_testkit::RedisServer;
use serde::Serialize;

use super::stats::{Samples, Sorted};
use crate::duration_arg;

/// Arguments of `palisade bench redis`.
#[derive(Args)]
pub struct RedisBenchArgs {
    /// Use these five nodes instead of starting local servers.
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// Measuring time per row, split over the rounds.
    #[arg(long, default_value = "6s", value_parser = duration_arg)]
    duration: Duration,
    /// The rows are measured in this many interleaved rounds and the samples
    /// pooled, so that a passing disturbance (or the scheduler's placement of the
    /// processes on this machine's cores) does not land on one row only.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Concurrent clients of the multi-client rows.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Round-trip time added to the slow node.
    #[arg(long, default_value = "20ms", value_parser = duration_arg)]
    slow: Duration,
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the rows (`redis-bench.json`) and the acquire-latency
    /// distributions as a picture (`redis-acquire-cdf.svg`) into this directory.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Raw,
    Single,
    Redlock,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Raw => "raw-set-del",
            Backend::Single => "redis-single",
            Backend::Redlock => "redlock-5",
        }
    }
}

/// One row of the result.
#[derive(Serialize)]
struct Row {
    backend: &'static str,
    clients: usize,
    slow_node_ms: u64,
    acquire_p50_us: Option<u64>,
    acquire_p99_us: Option<u64>,
    release_p50_us: Option<u64>,
    release_p99_us: Option<u64>,
    pairs_per_s: f64,
    pairs: usize,
    failed_acquires: usize,
}

/// Runs the benchmark; returns the exit status.
pub async fn run(a: RedisBenchArgs) -> Result<i32> {
    let (_servers, urls) = if a.nodes.is_empty() {
        let servers = (0..5)
            .map(|_| RedisServer::start())
            .collect::<std::io::Result<Vec<_>>>()
            .context("starting 5 redis-servers (apt-get install redis-server)")?;
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        (servers, urls)
    } else {
        if a.nodes.len() != 5 {
            bail!("--nodes takes exactly five URLs");
        }
        (Vec::new(), a.nodes.clone())
    };
    let last = url::Url::parse(&urls[4])?;
    let upstream = tokio::net::lookup_host((
        last.host_str().context("node URL without host")?,
        last.port().unwrap_or(6379),
    ))
    .await?
    .next()
    .context("cannot resolve the fifth node")?;
    let proxy = FaultProxy::start(upstream).await?;
    // The proxy delays each direction, so half the added round trip each way.
    proxy.link().set_delay(a.slow / 2);
    let mut slow_urls = urls[..4].to_vec();
    slow_urls.push(format!("redis://{}", proxy.addr()));

    let plan: Vec<(Backend, usize, bool)> = [1, a.clients]
        .into_iter()
        .flat_map(|c| {
            [
                (Backend::Raw, c, false),
                (Backend::Single, c, false),
                (Backend::Redlock, c, false),
                (Backend::Redlock, c, true),
            ]
        })
        .collect();
    let rounds = a.rounds.max(1);
    let bar = ProgressBar::new(plan.len() as u64 * u64::from(rounds)).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
    );
    let slice = a.duration / rounds;
    let mut acc: Vec<Measured> = plan.iter().map(|_| Measured::default()).collect();
    for round in 1..=rounds {
        for ((backend, clients, slow), acc) in plan.iter().copied().zip(acc.iter_mut()) {
            bar.set_message(format!(
                "round {round}/{rounds}: {} × {clients}{}",
                backend.name(),
                if slow { " (slow node)" } else { "" }
            ));
            let nodes = match (backend, slow) {
                (Backend::Redlock, true) => slow_urls.clone(),
                (Backend::Redlock, false) => urls.clone(),
                _ => urls[..1].to_vec(),
            };
            acc.add(measure(backend, clients, &nodes, slice).await?);
            bar.inc(1);
        }
    }
    let (rows, acquires): (Vec<Row>, Vec<Sorted>) = plan
        .iter()
        .zip(acc)
        .map(|((backend, clients, slow), m)| {
            m.row(
                backend.name(),
                *clients,
                if *slow { a.slow } else { Duration::ZERO },
            )
        })
        .unzip();
    bar.finish_and_clear();
    if let Some(dir) = &a.out {
        let series: Vec<(String, &Sorted)> = rows
            .iter()
            .zip(&acquires)
            .map(|(r, s)| {
                let slow = if r.slow_node_ms > 0 {
                    format!(", {} ms node", r.slow_node_ms)
                } else {
                    String::new()
                };
                (format!("{} ×{}{slow}", r.backend, r.clients), s)
            })
            .collect();
        super::write_outputs(
            dir,
            "redis-bench.json",
            &rows,
            "redis-acquire-cdf.svg",
            &super::svg::cdf_chart("Redis locks: acquire latency (CDF)", &series),
        )?;
    }
    if a.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        print_table(&rows);
    }
    Ok(0)
}

/// Samples of one row, pooled over rounds.
#[derive(Default)]
struct Measured {
    acquire: Samples,
    release: Samples,
    failed: usize,
    wall: Duration,
}

impl Measured {
    fn add(&mut self, other: Measured) {
        self.acquire.extend(other.acquire);
        self.release.extend(other.release);
        self.failed += other.failed;
        self.wall += other.wall;
    }

    fn row(self, backend: &'static str, clients: usize, slow: Duration) -> (Row, Sorted) {
        let pairs = self.release.len();
        let (acq, rel) = (self.acquire.sorted(), self.release.sorted());
        let row = Row {
            backend,
            clients,
            slow_node_ms: slow.as_millis() as u64,
            acquire_p50_us: acq.percentile(50.0),
            acquire_p99_us: acq.percentile(99.0),
            release_p50_us: rel.percentile(50.0),
            release_p99_us: rel.percentile(99.0),
            pairs_per_s: (pairs as f64 / self.wall.as_secs_f64()).round(),
            pairs,
            failed_acquires: self.failed,
        };
        (row, acq)
    }
}

async fn measure(
    backend: Backend,
    clients: usize,
    nodes: &[String],
    duration: Duration,
) -> Result<Measured> {
    let mut tasks = Vec::new();
    for client in 0..clients {
        let nodes = nodes.to_vec();
        tasks.push(tokio::spawn(async move {
            client_loop(backend, client, nodes, duration).await
        }));
    }
    let mut m = Measured::default();
    for t in tasks {
        let (a, r, f, took) = t.await??;
        // Each client's clock starts once it is connected; the row's wall time
        // is the longest of them.
        m.wall = m.wall.max(took);
        m.acquire.extend(a);
        m.release.extend(r);
        m.failed += f;
    }
    Ok(m)
}

/// One client: acquire + release on its own key until `duration` has passed.
async fn client_loop(
    backend: Backend,
    client: usize,
    nodes: Vec<String>,
    duration: Duration,
) -> Result<(Samples, Samples, usize, Duration)> {
    let key = format!("bench:{}:{client}", backend.name());
    let (mut acq, mut rel, mut failed) = (Samples::default(), Samples::default(), 0);
    let ttl = Duration::from_secs(10);
    let warmup = 50;
    let mut i = 0usize;
    if backend == Backend::Raw {
        let mut conn = redis::Client::open(nodes[0].as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let started = Instant::now();
        while started.elapsed() < duration {
            let t = Instant::now();
            let ok: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("v")
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            let t_acq = t.elapsed();
            let t = Instant::now();
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
            let t_rel = t.elapsed();
            if ok.is_none() {
                failed += 1;
            } else if i >= warmup {
                acq.push(t_acq);
                rel.push(t_rel);
            }
            i += 1;
        }
        return Ok((acq, rel, failed, started.elapsed()));
    }
    let manager = Redlock::connect(
        &nodes,
        RedlockConfig {
            retry_count: 0,
            ..RedlockConfig::default()
        },
        Duration::from_secs(2),
    )
    .await?;
    let opts = AcquireOptions::new(ttl);
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        let guard = manager.acquire(&key, &opts).await;
        let t_acq = t.elapsed();
        match guard {
            Ok(g) => {
                let t = Instant::now();
                g.release().await?;
                if i >= warmup {
                    acq.push(t_acq);
                    rel.push(t.elapsed());
                }
            }
            Err(_) => failed += 1,
        }
        i += 1;
    }
    Ok((acq, rel, failed, started.elapsed()))
}

fn print_table(rows: &[Row]) {
    let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "{:<13} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "backend",
        "clients",
        "slow_ms",
        "acq_p50",
        "acq_p99",
        "rel_p50",
        "rel_p99",
        "pairs/s",
        "failed"
    );
    for r in rows {
        println!(
            "{:<13} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10.0} {:>7}",
            r.backend,
            r.clients,
            r.slow_node_ms,
            f(r.acquire_p50_us),
            f(r.acquire_p99_us),
            f(r.release_p50_us),
            f(r.release_p99_us),
            r.pairs_per_s,
            r.failed_acquires
        );
    }
    println!("(latencies in µs; acquire+release pairs per second over all clients)");
}
