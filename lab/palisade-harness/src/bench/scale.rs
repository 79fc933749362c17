//! `palisade bench scale`: one node holding many sessions (and, with `--locks`,
//! many held locks) — how fast sessions are created and kept alive at that size,
//! and what it costs in memory.
//!
//! The bench talks to the node over the raw gRPC API on a few shared
//! connections: a `Client` per session would open a connection and a keep-alive
//! task each, which measures the bench, not the server. Sessions get a TTL longer
//! than the run, so only the measured keep-alives are sent; the node is killed at
//! the end (its data is a temporary directory).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use palisade_proto::h2_channel::H2Channel;
use palisade_proto::v1::cluster_client::ClusterClient;
use palisade_proto::v1::locks_client::LocksClient;
use palisade_proto::v1::{
    AcquireRequest, AddLearnerRequest, CreateSessionRequest, KeepAliveRequest, StatusRequest,
    TakeSnapshotRequest,
};
use palisade_testkit::PalisadeNode;
use serde::Serialize;

use super::stats::Samples;
use crate::duration_arg;

/// Arguments of `palisade bench scale`.
#[derive(Args)]
pub struct ScaleBenchArgs {
    /// Sessions to create (the server's limit is 100,000).
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Locks to acquire, spread over the sessions (each session holds at most
    /// 1,000).
    #[arg(long, default_value_t = 0)]
    locks: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    callers: usize,
    /// How long keep-alives are measured.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    keepalive_duration: Duration,
    /// Then: this many more sessions, each holding one lock, all left to expire
    /// at once (0: skip). Counted within `--sessions`' limit of 100,000 live.
    #[arg(long, default_value_t = 0)]
    expiring: usize,
    /// The TTL of the expiring sessions: longer than creating them all takes
    /// (the bench refuses to report otherwise).
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    expiring_ttl: Duration,
    /// Skip the snapshot phase (build one, and install it on a new learner).
    #[arg(long)]
    no_snapshot: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The result, one object.
#[derive(Serialize)]
struct Scale {
    sessions: usize,
    locks: usize,
    /// The node's resident memory at the end (VmRSS).
    rss_bytes: u64,
    /// `CreateSession` calls per second over the last tenth of the sessions,
    /// i.e. with (nearly) all of them live.
    create_session_per_s: f64,
    /// The same over all of them.
    create_session_overall_per_s: f64,
    /// Keep-alives per second, and their latency, with every session live.
    keepalive_per_s: f64,
    keepalive_p50_us: Option<u64>,
    keepalive_p99_us: Option<u64>,
    /// Acquires per second while the locks were taken (`null` without locks).
    acquire_per_s: Option<f64>,
    /// With `--expiring`: how many sessions expired together.
    expiring: usize,
    /// The longest any sampled lock of an expiring session took to be granted
    /// to a waiter, counted from its session's TTL running out (`null`
    /// without `--expiring`).
    expired_locks_free_after_ttl_ms: Option<u64>,
    /// Meanwhile, other clients' acquire latency on locks of their own.
    acquire_p99_during_expiry_us: Option<u64>,
    /// The snapshot the node took on request (`cluster snapshot`) with all
    /// sessions and locks live: its size and build time (clone of the state,
    /// encoding, file written and synced), as the node reports it.
    snapshot_bytes: Option<u64>,
    snapshot_build_ms: Option<u64>,
    /// `cluster add-learner` of a new, empty node until it has caught up:
    /// snapshot sent, received, decoded, installed and the log after it
    /// replicated — what adding a follower costs at this size.
    snapshot_install_ms: Option<u64>,
    /// Of that, the learner's own install (decode to state in place); `null`
    /// if it caught up from the log alone (a small state whose log was not yet
    /// compacted when the learner was added).
    snapshot_install_on_learner_ms: Option<u64>,
    /// Acquire latency of 4 other clients (each acquiring and releasing a
    /// lock of its own) while three snapshots are built one after the other,
    /// and for as long again right after (`acquire_p99_us`).
    acquire_p99_us: Option<u64>,
    acquire_p99_during_snapshot_us: Option<u64>,
}

/// A live session: its id and key.
struct Session {
    id: u64,
    key: Vec<u8>,
}

/// Runs the benchmark; returns the exit status.
pub async fn run(a: ScaleBenchArgs) -> Result<i32> {
    if a.sessions == 0 || a.callers == 0 {
        eprintln!("palisade bench scale: --sessions and --callers must be at least 1");
        return Ok(crate::exit::USAGE);
    }
    if a.locks > a.sessions * 1_000 {
        eprintln!("palisade bench scale: at most 1,000 locks per session");
        return Ok(crate::exit::USAGE);
    }
    let exe = std::env::current_exe().context("locating the palisade binary")?;
    let node = tokio::task::block_in_place(|| PalisadeNode::single(&exe))?;
    let pid = node.pid().context("the node did not start")?;
    // A few connections shared by every caller, as a real fleet's would be
    // spread; the transport Palisade's client library uses.
    let mut channels = Vec::new();
    for _ in 0..4 {
        let addr = node.addr().to_string();
        let dial = H2Channel::tcp_dialer(addr.clone());
        channels.push(H2Channel::new(&addr, false, Duration::from_secs(1), dial)?);
    }
    let bar = ProgressBar::new(a.sessions as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} · {per_sec}")
            .expect("valid template"),
    );

    // Sessions, by `callers` tasks pulling from one counter.
    bar.set_message("sessions created");
    let next = Arc::new(AtomicUsize::new(0));
    let tail_from = a.sessions - a.sessions / 10;
    let tail_started = Arc::new(std::sync::OnceLock::<Instant>::new());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.callers {
        let mut client = LocksClient::new(channels[c % channels.len()].clone());
        let (next, bar, tail_started) = (next.clone(), bar.clone(), tail_started.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.sessions {
                    break;
                }
                if i == tail_from {
                    let _ = tail_started.set(Instant::now());
                }
                let reply = client
                    .create_session(CreateSessionRequest {
                        // Longer than any run: only the measured keep-alives go out.
                        ttl_ms: 3_600_000,
                        label: format!("scale {i}"),
                    })
                    .await?
                    .into_inner();
                mine.push(Session {
                    id: reply.session_id,
                    key: reply.session_key,
                });
                bar.inc(1);
            }
            anyhow::Ok(mine)
        }));
    }
    let mut sessions = Vec::with_capacity(a.sessions);
    for t in tasks {
        sessions.extend(t.await??);
    }
    let ended = Instant::now();
    let overall = a.sessions as f64 / (ended - started).as_secs_f64();
    let tail = match tail_started.get() {
        Some(t) => (a.sessions - tail_from) as f64 / (ended - *t).as_secs_f64(),
        None => overall,
    };
    if sessions.len() != a.sessions {
        bail!("created {} sessions of {}", sessions.len(), a.sessions);
    }
    let sessions = Arc::new(sessions);

    // Locks, round-robin over the sessions.
    let mut acquire_per_s = None;
    if a.locks > 0 {
        bar.set_length(a.locks as u64);
        bar.set_position(0);
        bar.set_message("locks acquired");
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..a.callers {
            let mut client = LocksClient::new(channels[c % channels.len()].clone());
            let (next, bar, sessions) = (next.clone(), bar.clone(), sessions.clone());
            let locks = a.locks;
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= locks {
                        break;
                    }
                    let s = &sessions[i % sessions.len()];
                    client
                        .acquire(AcquireRequest {
                            session_id: s.id,
                            name: format!("scale/{i}"),
                            wait_ms: 0,
                            lock_delay_ms: 0,
                            session_key: s.key.clone(),
                            ..AcquireRequest::default()
                        })
                        .await?;
                    bar.inc(1);
                }
                anyhow::Ok(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        acquire_per_s = Some((a.locks as f64 / started.elapsed().as_secs_f64()).round());
    }

    // Keep-alives to sessions spread over all of them, every one live.
    bar.set_message("measuring keep-alives");
    bar.set_length(0);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.callers {
        let mut client = LocksClient::new(channels[c % channels.len()].clone());
        let sessions = sessions.clone();
        let duration = a.keepalive_duration;
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut i = c;
            while started.elapsed() < duration {
                let s = &sessions[i % sessions.len()];
                i += a.callers * 7919;
                let t = Instant::now();
                client
                    .keep_alive(KeepAliveRequest {
                        session_id: s.id,
                        session_key: s.key.clone(),
                    })
                    .await?;
                samples.push(t.elapsed());
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Samples::default();
    for t in tasks {
        samples.extend(t.await??);
    }
    let keepalives = samples.len();
    let samples = samples.sorted();

    let snapshot = if a.no_snapshot {
        SnapshotFigures::default()
    } else {
        bar.set_message("snapshot: build and install on a new learner");
        snapshot_phase(&exe, &channels, &sessions).await?
    };

    let (free_after, during) = if a.expiring > 0 {
        bar.set_message("sessions expiring together");
        expire_together(&channels, &sessions, &a).await?
    } else {
        (None, None)
    };
    bar.finish_and_clear();

    let result = Scale {
        sessions: a.sessions,
        locks: a.locks,
        rss_bytes: rss_bytes(pid)?,
        create_session_per_s: tail.round(),
        create_session_overall_per_s: overall.round(),
        keepalive_per_s: (keepalives as f64 / started.elapsed().as_secs_f64()).round(),
        keepalive_p50_us: samples.percentile(50.0),
        keepalive_p99_us: samples.percentile(99.0),
        acquire_per_s,
        expiring: a.expiring,
        expired_locks_free_after_ttl_ms: free_after,
        acquire_p99_during_expiry_us: during,
        snapshot_bytes: snapshot.bytes,
        snapshot_build_ms: snapshot.build_ms,
        snapshot_install_ms: snapshot.install_ms,
        snapshot_install_on_learner_ms: snapshot.install_on_learner_ms,
        acquire_p99_us: snapshot.acquire_p99_us,
        acquire_p99_during_snapshot_us: snapshot.acquire_p99_during_us,
    };
    tokio::task::block_in_place(move || drop(node));
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        let f = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
        println!("sessions               {}", result.sessions);
        println!("locks                  {}", result.locks);
        println!(
            "node RSS               {:.1} MiB",
            result.rss_bytes as f64 / (1 << 20) as f64
        );
        println!(
            "CreateSession/s        {} with ~all live ({} overall), {} callers",
            result.create_session_per_s, result.create_session_overall_per_s, a.callers
        );
        println!(
            "keep-alives/s          {} (p50 {} µs, p99 {} µs)",
            result.keepalive_per_s,
            f(result.keepalive_p50_us),
            f(result.keepalive_p99_us)
        );
        if let Some(r) = result.acquire_per_s {
            println!("acquires/s             {r}");
        }
        if let (Some(bytes), Some(build)) = (result.snapshot_bytes, result.snapshot_build_ms) {
            println!(
                "snapshot               {:.1} MiB, built in {build} ms; acquire p99 {} µs without, {} µs while building",
                bytes as f64 / (1 << 20) as f64,
                f(result.acquire_p99_us),
                f(result.acquire_p99_during_snapshot_us)
            );
            println!(
                "new learner            caught up in {} ms (its install {} ms)",
                f(result.snapshot_install_ms),
                f(result.snapshot_install_on_learner_ms)
            );
        }
        if let Some(ms) = result.expired_locks_free_after_ttl_ms {
            println!(
                "{} sessions expiring  locks free ≤ {ms} ms after the TTL; others' acquire p99 {} µs",
                result.expiring,
                f(result.acquire_p99_during_expiry_us)
            );
        }
    }
    Ok(0)
}

/// Creates `a.expiring` sessions of `a.expiring_ttl`, each taking one lock,
/// then sends each one keep-alive as fast as it can — so that their countdowns
/// all restart within a moment and they expire together — and no more.
/// Waiters (on long-lived sessions) queue for a sample of those locks; each
/// grant is timed from its session's TTL running out, counted from when its
/// last keep-alive was *sent* on this process's clock (the server restarts the
/// countdown on receipt, so this can only overstate the delay). Meanwhile other
/// clients acquire and release locks of their own.
async fn expire_together(
    channels: &[H2Channel],
    live: &Arc<Vec<Session>>,
    a: &ScaleBenchArgs,
) -> Result<(Option<u64>, Option<u64>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..a.callers {
        let mut client = LocksClient::new(channels[c % channels.len()].clone());
        let (next, n, ttl) = (next.clone(), a.expiring, a.expiring_ttl);
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let reply = client
                    .create_session(CreateSessionRequest {
                        ttl_ms: ttl.as_millis() as u64,
                        label: format!("expiring {i}"),
                    })
                    .await?
                    .into_inner();
                client
                    .acquire(AcquireRequest {
                        session_id: reply.session_id,
                        name: format!("expire/{i}"),
                        wait_ms: 0,
                        lock_delay_ms: 0,
                        session_key: reply.session_key.clone(),
                        ..AcquireRequest::default()
                    })
                    .await?;
                mine.push((i, reply.session_id, reply.session_key));
            }
            anyhow::Ok(mine)
        }));
    }
    let mut expiring = Vec::with_capacity(a.expiring);
    for t in tasks {
        expiring.extend(t.await??);
    }
    // One keep-alive each, all at once: their countdowns restart together.
    let expiring = Arc::new(expiring);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..a.callers {
        let mut client = LocksClient::new(channels[c % channels.len()].clone());
        let (next, expiring) = (next.clone(), expiring.clone());
        tasks.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some((i, id, key)) = expiring.get(k) else {
                    break;
                };
                let at = Instant::now();
                client
                    .keep_alive(KeepAliveRequest {
                        session_id: *id,
                        session_key: key.clone(),
                    })
                    .await
                    .context(
                        "an expiring session ended before all were created: raise --expiring-ttl",
                    )?;
                sent.push((*i, at));
            }
            anyhow::Ok(sent)
        }));
    }
    let mut created = vec![Instant::now(); a.expiring];
    for t in tasks {
        for (i, at) in t.await?? {
            created[i] = at;
        }
    }
    // Waiters on a sample of the expiring locks, on sessions that stay alive
    // (their TTL is an hour).
    let samples = 8.min(a.expiring);
    let mut waiters = Vec::new();
    for k in 0..samples {
        let i = k * a.expiring / samples;
        let deadline = created[i] + a.expiring_ttl;
        let s = &live[k % live.len()];
        let (id, key) = (s.id, s.key.clone());
        let mut client = LocksClient::new(channels[k % channels.len()].clone());
        waiters.push(tokio::spawn(async move {
            // A waiter that asks after the TTL ran out would time nothing.
            anyhow::ensure!(
                Instant::now() < deadline,
                "the expiring sessions' TTL ran out before the waiters queued: raise --expiring-ttl"
            );
            client
                .acquire(AcquireRequest {
                    session_id: id,
                    name: format!("expire/{i}"),
                    wait_ms: 120_000,
                    lock_delay_ms: 0,
                    session_key: key,
                    ..AcquireRequest::default()
                })
                .await?;
            anyhow::Ok(Instant::now().saturating_duration_since(deadline))
        }));
    }
    // Other clients keep working through the expiry.
    let stop = Instant::now() + a.expiring_ttl + Duration::from_secs(3);
    let workers = probe_acquires(channels, live, 8, "during-expiry", move || {
        Instant::now() >= stop
    });
    let mut worst = Duration::ZERO;
    for w in waiters {
        worst = worst.max(w.await??);
    }
    let during = workers.await?;
    Ok((
        Some(worst.as_millis() as u64),
        during.sorted().percentile(99.0),
    ))
}

/// `n` clients, each on one of the last live sessions, acquiring and releasing
/// a lock of its own until `done()`; their acquire latencies.
fn probe_acquires<D: Fn() -> bool + Clone + Send + 'static>(
    channels: &[H2Channel],
    live: &Arc<Vec<Session>>,
    n: usize,
    prefix: &str,
    done: D,
) -> impl std::future::Future<Output = Result<Samples>> + use<D> {
    let mut workers = Vec::new();
    for c in 0..n.min(live.len()) {
        let s = &live[live.len() - 1 - c];
        let (id, key) = (s.id, s.key.clone());
        let mut client = LocksClient::new(channels[c % channels.len()].clone());
        let (name, done) = (format!("{prefix}/{c}"), done.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            while !done() {
                let t = Instant::now();
                let token = client
                    .acquire(AcquireRequest {
                        session_id: id,
                        name: name.clone(),
                        wait_ms: 0,
                        lock_delay_ms: 0,
                        session_key: key.clone(),
                        ..AcquireRequest::default()
                    })
                    .await?
                    .into_inner()
                    .token;
                samples.push(t.elapsed());
                client
                    .release(palisade_proto::v1::ReleaseRequest {
                        session_id: id,
                        name: name.clone(),
                        token,
                        session_key: key.clone(),
                    })
                    .await?;
            }
            anyhow::Ok(samples)
        }));
    }
    async move {
        let mut all = Samples::default();
        for w in workers {
            all.extend(w.await??);
        }
        Ok(all)
    }
}

/// What the snapshot phase measured.
#[derive(Default)]
struct SnapshotFigures {
    bytes: Option<u64>,
    build_ms: Option<u64>,
    install_ms: Option<u64>,
    install_on_learner_ms: Option<u64>,
    acquire_p99_us: Option<u64>,
    acquire_p99_during_us: Option<u64>,
}

/// Acquire latency while the node builds snapshots on request, and for as
/// long without; then a new node is added as a learner and timed until it has
/// caught up (the node's log is compacted by the snapshot, so it gets the
/// snapshot).
async fn snapshot_phase(
    exe: &std::path::Path,
    channels: &[H2Channel],
    live: &Arc<Vec<Session>>,
) -> Result<SnapshotFigures> {
    const PROBES: usize = 4;
    // Three snapshots in a row, so the window is long enough for a steady
    // p99; the same load just before, for as long, is the baseline.
    const BUILDS: usize = 3;
    let building = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = building.clone();
    let during = tokio::spawn(probe_acquires(
        channels,
        live,
        PROBES,
        "during-snapshot",
        move || !flag.load(Ordering::Relaxed),
    ));
    let started = Instant::now();
    let mut taken = None;
    for _ in 0..BUILDS {
        taken = Some(
            ClusterClient::new(channels[0].clone())
                .take_snapshot(TakeSnapshotRequest {})
                .await
                .context("taking a snapshot")?
                .into_inner(),
        );
    }
    let taken = taken.expect("BUILDS > 0");
    building.store(false, Ordering::Relaxed);
    let window = started.elapsed();
    let during = during.await??.sorted();
    let until = Instant::now() + window;
    let before = probe_acquires(channels, live, PROBES, "before-snapshot", move || {
        Instant::now() >= until
    })
    .await?
    .sorted();

    let exe = exe.to_owned();
    let mut learner = tokio::task::block_in_place(move || -> Result<PalisadeNode> {
        let mut learner = PalisadeNode::prepare(&exe, 2)?;
        learner.set_args(&["--join"]);
        learner.start()?;
        Ok(learner)
    })?;
    let started = Instant::now();
    ClusterClient::new(channels[0].clone())
        .add_learner(AddLearnerRequest {
            id: 2,
            addr: learner.addr(),
            peer_addr: learner.peer_addr(),
        })
        .await
        .with_context(|| format!("adding a learner: {}", learner.log()))?;
    let install_ms = started.elapsed().as_millis() as u64;
    let on_learner = LocksClient::connect(format!("http://{}", learner.addr()))
        .await?
        .status(StatusRequest {})
        .await?
        .into_inner()
        .snapshot_install_us
        .map(|us| us / 1000);
    tokio::task::block_in_place(move || learner.kill());
    Ok(SnapshotFigures {
        bytes: Some(taken.bytes),
        build_ms: Some(taken.build_us / 1000),
        install_ms: Some(install_ms),
        install_on_learner_ms: on_learner,
        acquire_p99_us: before.percentile(99.0),
        acquire_p99_during_us: during.percentile(99.0),
    })
}

/// The resident set size of process `pid`, from `/proc/PID/status`.
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kib * 1024)
}
