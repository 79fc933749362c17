//! `palisade bench server`: the Palisade server with durable commits, on 1-node and
//! 3-node clusters on loopback that it starts itself (or `--endpoints`).
//!
//! - uncontended: N clients (each its own session) acquire and release locks of
//!   their own, back to back: acquire latency and acquire+release pairs per second.
//! - contended: 8 clients queue for ONE lock; each holder releases at once. The
//!   handoff is the time from the holder starting its release to the next holder
//!   being granted — one commit plus the server's push to the waiter, measured on
//!   this process's monotonic clock (all clients live in this process).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_client::{AcquireOptions, Admin, Client, ClientConfig, TlsOptions};
use palisade_testkit::PalisadeNode;
use serde::Serialize;

use super::stats::{Samples, Sorted};
use crate::duration_arg;

/// Arguments of `palisade bench server`.
#[derive(Args)]
pub struct ServerBenchArgs {
    /// Cluster sizes to start and measure, comma-separated (1 and/or 3).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    nodes: Vec<u64>,
    /// Measure an existing cluster instead of starting one.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Measuring time per row.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    duration: Duration,
    /// Client counts of the uncontended rows.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    clients: Vec<usize>,
    /// Clients queueing for the one lock of the contended row.
    #[arg(long, default_value_t = 8)]
    contenders: usize,
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
    /// Measure clusters with TLS on every link (clients by certificate), from a
    /// CA made for the run; rows say `tls: true`. Not with --endpoints.
    #[arg(long, conflicts_with = "endpoints")]
    tls: bool,
    /// With --endpoints: the cluster's CA (TLS).
    #[arg(long, env = "PALISADE_CA", requires = "endpoints")]
    ca: Option<std::path::PathBuf>,
    /// With --endpoints: a client certificate (PEM).
    #[arg(long, env = "PALISADE_CERT", requires_all = ["endpoints", "key"])]
    cert: Option<std::path::PathBuf>,
    /// The key of --cert (PEM).
    #[arg(long, env = "PALISADE_KEY", requires = "cert")]
    key: Option<std::path::PathBuf>,
    /// With --endpoints: a file holding a bearer token.
    #[arg(long, env = "PALISADE_TOKEN_FILE", requires = "endpoints")]
    token_file: Option<std::path::PathBuf>,
    /// Also write the rows (`server-bench.json`) and the acquire and handoff
    /// latency distributions as a picture (`server-latency-cdf.svg`) here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// One row of the result.
#[derive(Serialize)]
struct Row {
    nodes: u64,
    tls: bool,
    clients: usize,
    workload: &'static str,
    acquire_p50_us: Option<u64>,
    acquire_p99_us: Option<u64>,
    pairs_per_s: f64,
    handoff_p50_us: Option<u64>,
    handoff_p99_us: Option<u64>,
    pairs: usize,
}

/// Runs the benchmark; returns the exit status.
pub async fn run(a: ServerBenchArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("locating the palisade binary")?;
    let setups: Vec<(u64, Vec<String>)> = if a.endpoints.is_empty() {
        a.nodes.iter().map(|n| (*n, Vec::new())).collect()
    } else {
        vec![(a.endpoints.len() as u64, a.endpoints.clone())]
    };
    let rows_per_setup = a.clients.len() + 1;
    let bar = ProgressBar::new((setups.len() * rows_per_setup) as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("valid template"),
    );
    let certs = if a.tls {
        let dir = tempfile::tempdir()?;
        let out = std::process::Command::new(&exe)
            .args(["certs", "init"])
            .arg(dir.path())
            .args(["--nodes", "5", "--clients", "bench"])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "palisade certs init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(dir)
    } else {
        None
    };
    let tls_args = |id: u64| -> Vec<String> {
        let Some(dir) = &certs else { return Vec::new() };
        let f = |name: String| dir.path().join(name).to_string_lossy().into_owned();
        vec![
            "--tls-cert".into(),
            f(format!("node-{id}.pem")),
            "--tls-key".into(),
            f(format!("node-{id}-key.pem")),
            "--tls-ca".into(),
            f("ca.pem".into()),
        ]
    };
    let (tls, bearer_token) = match &certs {
        Some(dir) => (
            Some(TlsOptions::from_files(
                &dir.path().join("ca.pem"),
                Some((
                    &dir.path().join("client-bench.pem"),
                    &dir.path().join("client-bench-key.pem"),
                )),
            )?),
            None,
        ),
        None => crate::server_cmd::credentials(
            a.ca.as_deref(),
            a.cert.as_deref().zip(a.key.as_deref()),
            a.token_file.as_deref(),
        )?,
    };
    let mut rows = Vec::new();
    let mut curves: Vec<(String, Sorted)> = Vec::new();
    for (n, given) in setups {
        // Kept alive until this setup is measured; killed on drop.
        let (_nodes, endpoints) = if given.is_empty() {
            bar.set_message(format!("starting a {n}-node cluster"));
            let nodes = PalisadeNode::cluster_with(&exe, n, tls_args)?;
            let endpoints: Vec<String> = nodes.iter().map(PalisadeNode::addr).collect();
            (nodes, endpoints)
        } else {
            (Vec::new(), given)
        };
        let target = &Target {
            endpoints,
            tls: tls.clone(),
            bearer_token: bearer_token.clone(),
        };
        wait_for_leader(target).await?;
        for &clients in &a.clients {
            bar.set_message(format!("{n} node(s), {clients} uncontended client(s)"));
            let (row, acq) = uncontended(n, target, clients, a.duration).await?;
            curves.push((format!("acquire, {n} node(s) ×{clients}"), acq));
            rows.push(row);
            bar.inc(1);
        }
        bar.set_message(format!("{n} node(s), {} contended clients", a.contenders));
        let (row, handoff) = contended(n, target, a.contenders, a.duration).await?;
        curves.push((format!("handoff, {n} node(s) ×{}", a.contenders), handoff));
        rows.push(row);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if let Some(dir) = &a.out {
        let series: Vec<(String, &Sorted)> = curves.iter().map(|(l, s)| (l.clone(), s)).collect();
        super::write_outputs(
            dir,
            "server-bench.json",
            &rows,
            "server-latency-cdf.svg",
            &super::svg::cdf_chart(
                "Palisade server: acquire and handoff latency (CDF)",
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

/// The cluster measured, and how to reach it.
struct Target {
    endpoints: Vec<String>,
    tls: Option<TlsOptions>,
    bearer_token: Option<String>,
}

fn config(target: &Target) -> ClientConfig {
    let mut c = ClientConfig::new(target.endpoints.iter().cloned());
    c.retry_for = Duration::from_secs(30);
    c.tls = target.tls.clone();
    c.bearer_token = target.bearer_token.clone();
    c
}

async fn wait_for_leader(target: &Target) -> Result<()> {
    let admin = Admin::new(&config(target))?;
    let start = Instant::now();
    loop {
        if admin.status().await.is_ok_and(|s| s.leader != 0) {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "no leader elected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn uncontended(
    nodes: u64,
    target: &Target,
    clients: usize,
    duration: Duration,
) -> Result<(Row, Sorted)> {
    let mut handles = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..clients {
        sessions.push(Client::connect(config(target)).await?);
    }
    let start = Instant::now();
    for (i, client) in sessions.into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let name = format!("bench/uncontended/{i}");
            let mut acq = Samples::default();
            let began = Instant::now();
            while began.elapsed() < duration {
                let t = Instant::now();
                let g = client.acquire(&name, &AcquireOptions::default()).await?;
                acq.push(t.elapsed());
                g.release().await?;
            }
            client.close().await?;
            anyhow::Ok(acq)
        }));
    }
    let mut acq = Samples::default();
    for h in handles {
        acq.extend(h.await??);
    }
    let wall = start.elapsed();
    let pairs = acq.len();
    let acq = acq.sorted();
    let row = Row {
        nodes,
        tls: target.tls.is_some(),
        clients,
        workload: "uncontended",
        acquire_p50_us: acq.percentile(50.0),
        acquire_p99_us: acq.percentile(99.0),
        pairs_per_s: (pairs as f64 / wall.as_secs_f64()).round(),
        handoff_p50_us: None,
        handoff_p99_us: None,
        pairs,
    };
    Ok((row, acq))
}

/// One holder's turn: when it was granted, and when it began releasing.
struct Turn {
    granted: Instant,
    releasing: Instant,
}

async fn contended(
    nodes: u64,
    target: &Target,
    clients: usize,
    duration: Duration,
) -> Result<(Row, Sorted)> {
    let turns = Arc::new(Mutex::new(Vec::<Turn>::new()));
    let mut sessions = Vec::new();
    for _ in 0..clients {
        sessions.push(Client::connect(config(target)).await?);
    }
    let start = Instant::now();
    let mut handles = Vec::new();
    for client in sessions {
        let turns = turns.clone();
        handles.push(tokio::spawn(async move {
            let wait = AcquireOptions {
                wait: duration + Duration::from_secs(30),
                ..Default::default()
            };
            let mut acq = Samples::default();
            while start.elapsed() < duration {
                let t = Instant::now();
                let g = client.acquire("bench/contended", &wait).await?;
                let granted = Instant::now();
                acq.push(granted - t);
                let releasing = Instant::now();
                turns
                    .lock()
                    .expect("poisoned")
                    .push(Turn { granted, releasing });
                g.release().await?;
            }
            client.close().await?;
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
    let (acq, handoff) = (acq.sorted(), handoff.sorted());
    let row = Row {
        nodes,
        tls: target.tls.is_some(),
        clients,
        workload: "contended",
        acquire_p50_us: acq.percentile(50.0),
        acquire_p99_us: acq.percentile(99.0),
        pairs_per_s: (pairs as f64 / wall.as_secs_f64()).round(),
        handoff_p50_us: handoff.percentile(50.0),
        handoff_p99_us: handoff.percentile(99.0),
        pairs,
    };
    Ok((row, handoff))
}

fn print_table(rows: &[Row]) {
    let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "{:>5} {:>4} {:>7} {:<12} {:>9} {:>9} {:>9} {:>11} {:>11}",
        "nodes",
        "tls",
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
            "{:>5} {:>4} {:>7} {:<12} {:>9} {:>9} {:>9.0} {:>11} {:>11}",
            r.nodes,
            if r.tls { "on" } else { "off" },
            r.clients,
            r.workload,
            f(r.acquire_p50_us),
            f(r.acquire_p99_us),
            r.pairs_per_s,
            f(r.handoff_p50_us),
            f(r.handoff_p99_us)
        );
    }
    println!(
        "(latencies in µs; durable commits: every acknowledged grant is fsynced on a majority)"
    );
}
