//! The faults of a run, drawn from its seed: node crashes (half of them aimed
//! between a log write and its sync, some leaving torn writes), blackouts of
//! every node at once, partitions (half of them of the leader, while clients
//! keep their sessions alive through it), one-way partitions, slow links, and
//! links that lose, repeat or reorder Raft messages. Client pauses are the
//! clients' own ([`crate::workload::Plan::pauses`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use palisade_chaos::EventKind;
use rand::Rng;
use rand::rngs::SmallRng;

use std::sync::{Arc, Mutex};

use crate::check::Applied;
use crate::disk::SimDisk;
use crate::links::{Flaky, Links};
use crate::{Recorder, SimConfig, node_name};

/// How long the cluster has to form before the first fault.
pub const SETTLE: Duration = Duration::from_secs(5);

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A node loses power; it restarts later on what its disk had synced.
    Crash,
    /// A crash may also leave part of the writes after the last sync.
    Torn,
    /// Every node loses power at the same instant (a data centre's power
    /// cut), then all restart.
    Blackout,
    /// A node's links to the other nodes are held (nothing gets through,
    /// nothing is lost), then released. Half of these isolate the leader.
    Partition,
    /// One direction only: a node hears no other node, or no other node hears
    /// it, or one node does not hear one other. Requests into the deaf
    /// direction are lost; calls the other way arrive and their replies are lost.
    OneWay,
    /// One link between two nodes becomes slow (up to 300 ms per message).
    Delay,
    /// One link loses a quarter of its Raft messages (requests or replies).
    Loss,
    /// One link delivers a quarter of its Raft messages twice, the copy late.
    Dup,
    /// One link holds a third of its Raft messages, so later ones overtake.
    Reorder,
    /// A client stops looking at its guard for twice its lease.
    ClientPause,
    /// A client's links to every node are held 0.5–4 s (its session may
    /// expire meanwhile), then released.
    ClientCut,
    /// Each node's clock runs up to [`SimConfig::max_skew`] fast or slow (5 %
    /// by default) for its lease countdowns, for the whole run.
    Skew,
}

impl Fault {
    const ALL: [Fault; 12] = [
        Fault::Crash,
        Fault::Torn,
        Fault::Blackout,
        Fault::Partition,
        Fault::OneWay,
        Fault::Delay,
        Fault::Loss,
        Fault::Dup,
        Fault::Reorder,
        Fault::ClientPause,
        Fault::ClientCut,
        Fault::Skew,
    ];

    /// The name `--faults` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash",
            Fault::Torn => "torn",
            Fault::Blackout => "blackout",
            Fault::Partition => "partition",
            Fault::OneWay => "oneway",
            Fault::Delay => "delay",
            Fault::Loss => "loss",
            Fault::Dup => "dup",
            Fault::Reorder => "reorder",
            Fault::ClientPause => "pause",
            Fault::ClientCut => "cut",
            Fault::Skew => "skew",
        }
    }
}

/// A set of [`Fault`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultSet(u16);

impl FaultSet {
    /// No faults at all.
    pub fn none() -> FaultSet {
        FaultSet(0)
    }

    /// Every fault.
    pub fn all() -> FaultSet {
        FaultSet(Fault::ALL.iter().fold(0, |bits, f| bits | 1 << *f as u8))
    }

    /// Whether `fault` is in the set.
    pub fn contains(self, fault: Fault) -> bool {
        self.0 & 1 << fault as u8 != 0
    }

    /// Parses a comma-separated list of names (`crash,partition`), `all` or `none`.
    ///
    /// # Errors
    /// A message naming the unknown fault and the known ones.
    pub fn parse(text: &str) -> Result<FaultSet, String> {
        let mut set = FaultSet::none();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "all" => set = FaultSet::all(),
                "none" => {}
                _ => {
                    let fault = Fault::ALL
                        .into_iter()
                        .find(|f| f.name() == word)
                        .ok_or_else(|| {
                            format!(
                                "unknown fault {word:?}; known: all, none, {}",
                                Fault::ALL.map(Fault::name).join(", ")
                            )
                        })?;
                    set.0 |= 1 << fault as u8;
                }
            }
        }
        Ok(set)
    }
}

impl fmt::Display for FaultSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<_> = Fault::ALL
            .into_iter()
            .filter(|x| self.contains(*x))
            .map(Fault::name)
            .collect();
        if names.is_empty() {
            write!(f, "none")
        } else {
            write!(f, "{}", names.join(","))
        }
    }
}

/// A fault in effect, and when it ends.
#[derive(Debug)]
enum Active {
    Crashed {
        node: u64,
        until_us: u64,
    },
    Held {
        node: u64,
        until_us: u64,
    },
    /// `(from, to)` directions that do not carry Raft messages; `node` is the
    /// one the fault is about.
    Deaf {
        node: u64,
        directions: Vec<(u64, u64)>,
        until_us: u64,
    },
    Slow {
        a: u64,
        b: u64,
        until_us: u64,
    },
    Flaky {
        a: u64,
        b: u64,
        until_us: u64,
    },
    Cut {
        client: u64,
        until_us: u64,
    },
}

impl Active {
    fn until_us(&self) -> u64 {
        match self {
            Active::Crashed { until_us, .. }
            | Active::Held { until_us, .. }
            | Active::Deaf { until_us, .. }
            | Active::Slow { until_us, .. }
            | Active::Flaky { until_us, .. }
            | Active::Cut { until_us, .. } => *until_us,
        }
    }

    /// The node this fault takes down or cuts off, if it does.
    fn node_out(&self) -> Option<u64> {
        match self {
            Active::Crashed { node, .. }
            | Active::Held { node, .. }
            | Active::Deaf { node, .. } => Some(*node),
            Active::Slow { .. } | Active::Flaky { .. } | Active::Cut { .. } => None,
        }
    }
}

/// Injects faults between simulation steps.
pub struct Nemesis {
    rng: SmallRng,
    faults: FaultSet,
    nodes: u64,
    clients: u64,
    disks: BTreeMap<u64, SimDisk>,
    links: Arc<Links>,
    applied: Arc<Mutex<Applied>>,
    start_us: u64,
    end_us: u64,
    next_us: u64,
    active: Vec<Active>,
    /// A crash waiting for its node to have unsynced writes (or its deadline).
    aimed: Option<Aimed>,
    injected: usize,
    max_faults: usize,
    healed_at_us: u64,
}

/// A crash that waits for the moment between a write and its sync.
#[derive(Debug)]
struct Aimed {
    node: u64,
    torn: bool,
    lasts: u64,
    deadline_us: u64,
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

impl Nemesis {
    /// The nemesis of `config`'s run over `disks` (one per node) and the
    /// nodes' `links`; `applied` tells it who leads.
    pub fn new(
        rng: SmallRng,
        config: &SimConfig,
        disks: BTreeMap<u64, SimDisk>,
        links: Arc<Links>,
        applied: Arc<Mutex<Applied>>,
    ) -> Nemesis {
        let start_us = us(SETTLE);
        let end_us = start_us + us(config.fault_window);
        Nemesis {
            rng,
            faults: config.faults,
            nodes: config.nodes as u64,
            clients: config.clients as u64,
            disks,
            links,
            applied,
            start_us,
            end_us,
            next_us: start_us,
            active: Vec::new(),
            aimed: None,
            injected: 0,
            max_faults: config.max_faults.unwrap_or(usize::MAX),
            healed_at_us: end_us,
        }
    }

    /// How many faults were injected.
    pub fn injected(&self) -> usize {
        self.injected
    }

    /// When the last fault was healed (simulated µs).
    pub fn healed_at_us(&self) -> u64 {
        self.healed_at_us
    }

    /// Called after every simulation step: ends faults that are due, and
    /// injects the next one when its time has come.
    pub fn tick(&mut self, sim: &mut turmoil::Sim<'_>, rec: &Recorder) {
        let now = us(sim.elapsed());
        let ending = now >= self.end_us;
        let mut i = 0;
        while i < self.active.len() {
            if ending || self.active[i].until_us() <= now {
                let fault = self.active.swap_remove(i);
                self.heal(sim, rec, fault, now);
                if ending && self.active.is_empty() {
                    self.healed_at_us = now;
                }
            } else {
                i += 1;
            }
        }
        if let Some(aim) = self.aimed.take() {
            let targets: Vec<u64> = if aim.node == 0 {
                (1..=self.nodes).collect()
            } else {
                vec![aim.node]
            };
            let fire =
                targets.iter().any(|n| self.disks[n].has_unsynced()) || now >= aim.deadline_us;
            if fire && !ending {
                if aim.node == 0 {
                    self.blackout(sim, rec, now, aim.torn, aim.lasts);
                } else {
                    self.crash(sim, rec, now, aim.node, aim.torn, aim.lasts);
                }
            } else if !ending {
                self.aimed = Some(aim);
            }
            return;
        }
        if ending || now < self.next_us || now < self.start_us || self.injected >= self.max_faults {
            return;
        }
        self.next_us = now + self.rng.random_range(300_000..2_000_000);
        let choices: Vec<Fault> = [
            Fault::Crash,
            Fault::Partition,
            Fault::OneWay,
            Fault::Delay,
            Fault::Loss,
            Fault::Dup,
            Fault::Reorder,
            Fault::ClientCut,
            Fault::Blackout,
        ]
        .into_iter()
        .filter(|f| self.faults.contains(*f))
        .collect();
        if choices.is_empty() {
            return;
        }
        let fault = choices[self.rng.random_range(0..choices.len())];
        let mut node = self.rng.random_range(1..=self.nodes);
        let lasts = self.rng.random_range(200_000..3_000_000);
        let mut leader = false;
        if fault == Fault::Partition && self.rng.random_bool(0.5) {
            // Cut the leader off while the clients, which still reach it, keep
            // their sessions alive through it.
            if let Some(l) = self.applied.lock().expect("poisoned").latest_leader() {
                (node, leader) = (l, true);
            }
        }
        let busy = |n: u64| self.active.iter().any(|a| a.node_out() == Some(n));
        let down = self
            .active
            .iter()
            .filter(|a| a.node_out().is_some())
            .count() as u64;
        let other = {
            let o = self.rng.random_range(1..self.nodes);
            if o >= node { o + 1 } else { o }
        };
        let link_busy = self.active.iter().any(|a| match a {
            Active::Slow { a, b, .. } | Active::Flaky { a, b, .. } => {
                (*a, *b) == (node, other) || (*b, *a) == (node, other)
            }
            _ => false,
        });
        match fault {
            // At most a minority down or cut off at once, so that the cluster
            // makes progress during the window too.
            Fault::Crash | Fault::Partition | Fault::OneWay
                if busy(node) || 2 * (down + 1) > self.nodes => {}
            // One fault per link at a time: its healing must not end another's.
            Fault::Delay | Fault::Loss | Fault::Dup | Fault::Reorder if link_busy => {}
            Fault::Crash => {
                let torn = self.faults.contains(Fault::Torn) && self.rng.random_bool(0.5);
                if self.rng.random_bool(0.5) {
                    // Aimed at a write in flight: the crash comes between a
                    // log write and its sync, if one happens within a second.
                    self.aimed = Some(Aimed {
                        node,
                        torn,
                        lasts,
                        deadline_us: now + 1_000_000,
                    });
                } else {
                    self.crash(sim, rec, now, node, torn, lasts);
                }
            }
            Fault::Partition => {
                for other in (1..=self.nodes).filter(|o| *o != node) {
                    sim.hold(node_name(node), node_name(other));
                }
                let what = format!(
                    "isolate node {node}{} from the other nodes",
                    if leader { " (the leader)" } else { "" }
                );
                self.begin(
                    rec,
                    now,
                    what,
                    Active::Held {
                        node,
                        until_us: now + lasts,
                    },
                );
            }
            Fault::OneWay => {
                let others = (1..=self.nodes).filter(|o| *o != node);
                let (directions, what): (Vec<_>, _) = match self.rng.random_range(0..3) {
                    0 => (
                        others.map(|o| (o, node)).collect(),
                        format!("node {node} hears no other node (they hear it)"),
                    ),
                    1 => (
                        others.map(|o| (node, o)).collect(),
                        format!("no node hears node {node} (it hears them)"),
                    ),
                    _ => (
                        vec![(other, node)],
                        format!("node {node} does not hear node {other}"),
                    ),
                };
                for &(from, to) in &directions {
                    self.links.deafen(from, to);
                }
                self.begin(
                    rec,
                    now,
                    what,
                    Active::Deaf {
                        node,
                        directions,
                        until_us: now + lasts,
                    },
                );
            }
            Fault::Delay => {
                let slow = Duration::from_millis(self.rng.random_range(20..300));
                sim.set_link_max_message_latency(node_name(node), node_name(other), slow);
                let what = format!("slow link {node}-{other} (up to {} ms)", slow.as_millis());
                self.begin(
                    rec,
                    now,
                    what,
                    Active::Slow {
                        a: node,
                        b: other,
                        until_us: now + lasts,
                    },
                );
            }
            Fault::Loss | Fault::Dup | Fault::Reorder => {
                let (flaky, how) = match fault {
                    Fault::Loss => (Flaky::Loss, "loses Raft messages"),
                    Fault::Dup => (Flaky::Dup, "repeats Raft messages"),
                    _ => (Flaky::Reorder, "reorders Raft messages"),
                };
                self.links.set_flaky(node, other, Some(flaky));
                let what = format!("link {node}-{other} {how}");
                self.begin(
                    rec,
                    now,
                    what,
                    Active::Flaky {
                        a: node,
                        b: other,
                        until_us: now + lasts,
                    },
                );
            }
            Fault::ClientCut if self.clients == 0 => {}
            Fault::ClientCut => {
                let client = self.rng.random_range(1..=self.clients);
                let cut = self
                    .active
                    .iter()
                    .any(|a| matches!(a, Active::Cut { client: c, .. } if *c == client));
                if !cut {
                    let lasts = self.rng.random_range(500_000..4_000_000);
                    for n in 1..=self.nodes {
                        sim.hold(format!("c{client}"), node_name(n));
                    }
                    let what = format!("cut client {client} off from every node");
                    self.begin(
                        rec,
                        now,
                        what,
                        Active::Cut {
                            client,
                            until_us: now + lasts,
                        },
                    );
                }
            }
            Fault::Blackout if !self.active.is_empty() => {}
            Fault::Blackout => {
                // Aimed like a crash: at a moment some node has a write in flight.
                self.aimed = Some(Aimed {
                    node: 0,
                    torn: self.faults.contains(Fault::Torn) && self.rng.random_bool(0.5),
                    lasts,
                    deadline_us: now + 1_000_000,
                });
            }
            Fault::Torn | Fault::ClientPause | Fault::Skew => {}
        }
    }

    /// Records `what` and keeps `fault` in effect until it heals.
    fn begin(&mut self, rec: &Recorder, now: u64, what: String, fault: Active) {
        rec.record_at(now, 0, EventKind::Fault { what });
        self.active.push(fault);
        self.injected += 1;
    }

    fn crash(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        rec: &Recorder,
        now: u64,
        node: u64,
        torn: bool,
        lasts: u64,
    ) {
        sim.crash(node_name(node));
        let lost = self.disks[&node].crash(torn);
        let what = format!(
            "crash node {node}{}{}",
            if torn { ", torn writes" } else { "" },
            if lost > 0 {
                ", unsynced writes lost"
            } else {
                ""
            }
        );
        self.begin(
            rec,
            now,
            what,
            Active::Crashed {
                node,
                until_us: now + lasts,
            },
        );
    }

    fn blackout(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        rec: &Recorder,
        now: u64,
        torn: bool,
        lasts: u64,
    ) {
        let mut lost = 0;
        for node in 1..=self.nodes {
            sim.crash(node_name(node));
            lost += self.disks[&node].crash(torn);
        }
        let what = format!(
            "blackout: every node loses power{}{}",
            if torn { ", torn writes" } else { "" },
            if lost > 0 {
                ", unsynced writes lost"
            } else {
                ""
            }
        );
        rec.record_at(now, 0, EventKind::Fault { what });
        for node in 1..=self.nodes {
            self.active.push(Active::Crashed {
                node,
                until_us: now + lasts,
            });
        }
        self.injected += 1;
    }

    fn heal(&mut self, sim: &mut turmoil::Sim<'_>, rec: &Recorder, fault: Active, now: u64) {
        let what = match fault {
            Active::Crashed { node, .. } => {
                sim.bounce(node_name(node));
                format!("restart node {node}")
            }
            Active::Held { node, .. } => {
                for other in (1..=self.nodes).filter(|o| *o != node) {
                    sim.release(node_name(node), node_name(other));
                }
                format!("heal node {node}")
            }
            Active::Deaf {
                node, directions, ..
            } => {
                for (from, to) in directions {
                    self.links.hear(from, to);
                }
                format!("node {node} hears and is heard again")
            }
            Active::Cut { client, .. } => {
                for n in 1..=self.nodes {
                    sim.release(format!("c{client}"), node_name(n));
                }
                format!("client {client} reconnected")
            }
            Active::Flaky { a, b, .. } => {
                self.links.set_flaky(a, b, None);
                format!("link {a}-{b} healthy again")
            }
            Active::Slow { a, b, .. } => {
                sim.set_link_max_message_latency(
                    node_name(a),
                    node_name(b),
                    Duration::from_millis(3),
                );
                format!("speed up link {a}-{b}")
            }
        };
        rec.record_at(now, 0, EventKind::Fault { what });
    }
}
