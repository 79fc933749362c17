//! `palisade bench redis`.
//!
//! One run, the same servers for every row: the raw `SET NX PX` + `DEL` round
//! trips (the floor), the single-instance lock, Redlock with N=5, and Redlock with
//! one of the five nodes behind a proxy that adds 20 ms to every round trip —
//! and its twin, the same proxy adding nothing, so that the slow node's cost is
//! told apart from the proxy's own (it runs in this process, on the same cores). Each
//! with 1 client and with 16, 64 and 256 concurrent clients on distinct keys
//! sharing one manager (one multiplexed connection per node, the way a service's
//! tasks use it), and with 16 clients that each have their own manager and
//! connections, as separate processes would.

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
    /// Concurrent clients of the multi-client rows, comma-separated. Each count
    /// gets rows whose clients share one manager; the first also gets rows whose
    /// clients each have their own.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    clients: Vec<usize>,
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
    /// Whether the clients share one manager (one connection per node) rather
    /// than each having its own; `false` for the one-client rows.
    shared_manager: bool,
    slow_node_ms: u64,
    /// The fifth node is reached through the fault proxy (adding `slow_node_ms`).
    proxied_node: bool,
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
    let mut slow_urls = urls[..4].to_vec();
    slow_urls.push(format!("redis://{}", proxy.addr()));

    if a.clients.iter().any(|c| *c < 2) {
        bail!("--clients counts are of concurrent clients: 2 or more");
    }
    let plan = plan(&a.clients);
    let rounds = a.rounds.max(1);
    let bar = ProgressBar::new(plan.len() as u64 * u64::from(rounds)).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
    );
    let slice = a.duration / rounds;
    let mut acc: Vec<Measured> = plan.iter().map(|_| Measured::default()).collect();
    for round in 1..=rounds {
        for (spec, acc) in plan.iter().copied().zip(acc.iter_mut()) {
            bar.set_message(format!("round {round}/{rounds}: {}", spec.label()));
            let nodes = match (spec.backend, spec.fifth) {
                (Backend::Redlock, Fifth::Direct) => urls.clone(),
                (Backend::Redlock, fifth) => {
                    // The proxy delays each direction: half the added round trip each way.
                    let delay = if fifth == Fifth::Slowed {
                        a.slow / 2
                    } else {
                        Duration::ZERO
                    };
                    proxy.link().set_delay(delay);
                    slow_urls.clone()
                }
                _ => urls[..1].to_vec(),
            };
            acc.add(measure(spec, &nodes, slice).await?);
            bar.inc(1);
        }
    }
    let (rows, acquires): (Vec<Row>, Vec<Sorted>) = plan
        .iter()
        .zip(acc)
        .map(|(spec, m)| {
            let slow = if spec.fifth == Fifth::Slowed {
                a.slow
            } else {
                Duration::ZERO
            };
            m.row(*spec, slow)
        })
        .unzip();
    bar.finish_and_clear();
    if let Some(dir) = &a.out {
        let series: Vec<(String, &Sorted)> = rows
            .iter()
            .zip(&acquires)
            .map(|(r, s)| {
                let slow = if r.proxied_node {
                    format!(", {} ms node", r.slow_node_ms)
                } else {
                    String::new()
                };
                let own = if r.clients > 1 && !r.shared_manager {
                    ", own managers"
                } else {
                    ""
                };
                (format!("{} ×{}{own}{slow}", r.backend, r.clients), s)
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

/// Samples of one row (or of one client), pooled over rounds.
#[derive(Default)]
struct Measured {
    /// Latencies, without each client's first few pairs (connections warming).
    acquire: Samples,
    release: Samples,
    /// Every completed acquire+release pair, warm-up included, for the rate.
    pairs: usize,
    failed: usize,
    wall: Duration,
}

impl Measured {
    fn add(&mut self, other: Measured) {
        self.acquire.extend(other.acquire);
        self.release.extend(other.release);
        self.pairs += other.pairs;
        self.failed += other.failed;
        self.wall += other.wall;
    }

    fn row(self, spec: Spec, slow: Duration) -> (Row, Sorted) {
        let pairs = self.pairs;
        let (acq, rel) = (self.acquire.sorted(), self.release.sorted());
        let row = Row {
            backend: spec.backend.name(),
            clients: spec.clients,
            shared_manager: spec.shared,
            slow_node_ms: slow.as_millis() as u64,
            proxied_node: spec.fifth != Fifth::Direct,
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

/// One row of the plan.
#[derive(Clone, Copy)]
struct Spec {
    backend: Backend,
    clients: usize,
    /// How Redlock reaches its fifth node.
    fifth: Fifth,
    /// The clients share one manager (or, raw, one connection).
    shared: bool,
}

impl Spec {
    fn label(self) -> String {
        format!(
            "{} × {}{}{}",
            self.backend.name(),
            self.clients,
            if self.clients > 1 && !self.shared {
                " (own managers)"
            } else {
                ""
            },
            match self.fifth {
                Fifth::Direct => "",
                Fifth::Proxied => " (node via proxy)",
                Fifth::Slowed => " (slow node)",
            }
        )
    }
}

/// How Redlock reaches its fifth node (the single-node rows use the first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fifth {
    Direct,
    /// Through the fault proxy, adding nothing: the slowed row's twin.
    Proxied,
    /// Through the fault proxy, adding `--slow` to every round trip.
    Slowed,
}

/// The rows, in order: one client; each multi-client count with a shared
/// manager; the first count with a manager per client.
fn plan(multi: &[usize]) -> Vec<Spec> {
    let group = |clients: usize, shared: bool| {
        [
            (Backend::Raw, Fifth::Direct),
            (Backend::Single, Fifth::Direct),
            (Backend::Redlock, Fifth::Direct),
            (Backend::Redlock, Fifth::Proxied),
            (Backend::Redlock, Fifth::Slowed),
        ]
        .map(|(backend, fifth)| Spec {
            backend,
            clients,
            fifth,
            shared,
        })
    };
    let mut plan = group(1, false).to_vec();
    for &c in multi {
        plan.extend(group(c, true));
    }
    if let Some(&c) = multi.first() {
        plan.extend(group(c, false));
    }
    plan
}

/// What the clients of a row lock with: the raw commands on a connection, or a
/// lock manager.
#[derive(Clone)]
enum Handle {
    Raw(redis::aio::MultiplexedConnection),
    Manager(Redlock),
}

impl Handle {
    async fn open(backend: Backend, nodes: &[String]) -> Result<Handle> {
        Ok(if backend == Backend::Raw {
            Handle::Raw(
                redis::Client::open(nodes[0].as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            )
        } else {
            Handle::Manager(
                Redlock::connect(
                    nodes,
                    RedlockConfig {
                        retry_count: 0,
                        ..RedlockConfig::default()
                    },
                    Duration::from_secs(2),
                )
                .await?,
            )
        })
    }
}

async fn measure(spec: Spec, nodes: &[String], duration: Duration) -> Result<Measured> {
    let shared = if spec.shared {
        Some(Handle::open(spec.backend, nodes).await?)
    } else {
        None
    };
    let mut tasks = Vec::new();
    for client in 0..spec.clients {
        let nodes = nodes.to_vec();
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            let handle = match shared {
                Some(h) => h,
                None => Handle::open(spec.backend, &nodes).await?,
            };
            client_loop(spec.backend, client, handle, duration).await
        }));
    }
    let mut m = Measured::default();
    for t in tasks {
        let client = t.await??;
        // Each client's clock starts once it is connected; the row's wall time
        // is the longest of them.
        let wall = m.wall.max(client.wall);
        m.add(client);
        m.wall = wall;
    }
    Ok(m)
}

/// One client: acquire + release on its own key until `duration` has passed.
async fn client_loop(
    backend: Backend,
    client: usize,
    handle: Handle,
    duration: Duration,
) -> Result<Measured> {
    let key = format!("bench:{}:{client}", backend.name());
    let mut m = Measured::default();
    let ttl = Duration::from_secs(10);
    let warmup = 50;
    let mut i = 0usize;
    let started = Instant::now();
    match handle {
        Handle::Raw(mut conn) => {
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
                    m.failed += 1;
                } else {
                    m.pairs += 1;
                    if i >= warmup {
                        m.acquire.push(t_acq);
                        m.release.push(t_rel);
                    }
                }
                i += 1;
            }
        }
        Handle::Manager(manager) => {
            let opts = AcquireOptions::new(ttl);
            while started.elapsed() < duration {
                let t = Instant::now();
                let guard = manager.acquire(&key, &opts).await;
                let t_acq = t.elapsed();
                match guard {
                    Ok(g) => {
                        let t = Instant::now();
                        g.release().await?;
                        m.pairs += 1;
                        if i >= warmup {
                            m.acquire.push(t_acq);
                            m.release.push(t.elapsed());
                        }
                    }
                    Err(_) => m.failed += 1,
                }
                i += 1;
            }
        }
    }
    m.wall = started.elapsed();
    Ok(m)
}

fn print_table(rows: &[Row]) {
    let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "{:<13} {:>7} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7}",
        "backend",
        "clients",
        "shared",
        "node5_ms",
        "acq_p50",
        "acq_p99",
        "rel_p50",
        "rel_p99",
        "pairs/s",
        "failed"
    );
    for r in rows {
        println!(
            "{:<13} {:>7} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10.0} {:>7}",
            r.backend,
            r.clients,
            if r.clients == 1 {
                "-"
            } else if r.shared_manager {
                "yes"
            } else {
                "no"
            },
            if r.proxied_node {
                format!("+{}", r.slow_node_ms)
            } else {
                "-".to_owned()
            },
            f(r.acquire_p50_us),
            f(r.acquire_p99_us),
            f(r.release_p50_us),
            f(r.release_p99_us),
            r.pairs_per_s,
            r.failed_acquires
        );
    }
    println!(
        "(latencies in µs; acquire+release pairs per second over all clients; shared: \
         the clients share one manager, one connection per node; node5_ms: redlock's \
         fifth node through the fault proxy, adding this much per round trip)"
    );
}
