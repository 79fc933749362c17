//! `palisade bench lock`: every correctness-lock backend measured the same way,
//! in one run, through the [`FencedLocks`] trait only — Palisade (1 and 3
//! nodes), ZooKeeper (3 servers), etcd (3 members) and PostgreSQL, started on
//! loopback by the bench itself, or the backends named by `--backend URL,…`.
//!
//! The two workloads (shared with `palisade bench server`):
//! - uncontended: N clients, each with its own session, acquire and release a
//!   lock of their own, back to back: acquire latency and pairs per second;
//! - contended: C clients queue for ONE lock; each holder releases at once. The
//!   handoff is the time from the holder starting its release to the next holder
//!   being granted, on this process's monotonic clock (all clients live here).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_core::{FencedLocks, LockOptions};
use palisade_testkit::servers::{Launch, Servers};
use serde::Serialize;

use super::stats::{Samples, Sorted};
use crate::backends::{self, BackendUrl, SessionSpec};
use crate::duration_arg;

/// Arguments of `palisade bench lock`.
#[derive(Args)]
pub struct LockBenchArgs {
    /// Backends to measure, by URL (`palisade://H:P,…`, `zk://H:P,…`,
    /// `etcd://H:P,…`, `postgres://USER@H:P/DB`). Default: start Palisade with 1
    /// and 3 nodes, ZooKeeper standalone and with 3, etcd with 3 and
    /// PostgreSQL, and measure each.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    backend: Vec<String>,
    /// Measuring time per row.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    duration: Duration,
    /// Client counts of the uncontended rows (each client its own session).
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Clients queueing for the one lock of the contended row.
    #[arg(long, default_value_t = 8)]
    contenders: usize,
    /// The sessions' TTL.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    ttl: Duration,
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the rows (`lock-bench.json`) and the acquire and handoff
    /// latency distributions as a picture (`lock-latency-cdf.svg`) here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// One row of `palisade bench lock --json`.
#[derive(Serialize)]
struct Row {
    backend: String,
    nodes: usize,
    clients: usize,
    workload: &'static str,
    acquire_p50_us: Option<u64>,
    acquire_p99_us: Option<u64>,
    pairs_per_s: f64,
    handoff_p50_us: Option<u64>,
    handoff_p99_us: Option<u64>,
    pairs: usize,
}

/// What one workload measured.
pub struct Measured {
    /// Acquire latencies.
    pub acquire: Sorted,
    /// Handoff latencies (contended only).
    pub handoff: Sorted,
    /// Acquire+release pairs completed.
    pub pairs: usize,
    /// Pairs per second of wall time.
    pub pairs_per_s: f64,
}

/// One backend to measure.
struct Setup {
    url: BackendUrl,
    nodes: usize,
    /// The servers this run started (stopped when dropped); `None` for a
    /// backend given by URL.
    _servers: Option<Box<dyn Servers>>,
}

/// What the default run starts, in report order: each backend's launcher's
/// bench setups (the backend, how many servers, what the URL adds).
fn default_setups() -> Vec<(&'static str, usize, &'static str)> {
    palisade_testkit::servers::LAUNCHERS
        .iter()
        .flat_map(|l| l.bench.iter().map(|&(n, suffix)| (l.backend, n, suffix)))
        .collect()
}

fn start(exe: &std::path::Path, backend: &str, n: usize, suffix: &str) -> Result<Setup> {
    let launcher = palisade_testkit::servers::launcher(backend)
        .with_context(|| format!("no testkit launcher for {backend}"))?;
    let launch = Launch {
        exe: exe.to_owned(),
        servers: n,
        certs: None,
    };
    let servers = (launcher.start)(&launch)
        .with_context(|| format!("starting {backend} (apt-get install {})", launcher.package))?;
    let url = format!("{}{suffix}", servers.url()).parse::<BackendUrl>()?;
    Ok(Setup {
        url,
        nodes: servers.len(),
        _servers: Some(servers),
    })
}

/// The number of servers a URL names: its comma-separated hosts.
fn nodes_in(url: &BackendUrl) -> usize {
    let hosts = url.rest.split('/').next().unwrap_or_default();
    hosts.split(',').filter(|h| !h.is_empty()).count()
}

/// Runs the benchmark; returns the exit status.
pub async fn run(a: LockBenchArgs) -> Result<i32> {
    let given = a
        .backend
        .iter()
        .map(|u| u.parse::<BackendUrl>())
        .collect::<Result<Vec<_>, _>>();
    let given = match given {
        Ok(g) => g,
        Err(e) => {
            eprintln!("palisade bench lock: {e}");
            return Ok(crate::exit::USAGE);
        }
    };
    let exe = std::env::current_exe().context("locating the palisade binary")?;
    let defaults = default_setups();
    let count = if given.is_empty() {
        defaults.len()
    } else {
        given.len()
    };
    let bar = ProgressBar::new((count * (a.clients.len() + 1)) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
    );
    let spec = SessionSpec {
        ttl: a.ttl,
        ..SessionSpec::default()
    };
    let mut rows = Vec::new();
    let mut curves: Vec<(String, Sorted)> = Vec::new();
    for i in 0..count {
        // Started one at a time and stopped before the next: on 2 cores, one
        // backend's idle servers would otherwise tax the next one's numbers.
        let setup = if given.is_empty() {
            let (backend, n, suffix) = defaults[i];
            bar.set_message(format!("starting {backend} ×{n}"));
            tokio::task::block_in_place(|| start(&exe, backend, n, suffix))?
        } else {
            Setup {
                nodes: nodes_in(&given[i]),
                url: given[i].clone(),
                _servers: None,
            }
        };
        let name = backend_name(&setup.url);
        let label = format!("{name} ×{}", setup.nodes);
        for &clients in &a.clients {
            bar.set_message(format!("{label}, {clients} uncontended client(s)"));
            let sessions = open(&setup.url, &spec, clients).await?;
            let m = uncontended(sessions, a.duration).await?;
            rows.push(row(&name, setup.nodes, clients, "uncontended", &m));
            curves.push((format!("acquire, {label}, {clients} client(s)"), m.acquire));
            bar.inc(1);
        }
        bar.set_message(format!("{label}, {} contended clients", a.contenders));
        let sessions = open(&setup.url, &spec, a.contenders).await?;
        let m = contended(sessions, a.duration).await?;
        rows.push(row(&name, setup.nodes, a.contenders, "contended", &m));
        curves.push((
            format!("handoff, {label}, {} clients", a.contenders),
            m.handoff,
        ));
        bar.inc(1);
        tokio::task::block_in_place(move || drop(setup));
    }
    bar.finish_and_clear();
    if let Some(dir) = &a.out {
        let series: Vec<(String, &Sorted)> = curves.iter().map(|(l, s)| (l.clone(), s)).collect();
        super::write_outputs(
            dir,
            "lock-bench.json",
            &rows,
            "lock-latency-cdf.svg",
            &super::svg::cdf_chart(
                "Correctness locks: acquire and handoff latency (CDF)",
                &series,
            ),
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

/// The backend's name in rows: its descriptor's (`zookeeper` for `zk://`),
/// `-poll` added when the URL asks waiters to poll only
/// (`palisade_wait=poll`).
fn backend_name(url: &BackendUrl) -> String {
    let name = url.backend().map_or(url.scheme.as_str(), |d| d.name);
    if url.rest.contains("palisade_wait=poll") {
        format!("{name}-poll")
    } else {
        name.to_owned()
    }
}

fn row(backend: &str, nodes: usize, clients: usize, workload: &'static str, m: &Measured) -> Row {
    let contended = workload == "contended";
    Row {
        backend: backend.to_owned(),
        nodes,
        clients,
        workload,
        acquire_p50_us: m.acquire.percentile(50.0),
        acquire_p99_us: m.acquire.percentile(99.0),
        pairs_per_s: m.pairs_per_s,
        handoff_p50_us: contended.then(|| m.handoff.percentile(50.0)).flatten(),
        handoff_p99_us: contended.then(|| m.handoff.percentile(99.0)).flatten(),
        pairs: m.pairs,
    }
}

/// Opens `n` sessions on the backend.
async fn open(url: &BackendUrl, spec: &SessionSpec, n: usize) -> Result<Vec<Box<dyn FencedLocks>>> {
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        sessions.push(
            backends::connect(url, spec)
                .await
                .with_context(|| format!("opening a session on {}://{}", url.scheme, url.rest))?,
        );
    }
    Ok(sessions)
}

/// Each session acquires and releases a lock of its own, back to back, for
/// `duration`; the sessions are closed after.
pub async fn uncontended(
    sessions: Vec<Box<dyn FencedLocks>>,
    duration: Duration,
) -> Result<Measured> {
    let start = Instant::now();
    let mut handles = Vec::new();
    for (i, session) in sessions.into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let name = format!("bench-uncontended-{i}");
            let now = LockOptions::default();
            let mut acq = Samples::default();
            while start.elapsed() < duration {
                let t = Instant::now();
                let lease = session.acquire(&name, &now).await?;
                acq.push(t.elapsed());
                lease.release().await?;
            }
            session.close().await?;
            anyhow::Ok(acq)
        }));
    }
    let mut acq = Samples::default();
    for h in handles {
        acq.extend(h.await??);
    }
    let wall = start.elapsed();
    let pairs = acq.len();
    Ok(Measured {
        acquire: acq.sorted(),
        handoff: Sorted::default(),
        pairs,
        pairs_per_s: (pairs as f64 / wall.as_secs_f64()).round(),
    })
}

/// One holder's turn: when it was granted, and when it began releasing.
struct Turn {
    granted: Instant,
    releasing: Instant,
}

/// Every session queues for one lock and releases it as soon as it is granted,
/// for `duration`; the sessions are closed after.
pub async fn contended(
    sessions: Vec<Box<dyn FencedLocks>>,
    duration: Duration,
) -> Result<Measured> {
    let turns = Arc::new(Mutex::new(Vec::<Turn>::new()));
    let start = Instant::now();
    let mut handles = Vec::new();
    for session in sessions {
        let turns = turns.clone();
        handles.push(tokio::spawn(async move {
            let wait = LockOptions {
                wait: duration + Duration::from_secs(30),
                ..LockOptions::default()
            };
            let mut acq = Samples::default();
            while start.elapsed() < duration {
                let t = Instant::now();
                let lease = session.acquire("bench-contended", &wait).await?;
                let granted = Instant::now();
                acq.push(granted - t);
                turns.lock().expect("poisoned").push(Turn {
                    granted,
                    releasing: Instant::now(),
                });
                lease.release().await?;
            }
            session.close().await?;
            anyhow::Ok(acq)
        }));
    }
    let mut acq = Samples::default();
    for h in handles {
        acq.extend(h.await??);
    }
    let wall = start.elapsed();
    let mut turns = std::mem::take(&mut *turns.lock().expect("poisoned"));
    turns.sort_by_key(|t| t.granted);
    let mut handoff = Samples::default();
    for pair in turns.windows(2) {
        handoff.push(pair[1].granted.saturating_duration_since(pair[0].releasing));
    }
    let pairs = acq.len();
    Ok(Measured {
        acquire: acq.sorted(),
        handoff: handoff.sorted(),
        pairs,
        pairs_per_s: (pairs as f64 / wall.as_secs_f64()).round(),
    })
}

fn print_table(rows: &[Row]) {
    let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "{:<10} {:>5} {:>7} {:<12} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "backend",
        "nodes",
        "clients",
        "workload",
        "acq_p50",
        "acq_p99",
        "pairs/s",
        "handoff_p50",
        "handoff_p99"
    );
    for r in rows {
        println!(
            "{:<10} {:>5} {:>7} {:<12} {:>9} {:>9} {:>9.0} {:>11} {:>11}",
            r.backend,
            r.nodes,
            r.clients,
            r.workload,
            f(r.acquire_p50_us),
            f(r.acquire_p99_us),
            r.pairs_per_s,
            f(r.handoff_p50_us),
            f(r.handoff_p99_us)
        );
    }
    println!("(latencies in µs; every backend with its durable defaults)");
}
