//! Deterministic simulation of Palisade: the real server (openraft, the
//! write-ahead log, the state machine and its snapshots, the proposer, the lease
//! keeper, the gRPC services) and the real client, several nodes and clients in
//! one process on one thread, on virtual time, over a simulated network and
//! simulated disks — all driven by one seed.
//!
//! - [`turmoil`] runs each node and each client as a host with a tokio runtime of
//!   its own on a paused clock, and carries TCP between them with latency drawn
//!   from the seed; a crash drops a host's runtime (every task of the node ends
//!   at once), a restart runs the node's software again on the same disk.
//! - [`disk::SimDisk`] keeps what was synced apart from what was only written; a
//!   crash keeps only the first (or, torn, part of the rest).
//! - [`links::Links`] decides, one Raft message at a time, what TCP would hide:
//!   messages lost, repeated, overtaken, or heard in one direction only.
//! - The server reaches both through `palisade_server::io` — the same code paths
//!   as production, with blocking work run in line. openraft's random source is
//!   seeded ([`palisade_server::runtime::seed_thread_rng`]), and tokio's (the
//!   branch order of `select!`) through turmoil when built with
//!   `--cfg tokio_unstable` (the workspace's `.cargo/config.toml`).
//! - [`nemesis`] draws faults from the seed; [`workload`] is what the clients
//!   do; [`check`] judges the history with `palisade-chaos`'s checker plus the
//!   invariants only a simulator can see.

pub mod check;
pub mod disk;
pub mod links;
pub mod nemesis;
pub mod net;
pub mod workload;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use palisade_chaos::{Event, EventKind, History};
use palisade_server::io::Io;
use palisade_server::typ::NodeAddr;
use palisade_server::{ServerConfig, run_on};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tracing::Instrument;

pub use check::Verdict;
pub use nemesis::{Fault, FaultSet};

/// The port every node's client listener uses on its simulated host.
const CLIENT_PORT: u16 = 7001;
/// The port every node's peer listener uses.
const PEER_PORT: u16 = 7002;

pub use palisade_core::machine::RecipeBugs;
pub use palisade_server::io::Planted;

/// One simulation run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Everything random in the run follows from it.
    pub seed: u64,
    /// Cluster size (3 or 5).
    pub nodes: usize,
    /// Client hosts, each with its own sessions.
    pub clients: usize,
    /// How many distinct locks the clients contend for.
    pub locks: usize,
    /// Whether the clients also claim the recipes: a semaphore, a read/write
    /// lock and an election, beside the plain locks (on by default).
    pub recipes: bool,
    /// Which faults the nemesis may inject.
    pub faults: FaultSet,
    /// Faults are injected from the first leader until this much later.
    pub fault_window: Duration,
    /// After the faults end (everything healed and restarted), how long the
    /// clients go on; every acquire in it must be answered.
    pub quiet: Duration,
    /// Bugs planted for the simulator's own tests.
    pub planted: Planted,
    /// Inject at most this many faults (`None`: no limit) — how a failing seed
    /// is cut down to its shortest failing prefix: the same seed with fewer
    /// faults replays the same history up to the first fault left out.
    pub max_faults: Option<usize>,
    /// With the `skew` fault, each node's clock runs at a rate drawn from
    /// `1 ± max_skew` for its lease countdowns (0.05 by default: within the
    /// clients' 10 % margin, so leases must stay safe).
    pub max_skew: f64,
}

impl SimConfig {
    /// The defaults for `seed`: 3 nodes, 4 clients on 2 locks and the three
    /// recipes, every fault, 20 s of faults and 10 s of quiet.
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            nodes: 3,
            clients: 4,
            locks: 2,
            recipes: true,
            faults: FaultSet::all(),
            fault_window: Duration::from_secs(20),
            quiet: Duration::from_secs(10),
            planted: Planted::default(),
            max_faults: None,
            max_skew: 0.05,
        }
    }
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The run's configuration seed.
    pub seed: u64,
    /// Everything the clients and the nemesis saw, on simulated time.
    pub history: History,
    /// The judgement of the history.
    pub verdict: Verdict,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// Faults injected.
    pub faults: usize,
    /// A run that could not even complete (a host failed): the reason.
    pub aborted: Option<String>,
}

impl Outcome {
    /// Whether the run broke no invariant and completed.
    pub fn passed(&self) -> bool {
        self.aborted.is_none() && self.verdict.violations.is_empty()
    }

    /// The outcome in one line, without the history (what `palisade sim`'s
    /// worker processes report).
    pub fn line(&self) -> OutcomeLine {
        OutcomeLine {
            seed: self.seed,
            aborted: self.aborted.clone(),
            violations: self.verdict.violations.clone(),
            faults: self.faults,
            grants: self.verdict.grants,
            simulated_ms: self.simulated.as_millis() as u64,
        }
    }
}

/// An [`Outcome`] without its history, as one JSON line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutcomeLine {
    /// The seed.
    pub seed: u64,
    /// Why the run could not complete, if it did not.
    pub aborted: Option<String>,
    /// Invariants broken.
    pub violations: Vec<String>,
    /// Faults injected.
    pub faults: usize,
    /// Grants checked.
    pub grants: usize,
    /// Simulated milliseconds.
    pub simulated_ms: u64,
}

impl OutcomeLine {
    /// Whether the run broke no invariant and completed.
    pub fn passed(&self) -> bool {
        self.aborted.is_none() && self.violations.is_empty()
    }

    /// What went wrong, in one line.
    pub fn failure(&self) -> String {
        match &self.aborted {
            // What the history showed up to there is worth saying too.
            Some(why) if !self.violations.is_empty() => format!(
                "the run did not complete: {why}; before that: {}",
                self.violations.join("; ")
            ),
            Some(why) => format!("the run did not complete: {why}"),
            None => self.violations.join("; "),
        }
    }
}

/// The shared record of a run: events on simulated time.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    events: Rc<RefCell<Vec<Event>>>,
}

impl Recorder {
    /// Appends an event by `client` at the current simulated time (from
    /// inside a simulated host).
    /// Returns its place in the history.
    pub fn record(&self, client: u32, kind: EventKind) -> usize {
        self.record_at(sim_now_us(), client, kind)
    }

    /// Appends an event by `client` (0: the nemesis) at `at_us`; returns its
    /// place in the history.
    pub fn record_at(&self, at_us: u64, client: u32, kind: EventKind) -> usize {
        let mut events = self.events.borrow_mut();
        events.push(Event {
            at_us,
            client,
            kind,
        });
        events.len() - 1
    }

    /// The holder of the grant recorded at `grant` (an `AcquireOk`) saw its
    /// guarantee reach `valid_until_us` (a keep-alive extended it): the
    /// checker then holds every other grant of the lock to that too.
    pub fn extend_guarantee(&self, grant: usize, valid_until_us: u64) {
        if let Some(Event {
            kind:
                EventKind::AcquireOk {
                    valid_until_us: Some(until),
                    ..
                },
            ..
        }) = self.events.borrow_mut().get_mut(grant)
        {
            *until = (*until).max(valid_until_us);
        }
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(&mut self.events.borrow_mut())
    }
}

/// Simulated time since the start of the run, in microseconds.
pub fn sim_now_us() -> u64 {
    simulated_time().map_or(0, |d| d.as_micros() as u64)
}

/// Simulated time since the start of the run, if this thread is inside one.
pub fn simulated_time() -> Option<Duration> {
    turmoil::sim_elapsed()
}

fn node_name(id: u64) -> String {
    format!("n{id}")
}

/// The client addresses of every node (`nI:PORT`), as clients are given them.
fn endpoints(nodes: usize) -> Vec<String> {
    (1..=nodes as u64)
        .map(|id| format!("{}:{CLIENT_PORT}", node_name(id)))
        .collect()
}

/// tokio numbers every task from one counter per process and, when a runtime
/// is dropped (a node's crash), shuts its tasks down shard by shard, a task's
/// shard being its number modulo 4. The order decides which of the crashed
/// node's connections sends its last packets first. So that it is the same in
/// every run, every run starts its tasks at a number ≡ 0 (mod 4).
fn align_task_numbers() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    loop {
        let task = rt.spawn(async {});
        let number: u64 = task.id().to_string().parse().unwrap_or(3);
        let _ = rt.block_on(task);
        if number % 4 == 3 {
            return;
        }
    }
}

/// Makes the next simulation in this process replay exactly: tokio's task
/// numbers aligned, openraft's election timeouts drawn from `seed`.
pub fn prepare(seed: u64) {
    align_task_numbers();
    palisade_server::runtime::seed_thread_rng(seed);
}

/// The simulation every run uses: 1 ms steps, links of 0.2–3 ms, for `duration`
/// of simulated time at most, everything random drawn from `seed`.
pub fn builder(seed: u64, duration: Duration) -> turmoil::Builder {
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(seed)
        .epoch(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
        .simulation_duration(duration)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(200))
        .max_message_latency(Duration::from_millis(3))
        .tcp_capacity(4096);
    builder
}

/// A client's configuration for the nodes of [`start_cluster`], dialing over
/// the simulated network.
pub fn client_config(nodes: usize) -> palisade_client::ClientConfig {
    let mut config = palisade_client::ClientConfig::new(endpoints(nodes));
    config.dialer = Some(Arc::new(net::SimNet));
    config
}

/// What [`start_cluster`] set up, for the nemesis and the checks.
pub struct Cluster {
    /// Each node's disk, by node id.
    pub disks: BTreeMap<u64, disk::SimDisk>,
    /// Every entry every node applied.
    pub applied: Arc<std::sync::Mutex<check::Applied>>,
    /// The Raft links between the nodes.
    pub links: Arc<links::Links>,
    /// Each node's clock rate (1: true), by node id.
    pub clock_rates: BTreeMap<u64, f64>,
}

/// Adds `config.nodes` nodes of the real server to `sim` as hosts `n1`, `n2`, …
/// (each restarts on its own disk after a crash).
pub fn start_cluster(sim: &mut turmoil::Sim<'_>, config: &SimConfig) -> Cluster {
    let mut initial = BTreeMap::new();
    for id in 1..=config.nodes as u64 {
        let name = node_name(id);
        initial.insert(
            id,
            NodeAddr::new(
                format!("{name}:{CLIENT_PORT}"),
                format!("{name}:{PEER_PORT}"),
            ),
        );
    }
    let mut disks = BTreeMap::new();
    // Every node's applied entries: index → (term, digest, first node).
    let applied: Arc<std::sync::Mutex<check::Applied>> = Arc::default();
    let links = Arc::new(links::Links::new(config.seed ^ 0x006c_696e_6b73));
    // A clock's rate is the node's, for the whole run, across restarts.
    let mut skew = SmallRng::seed_from_u64(config.seed ^ 0x0000_736b_6577);
    let clock_rates: BTreeMap<u64, f64> = (1..=config.nodes as u64)
        .map(|id| {
            let rate = if config.faults.contains(Fault::Skew) {
                1.0 + skew.random_range(-config.max_skew..=config.max_skew)
            } else {
                1.0
            };
            (id, rate)
        })
        .collect();
    for id in 1..=config.nodes as u64 {
        let disk = disk::SimDisk::new(
            config.seed ^ (id << 32),
            Duration::from_micros(100),
            Duration::from_millis(2),
        );
        disks.insert(id, disk.clone());
        let planted = config.planted;
        let applied = applied.clone();
        let links = links.clone();
        let clock_rate = clock_rates[&id];
        let server = ServerConfig {
            id,
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), CLIENT_PORT),
            listen_peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PEER_PORT),
            advertise: initial[&id].addr.clone(),
            advertise_peer: initial[&id].peer(),
            security: Default::default(),
            data_dir: "/data".into(),
            initial_cluster: initial.clone(),
            // Small, so that runs build snapshots, compact the log and send
            // snapshots to nodes that fell behind.
            snapshot_every: 40,
            join: false,
            metrics_listen: None,
            metrics_open: false,
        };
        // Each start of the node mints session keys from its own seed, so a
        // replay mints the same keys and a restart does not repeat them.
        let starts = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seed = config.seed;
        sim.host(node_name(id), move || {
            let mut io = Io::simulated(Arc::new(disk.clone()), Arc::new(net::SimNet));
            io.planted = planted;
            io.clock_rate = clock_rate;
            let start = starts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            io.session_keys = palisade_server::security::SessionKeys::seeded(
                seed ^ (id << 48) ^ (start << 32) ^ 0x5e55_10e5,
            );
            let applied = applied.clone();
            io.on_apply = Some(palisade_server::io::ApplyObserver(Arc::new(move |entry| {
                applied.lock().expect("poisoned").record(id, entry)
            })));
            io.message_fates = Some(palisade_server::io::MessageFatesHook(links.clone()));
            let server = server.clone();
            async move {
                run_on(server, io, std::future::pending(), || {})
                    .instrument(tracing::info_span!("node", id))
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
            }
        });
    }
    Cluster {
        disks,
        applied,
        links,
        clock_rates,
    }
}

/// Runs one simulation to its end and judges it.
///
/// Deterministic — the same `config` gives the same [`Outcome`], history byte
/// for byte — provided nothing else in the process creates tokio tasks while
/// it runs (tokio's task numbers are process-wide; see `align_task_numbers`):
/// run simulations one at a time per process (`palisade sim --jobs` uses one
/// process per job).
pub fn run(config: &SimConfig) -> Outcome {
    prepare(config.seed);
    let total = nemesis::SETTLE + config.fault_window + config.quiet + Duration::from_secs(30);
    let mut sim = builder(config.seed, total).build();
    let Cluster {
        disks,
        applied,
        links,
        clock_rates,
    } = start_cluster(&mut sim, config);

    let recorder = Recorder::default();
    for (id, rate) in clock_rates.into_iter().filter(|(_, r)| *r != 1.0) {
        let what = format!(
            "node {id}'s clock runs {:.1} % {}",
            (rate - 1.0).abs() * 100.0,
            if rate > 1.0 { "fast" } else { "slow" }
        );
        recorder.record_at(0, 0, EventKind::Fault { what });
    }
    let end_us = (nemesis::SETTLE + config.fault_window + config.quiet).as_micros() as u64;
    let fence = workload::Fence::default();
    for c in 1..=config.clients as u32 {
        let plan = workload::Plan {
            client: c,
            endpoints: endpoints(config.nodes),
            locks: config.locks,
            recipes: config.recipes,
            seed: config.seed.wrapping_mul(31).wrapping_add(u64::from(c)),
            end_us,
            pauses: config.faults.contains(Fault::ClientPause),
        };
        sim.client(
            format!("c{c}"),
            workload::run(plan, recorder.clone(), fence.clone()),
        );
    }

    let mut nemesis = nemesis::Nemesis::new(
        SmallRng::seed_from_u64(config.seed ^ 0x006e_656d_6573_6973),
        config,
        disks,
        links,
        applied.clone(),
    );
    let mut aborted = None;
    loop {
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                aborted = Some(e.to_string());
                break;
            }
        }
        nemesis.tick(&mut sim, &recorder);
    }
    let simulated = sim.elapsed();
    let history = History {
        scenario: "sim".into(),
        variant: config.faults.to_string(),
        backend: "palisade".into(),
        fencing: true,
        seed: config.seed,
        events: recorder.take(),
    };
    let mut verdict = check::judge(&history, nemesis.healed_at_us(), end_us);
    verdict
        .violations
        .extend(applied.lock().expect("poisoned").divergences());
    Outcome {
        seed: config.seed,
        history,
        verdict,
        simulated,
        faults: nemesis.injected(),
        aborted,
    }
}
