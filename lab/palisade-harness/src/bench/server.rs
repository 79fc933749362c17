//! `palisade bench server`: the Palisade server with durable commits, on 1-node and
//! 3-node clusters on loopback that it starts itself (or `--endpoints`).
//!
//! - uncontended: N clients (each its own session) acquire and release locks of
//!   their own, back to back: acquire latency and acquire+release pairs per second.
//! - contended: 8 clients queue for ONE lock; each holder releases at once. The
//!   handoff is the time from the holder starting its release to the next holder
//!   being granted — one commit plus the server's push to the waiter, measured on
//!   this process's monotonic clock (all clients live in this process).
//!
//! `--http` adds, beside each gRPC row, the same workload over the HTTP/JSON
//! API (a Rust HTTP/1.1 client, [`super::http`]); `--lang python,node` adds one
//! uncontended client of each of those clients (`clients/*/examples/bench.*`,
//! run as child processes) on the same cluster.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_client::{Admin, Client, ClientConfig, TlsOptions};
use palisade_core::FencedLocks;
use palisade_testkit::{PalisadeNode, cpu_time};
use serde::Serialize;

use super::http::{HttpLocks, HttpTarget};
use super::locks::{self, Measured};
use super::stats::Sorted;
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
    /// Also measure each workload over the HTTP/JSON API (rows say `api: "http"`).
    #[arg(long)]
    http: bool,
    /// Also measure one uncontended client of each of these languages' clients
    /// (`python`, `node`), run from `--clients-dir` (rows say `client`).
    #[arg(long, value_delimiter = ',', value_parser = ["python", "node"])]
    lang: Vec<String>,
    /// Where the language clients are (the repository's `clients/`).
    #[arg(long, default_value = "clients")]
    clients_dir: std::path::PathBuf,
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
    /// `grpc` or `http`.
    api: &'static str,
    /// Whose client: `rust`, `python` or `node`.
    client: &'static str,
    clients: usize,
    workload: &'static str,
    acquire_p50_us: Option<u64>,
    acquire_p99_us: Option<u64>,
    pairs_per_s: f64,
    handoff_p50_us: Option<u64>,
    handoff_p99_us: Option<u64>,
    pairs: usize,
    /// The leader's own figure at the end of the row: the median time from
    /// appending a batch of entries to applying it, i.e. committing it, over
    /// its last 1,024 batches (`null` if the leader does not report it).
    commit_p50_us: Option<u64>,
    /// The CPU time all nodes spent during the row (user + system, from
    /// `/proc`), per acquire or release; `null` for nodes this bench did not
    /// start (`--endpoints`).
    server_cpu_us_per_op: Option<u64>,
}

/// Runs the benchmark; returns the exit status.
pub async fn run(a: ServerBenchArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("locating the palisade binary")?;
    let setups: Vec<(u64, Vec<String>)> = if a.endpoints.is_empty() {
        a.nodes.iter().map(|n| (*n, Vec::new())).collect()
    } else {
        vec![(a.endpoints.len() as u64, a.endpoints.clone())]
    };
    let apis: &[&'static str] = if a.http { &["grpc", "http"] } else { &["grpc"] };
    let rows_per_setup = (a.clients.len() + 1) * apis.len() + a.lang.len();
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
        None => palisade_client::credentials_from_files(
            a.ca.as_deref(),
            a.cert.as_deref().zip(a.key.as_deref()),
            a.token_file.as_deref(),
        )?,
    };
    // The language clients get the same credentials, as files.
    let lang_args: Vec<std::ffi::OsString> = match &certs {
        Some(dir) => vec![
            "--ca".into(),
            dir.path().join("ca.pem").into(),
            "--cert".into(),
            dir.path().join("client-bench.pem").into(),
            "--key".into(),
            dir.path().join("client-bench-key.pem").into(),
        ],
        None => {
            let mut args = Vec::new();
            let given = [
                ("--ca", &a.ca),
                ("--cert", &a.cert),
                ("--key", &a.key),
                ("--token-file", &a.token_file),
            ];
            for (flag, path) in given {
                if let Some(path) = path {
                    args.push(flag.into());
                    args.push(path.into());
                }
            }
            args
        }
    };
    let mut rows = Vec::new();
    let mut curves: Vec<(String, Sorted)> = Vec::new();
    for (n, given) in setups {
        // Kept alive until this setup is measured; killed on drop.
        let (nodes, endpoints) = if given.is_empty() {
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
        let http = if a.http {
            let leader = leader_addr(target).await?;
            Some(HttpTarget::new(
                leader,
                target.tls.as_ref(),
                target.bearer_token.clone(),
            )?)
        } else {
            None
        };
        let tls = target.tls.is_some();
        for &clients in &a.clients {
            for &api in apis {
                bar.set_message(format!(
                    "{n} node(s), {clients} uncontended client(s), {api}"
                ));
                let ready = sessions(target, http.as_ref(), clients).await?;
                let cpu = CpuMeter::start(&nodes);
                let m = locks::uncontended(ready, a.duration).await?;
                let cpu = cpu.per_op(m.pairs * 2);
                let commit = commit_p50(target).await;
                rows.push(row(
                    (n, tls, api, "rust", clients, "uncontended"),
                    &m,
                    commit,
                    cpu,
                ));
                curves.push((format!("acquire, {api}, {n} node(s) ×{clients}"), m.acquire));
                bar.inc(1);
            }
        }
        for &api in apis {
            bar.set_message(format!(
                "{n} node(s), {} contended clients, {api}",
                a.contenders
            ));
            let ready = sessions(target, http.as_ref(), a.contenders).await?;
            let cpu = CpuMeter::start(&nodes);
            let m = locks::contended(ready, a.duration).await?;
            let cpu = cpu.per_op(m.pairs * 2);
            let commit = commit_p50(target).await;
            rows.push(row(
                (n, tls, api, "rust", a.contenders, "contended"),
                &m,
                commit,
                cpu,
            ));
            curves.push((
                format!("handoff, {api}, {n} node(s) ×{}", a.contenders),
                m.handoff,
            ));
            bar.inc(1);
        }
        for lang in &a.lang {
            bar.set_message(format!("{n} node(s), 1 {lang} client"));
            let cpu = CpuMeter::start(&nodes);
            let m = language_client(
                lang,
                &a.clients_dir,
                &target.endpoints,
                a.duration,
                &lang_args,
            )
            .await?;
            let cpu = cpu.per_op(m.pairs * 2);
            let commit = commit_p50(target).await;
            let lang = if lang == "python" { "python" } else { "node" };
            rows.push(row(
                (n, tls, "http", lang, 1, "uncontended"),
                &m,
                commit,
                cpu,
            ));
            curves.push((format!("acquire, {lang}, {n} node(s) ×1"), m.acquire));
            bar.inc(1);
        }
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
        if admin.status().await.is_ok_and(|s| s.leader.is_some()) {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "no leader elected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens `n` Palisade sessions, as the lock trait's objects: over the HTTP
/// API at `http` when given, else with the gRPC client.
async fn sessions(
    target: &Target,
    http: Option<&HttpTarget>,
    n: usize,
) -> Result<Vec<Box<dyn FencedLocks>>> {
    let mut sessions: Vec<Box<dyn FencedLocks>> = Vec::with_capacity(n);
    for _ in 0..n {
        match http {
            Some(http) => {
                let ttl = config(target).session_ttl;
                sessions.push(Box::new(HttpLocks::connect(http, ttl).await?));
            }
            None => sessions.push(Box::new(Client::connect(config(target)).await?)),
        }
    }
    Ok(sessions)
}

/// The leader's client address, from the status of any node.
async fn leader_addr(target: &Target) -> Result<String> {
    let status = Admin::new(&config(target))?.status().await?;
    let leader = status.leader.context("no leader")?;
    let member = status.members.iter().find(|m| m.id == leader);
    Ok(member.context("the leader is not a member")?.addr.clone())
}

/// What a language client's bench script prints (one JSON line).
#[derive(serde::Deserialize)]
struct LanguageRun {
    pairs: usize,
    elapsed_s: f64,
    acquire_us: Vec<u64>,
}

/// Runs one uncontended client of `lang` (`clients/python/examples/bench.py`,
/// `clients/node/examples/bench.js`) for `duration` against `endpoints`.
async fn language_client(
    lang: &str,
    clients_dir: &std::path::Path,
    endpoints: &[String],
    duration: Duration,
    credentials: &[std::ffi::OsString],
) -> Result<Measured> {
    let mut cmd = match lang {
        "python" => {
            let mut c = tokio::process::Command::new("python3");
            c.arg(clients_dir.join("python/examples/bench.py"))
                // Run from the source tree: the client has no dependencies.
                .env("PYTHONPATH", clients_dir.join("python/src"))
                .env("PYTHONDONTWRITEBYTECODE", "1");
            c
        }
        _ => {
            let mut c = tokio::process::Command::new("node");
            c.arg(clients_dir.join("node/examples/bench.js"));
            c
        }
    };
    cmd.arg("--endpoints")
        .arg(endpoints.join(","))
        .arg("--duration")
        .arg(duration.as_secs_f64().to_string())
        .args(credentials)
        .stdin(std::process::Stdio::null());
    let out = cmd
        .output()
        .await
        .with_context(|| format!("running the {lang} client's bench ({cmd:?})"))?;
    anyhow::ensure!(
        out.status.success(),
        "the {lang} client's bench failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    let run: LanguageRun = serde_json::from_str(last)
        .with_context(|| format!("the {lang} client's bench printed {text:?}"))?;
    let mut acquire = super::stats::Samples::default();
    for us in run.acquire_us {
        acquire.push(Duration::from_micros(us));
    }
    Ok(Measured {
        acquire: acquire.sorted(),
        handoff: Sorted::default(),
        pairs: run.pairs,
        pairs_per_s: (run.pairs as f64 / run.elapsed_s).round(),
    })
}

/// The leader's commit p50 as it reports it now, if it does. A node answers
/// `Status` with its own figure, and a follower's is the time until it learns
/// of the commit (with the next entries), so the leader itself is asked.
async fn commit_p50(target: &Target) -> Option<u64> {
    let mut status = Admin::new(&config(target)).ok()?.status().await.ok()?;
    if status.leader != Some(status.id) {
        let leader = status.leader?;
        let addr = status.members.iter().find(|m| m.id == leader)?.addr.clone();
        let mut at_leader = config(target);
        at_leader.endpoints = vec![addr];
        status = Admin::new(&at_leader).ok()?.status().await.ok()?;
        if status.id != leader {
            return None;
        }
    }
    status.commit_latency.map(|(p50, _)| p50.as_micros() as u64)
}

/// The CPU time of the nodes this bench started, from the start of a row.
struct CpuMeter {
    pids: Vec<u32>,
    /// Their CPU time at the start; `None` when it cannot be read (or there
    /// are no such nodes).
    at_start: Option<Duration>,
}

impl CpuMeter {
    fn start(nodes: &[PalisadeNode]) -> CpuMeter {
        let pids: Vec<u32> = nodes.iter().filter_map(PalisadeNode::pid).collect();
        let complete = !pids.is_empty() && pids.len() == nodes.len();
        CpuMeter {
            at_start: complete.then(|| cpu_time(&pids)).flatten(),
            pids,
        }
    }

    /// The CPU time spent since the start per operation, in µs.
    fn per_op(self, ops: usize) -> Option<u64> {
        let spent = cpu_time(&self.pids)?.checked_sub(self.at_start?)?;
        (ops > 0).then(|| (spent.as_micros() / ops as u128) as u64)
    }
}

/// (nodes, TLS, API, client, clients, workload) of a row.
type RowKey = (u64, bool, &'static str, &'static str, usize, &'static str);

fn row(
    (nodes, tls, api, client, clients, workload): RowKey,
    m: &Measured,
    commit_p50_us: Option<u64>,
    server_cpu_us_per_op: Option<u64>,
) -> Row {
    let contended = workload == "contended";
    Row {
        nodes,
        tls,
        api,
        client,
        clients,
        workload,
        acquire_p50_us: m.acquire.percentile(50.0),
        acquire_p99_us: m.acquire.percentile(99.0),
        pairs_per_s: m.pairs_per_s,
        handoff_p50_us: contended.then(|| m.handoff.percentile(50.0)).flatten(),
        handoff_p99_us: contended.then(|| m.handoff.percentile(99.0)).flatten(),
        pairs: m.pairs,
        commit_p50_us,
        server_cpu_us_per_op,
    }
}

fn print_table(rows: &[Row]) {
    let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    println!(
        "{:>5} {:>4} {:<11} {:>7} {:<12} {:>9} {:>9} {:>9} {:>11} {:>11} {:>10} {:>10}",
        "nodes",
        "tls",
        "client",
        "clients",
        "workload",
        "acq_p50",
        "acq_p99",
        "pairs/s",
        "handoff_p50",
        "handoff_p99",
        "commit_p50",
        "cpu_per_op"
    );
    for r in rows {
        println!(
            "{:>5} {:>4} {:<11} {:>7} {:<12} {:>9} {:>9} {:>9.0} {:>11} {:>11} {:>10} {:>10}",
            r.nodes,
            if r.tls { "on" } else { "off" },
            format!("{}/{}", r.client, r.api),
            r.clients,
            r.workload,
            f(r.acquire_p50_us),
            f(r.acquire_p99_us),
            r.pairs_per_s,
            f(r.handoff_p50_us),
            f(r.handoff_p99_us),
            f(r.commit_p50_us),
            f(r.server_cpu_us_per_op)
        );
    }
    println!(
        "(latencies in µs; durable commits: every acknowledged grant is fsynced on a majority;\n\
         commit_p50: the leader's median from appending a batch of entries to committing it;\n\
         cpu_per_op: CPU time of all nodes together per acquire or release)"
    );
}
