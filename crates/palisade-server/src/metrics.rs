//! A node's Prometheus metrics (the `prometheus` crate; its text format is the
//! one `promtool check metrics` and every Prometheus version read).
//!
//! Two kinds: what is counted as it happens — each component owns its
//! counters and histograms ([`ApplyCounters`] in the state machine, the commit
//! and fsync histograms in [`crate::commit_clock`] and the log store) and the
//! registry holds clones of them — and what is read at scrape time from
//! openraft's metrics and the lock state ([`NodeMetrics::render`]), so that a
//! node that is never scraped pays nothing for it.
//!
//! Counters of applied commands count what *this node* applied: every member
//! applies every entry, so a cluster's figure is one node's (the leader's, or
//! `max` over nodes), not their sum.

use openraft::ServerState;
use openraft::async_runtime::Instant as _;
use openraft::async_runtime::WatchReceiver;
use palisade_core::machine::{Applied, CommandKind, MachineError, Reply, Shape};
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::store::sm::Shared;
use crate::typ::Raft;

/// Bucket bounds in seconds for durations from 50 µs to about 3 s.
fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(50e-6, 2.0, 17).expect("valid buckets")
}

/// A histogram of durations in seconds, with bounds from 50 µs to ~3 s.
pub fn latency_histogram(name: &str, help: &str) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(latency_buckets()))
        .expect("valid histogram")
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid counter")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid gauge")
}

/// What the state machine counts as it applies entries.
#[derive(Clone)]
pub struct ApplyCounters {
    /// Log entries applied (blank and membership entries included).
    pub entries: IntCounter,
    /// Commands per applied entry: how well the proposer batches.
    pub commands_per_entry: Histogram,
    /// Commands applied, by kind (`acquire`, `release`, …).
    pub commands: IntCounterVec,
    /// Commands the machine refused, by reason (`not_holder`, `stale_token`, …).
    pub refused: IntCounterVec,
    /// Grants made: new holders, including hand-offs to waiters.
    pub grants: IntCounter,
    /// Locks given back, by how: `release`, `close` (session closed) or
    /// `expiry` (session expired).
    pub releases: IntCounterVec,
    /// Sessions created.
    pub sessions_created: IntCounter,
    /// Sessions ended because their lease ran out.
    pub expiries: IntCounter,
    /// Locks that entered lock-delay (their holder's session expired).
    pub lock_delays: IntCounter,
    /// Acquires that found a lock in lock-delay.
    pub lock_delay_hits: IntCounter,
    /// `commands` resolved per kind, at [`CommandKind::index`], and
    /// `releases` per how: the apply path adds to them without a label lookup.
    by_kind: [IntCounter; CommandKind::ALL.len()],
    released_by: [IntCounter; 3],
}

/// `releases`' labels, in `released_by` order.
const RELEASED_BY: [&str; 3] = ["release", "close", "expiry"];

impl Default for ApplyCounters {
    fn default() -> Self {
        let vec = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid counter")
        };
        let commands = vec(
            "palisade_commands_applied_total",
            "Commands applied by this node, by kind.",
            "command",
        );
        let releases = vec(
            "palisade_releases_total",
            "Locks given back: by release, by the session's close, or by its expiry.",
            "how",
        );
        let counters = ApplyCounters {
            by_kind: CommandKind::ALL.map(|kind| commands.with_label_values(&[kind.as_str()])),
            released_by: RELEASED_BY.map(|how| releases.with_label_values(&[how])),
            commands,
            releases,
            entries: counter(
                "palisade_entries_applied_total",
                "Log entries applied by this node.",
            ),
            commands_per_entry: Histogram::with_opts(
                HistogramOpts::new(
                    "palisade_commands_per_entry",
                    "Commands carried by each applied entry (group commit).",
                )
                .buckets(prometheus::exponential_buckets(1.0, 2.0, 11).expect("valid buckets")),
            )
            .expect("valid histogram"),
            refused: vec(
                "palisade_commands_refused_total",
                "Commands the lock machine refused (and that changed nothing), by reason.",
                "reason",
            ),
            grants: counter(
                "palisade_grants_total",
                "Locks granted, each with a new fencing token (hand-offs to waiters included).",
            ),
            sessions_created: counter("palisade_sessions_created_total", "Sessions created."),
            expiries: counter(
                "palisade_session_expiries_total",
                "Sessions ended by the leader because their lease ran out.",
            ),
            lock_delays: counter(
                "palisade_lock_delays_total",
                "Locks that entered lock-delay because their holder's session expired.",
            ),
            lock_delay_hits: counter(
                "palisade_lock_delay_hits_total",
                "Acquires that found the lock in lock-delay.",
            ),
        };
        // Every series exists from the start at 0 (the resolved ones above
        // too), so that `rate()` and `increase()` see the first event rather
        // than a series appearing.
        for reason in REFUSALS {
            counters.refused.with_label_values(&[reason]);
        }
        counters
    }
}

/// Every label [`refusal`] gives.
const REFUSALS: [&str; 10] = [
    "invalid_input",
    "unknown_session",
    "no_such_lock",
    "not_holder",
    "stale_token",
    "not_waiting",
    "already_granted",
    "not_in_lock_delay",
    "limit_reached",
    "batch_conflict",
];

impl ApplyCounters {
    /// Counts one applied entry, given its commands' kinds
    /// ([`Command::kind`]) and what they did.
    pub fn count_entry(&self, applied: &[Applied]) {
        self.entries.inc();
        self.commands_per_entry.observe(applied.len() as f64);
        // Tallied here and added once per entry: a batch of a thousand
        // commands costs a handful of atomic adds.
        let mut by_kind = [0u64; CommandKind::ALL.len()];
        let mut released_by = [0u64; RELEASED_BY.len()];
        let mut grants = 0;
        for a in applied {
            let kind = a.kind;
            by_kind[kind.index()] += 1;
            grants += a.grants.len() as u64;
            match &a.outcome {
                Ok(Reply::SessionCreated { .. }) => self.sessions_created.inc(),
                Ok(Reply::Released { retried: false }) => released_by[0] += 1,
                Ok(Reply::SessionEnded {
                    released,
                    lock_delay,
                    ..
                }) => {
                    let expired = kind.is_expiry();
                    if expired {
                        self.expiries.inc();
                    }
                    released_by[if expired { 2 } else { 1 }] += released.len() as u64;
                    self.lock_delays.inc_by(lock_delay.len() as u64);
                }
                Ok(Reply::WouldBlock { holder_token: None }) => self.lock_delay_hits.inc(),
                Ok(_) => {}
                Err(e) => self.refused.with_label_values(&[refusal(e)]).inc(),
            }
        }
        self.grants.inc_by(grants);
        for (counter, n) in self.by_kind.iter().zip(by_kind) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        for (counter, n) in self.released_by.iter().zip(released_by) {
            if n > 0 {
                counter.inc_by(n);
            }
        }
    }

    /// An entry without commands (blank or membership).
    pub fn count_other_entry(&self) {
        self.entries.inc();
    }

    fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.entries.clone()))?;
        registry.register(Box::new(self.commands_per_entry.clone()))?;
        registry.register(Box::new(self.commands.clone()))?;
        registry.register(Box::new(self.refused.clone()))?;
        registry.register(Box::new(self.grants.clone()))?;
        registry.register(Box::new(self.releases.clone()))?;
        registry.register(Box::new(self.sessions_created.clone()))?;
        registry.register(Box::new(self.expiries.clone()))?;
        registry.register(Box::new(self.lock_delays.clone()))?;
        registry.register(Box::new(self.lock_delay_hits.clone()))
    }
}

/// A refusal's label: the reason in the words of the wire's error codes.
fn refusal(e: &MachineError) -> &'static str {
    match e {
        MachineError::Input { .. }
        | MachineError::LockDelayTooLong { .. }
        | MachineError::LabelTooLong { .. }
        | MachineError::BadPermits { .. }
        | MachineError::LockDelayNeedsExclusive { .. }
        | MachineError::ValueTooLong { .. } => "invalid_input",
        MachineError::ShapeMismatch { .. } | MachineError::HeldInOtherMode { .. } => "wrong_shape",
        MachineError::UnknownSession { .. } => "unknown_session",
        MachineError::NoSuchLock { .. } => "no_such_lock",
        MachineError::NotHolder { .. } => "not_holder",
        MachineError::StaleToken { .. } => "stale_token",
        MachineError::NotWaiting { .. } => "not_waiting",
        MachineError::AlreadyGranted { .. } => "already_granted",
        MachineError::NotInLockDelay { .. } => "not_in_lock_delay",
        MachineError::TooManySessions { .. }
        | MachineError::TooManyWaiters { .. }
        | MachineError::TooManyLocks { .. } => "limit_reached",
        MachineError::BatchConflict => "batch_conflict",
    }
}

/// Everything a node exports, and the gauges read at scrape time.
pub struct NodeMetrics {
    registry: Registry,
    is_leader: IntGauge,
    leader: IntGauge,
    term: IntGauge,
    last_log: IntGauge,
    committed: IntGauge,
    applied: IntGauge,
    apply_lag: IntGauge,
    snapshot: IntGauge,
    voters: IntGauge,
    sessions: IntGauge,
    held: IntGauge,
    /// Holders by shape ([`Shape::NAMES`]).
    holders: IntGaugeVec,
    in_lock_delay: IntGauge,
    waiters: IntGauge,
    peer_lag: IntGaugeVec,
    peer_ack_age: GaugeVec,
    quorum_ack_age: Gauge,
}

/// What a scrape reads besides the counters.
pub struct ScrapeSources<'a> {
    /// The node's Raft.
    pub raft: &'a Raft,
    /// The lock state.
    pub shared: &'a Shared,
    /// The committed index the log store knows.
    pub committed: u64,
}

impl NodeMetrics {
    /// A registry holding `apply`, the commit and fsync histograms, what the
    /// gatekeeper refused (`refusals`), the process's own figures (CPU,
    /// memory, open files) and the scrape-time gauges.
    pub fn new(
        apply: &ApplyCounters,
        commit: &Histogram,
        fsync: &Histogram,
        refusals: &crate::security::conn::Counters,
    ) -> Self {
        let registry = Registry::new();
        let peer_vec = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["peer"]).expect("valid gauge")
        };
        let metrics = NodeMetrics {
            is_leader: gauge("palisade_is_leader", "1 while this node is the leader."),
            leader: gauge(
                "palisade_leader_id",
                "The id of the leader this node knows (0: none).",
            ),
            term: gauge("palisade_term", "The Raft term this node is in."),
            last_log: gauge(
                "palisade_last_log_index",
                "Index of the last entry in this node's log.",
            ),
            committed: gauge(
                "palisade_commit_index",
                "Index of the last entry this node knows committed.",
            ),
            applied: gauge(
                "palisade_applied_index",
                "Index of the last entry applied to this node's lock state.",
            ),
            apply_lag: gauge(
                "palisade_apply_lag_entries",
                "Committed entries not yet applied on this node.",
            ),
            snapshot: gauge(
                "palisade_snapshot_index",
                "Last index covered by this node's snapshot (0: none).",
            ),
            voters: gauge("palisade_voters", "Voting members of the cluster."),
            sessions: gauge("palisade_sessions", "Live sessions."),
            held: gauge("palisade_locks_held", "Locks with a holder."),
            holders: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "palisade_holders",
                        "Holders by the shape of the lock they hold (mutex, semaphore, read_write, election): each permit and each reader counts.",
                    ),
                    &["shape"],
                )
                .expect("valid gauge");
                for shape in Shape::NAMES {
                    g.with_label_values(&[shape]);
                }
                g
            },
            in_lock_delay: gauge("palisade_locks_in_lock_delay", "Locks in lock-delay."),
            waiters: gauge(
                "palisade_waiters",
                "Acquires queued for a lock, over all locks.",
            ),
            peer_lag: peer_vec(
                "palisade_replication_lag_entries",
                "Entries of the leader's log a member has not yet stored (leader only).",
            ),
            peer_ack_age: GaugeVec::new(
                Opts::new(
                    "palisade_peer_last_ack_age_seconds",
                    "Time since a member last acknowledged the leader (leader only).",
                ),
                &["peer"],
            )
            .expect("valid gauge"),
            quorum_ack_age: Gauge::new(
                "palisade_quorum_ack_age_seconds",
                "Time since a majority last acknowledged this leader (-1 when not leader).",
            )
            .expect("valid gauge"),
            registry,
        };
        metrics
            .register(apply, commit, fsync)
            .and_then(|()| refusals.register(&metrics.registry))
            .expect("metric names are unique");
        metrics
    }

    fn register(
        &self,
        apply: &ApplyCounters,
        commit: &Histogram,
        fsync: &Histogram,
    ) -> prometheus::Result<()> {
        let r = &self.registry;
        apply.register(r)?;
        r.register(Box::new(commit.clone()))?;
        r.register(Box::new(fsync.clone()))?;
        for g in [
            &self.is_leader,
            &self.leader,
            &self.term,
            &self.last_log,
            &self.committed,
            &self.applied,
            &self.apply_lag,
            &self.snapshot,
            &self.voters,
            &self.sessions,
            &self.held,
            &self.in_lock_delay,
            &self.waiters,
        ] {
            r.register(Box::new(g.clone()))?;
        }
        r.register(Box::new(self.holders.clone()))?;
        r.register(Box::new(self.peer_lag.clone()))?;
        r.register(Box::new(self.peer_ack_age.clone()))?;
        r.register(Box::new(self.quorum_ack_age.clone()))?;
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
    }

    /// Reads the scrape-time gauges and renders everything in Prometheus' text
    /// format (version 0.0.4).
    pub fn render(&self, from: &ScrapeSources<'_>) -> String {
        let m = from.raft.metrics().borrow_watched().clone();
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let applied = m.last_applied.map_or(0, |l| l.index);
        let last_log = m.last_log_index.unwrap_or(0);
        self.is_leader
            .set(i64::from(m.state == ServerState::Leader));
        self.leader.set(i(m.current_leader.unwrap_or(0)));
        self.term.set(i(m.current_term));
        self.last_log.set(i(last_log));
        self.committed.set(i(from.committed));
        self.applied.set(i(applied));
        self.apply_lag
            .set(i(from.committed.saturating_sub(applied)));
        self.snapshot.set(i(m.snapshot.map_or(0, |l| l.index)));
        // A clone of the persistent state costs O(1); counting walks the clone
        // without holding up the entries applied meanwhile.
        let machine = from.shared.machine.read().expect("poisoned").clone();
        let counts = machine.counts();
        self.sessions.set(i(counts.sessions));
        self.held.set(i(counts.held));
        for (shape, n) in Shape::NAMES.iter().zip(counts.holders_by_shape) {
            self.holders.with_label_values(&[shape]).set(i(n));
        }
        self.in_lock_delay.set(i(counts.in_lock_delay));
        self.waiters.set(i(counts.waiters));
        // Members that left must not linger as series of their own.
        self.peer_lag.reset();
        self.peer_ack_age.reset();
        let me = m.id;
        if let Some(replication) = &m.replication {
            for (peer, matched) in replication.iter().filter(|(p, _)| **p != me) {
                let matched = matched.as_ref().map_or(0, |l| l.index);
                self.peer_lag
                    .with_label_values(&[&peer.to_string()])
                    .set(i(last_log.saturating_sub(matched)));
            }
        }
        if let Some(heartbeat) = &m.heartbeat {
            for (peer, acked) in heartbeat.iter().filter(|(p, _)| **p != me) {
                if let Some(acked) = acked {
                    self.peer_ack_age
                        .with_label_values(&[&peer.to_string()])
                        .set(acked.elapsed().as_secs_f64());
                }
            }
        }
        let voters = m.membership_config.membership().voter_ids().count();
        self.voters.set(i(voters as u64));
        self.quorum_ack_age.set(match &m.last_quorum_acked {
            // A single voter is its own majority, always.
            Some(_) if voters == 1 => 0.0,
            Some(acked) => acked.elapsed().as_secs_f64(),
            None => -1.0,
        });
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("the text encoder writes to memory");
        String::from_utf8(text).expect("the text format is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use palisade_core::FencingToken;
    use palisade_core::machine::{Command, LockMachine, SessionId, SessionOwner};

    use super::*;

    #[test]
    fn applied_entries_are_counted_by_what_they_did() {
        let mut machine = LockMachine::new();
        let counters = ApplyCounters::default();
        let mut index = 0;
        let mut apply = |cmds: Vec<Command>| {
            index += 1;
            let applied = machine.apply_batch(index, cmds);
            counters.count_entry(&applied);
            applied
        };
        let create = || Command::CreateSession {
            ttl_ms: 5_000,
            label: String::new(),
            owner: SessionOwner::default(),
        };
        apply(vec![create()]);
        apply(vec![create()]);
        let (a, b) = (SessionId(1), SessionId(2));
        let acquire = |session, wait| Command::Acquire {
            session,
            name: "x".into(),
            wait,
            lock_delay_ms: 1_000,
        };
        apply(vec![acquire(a, false), acquire(b, true)]);
        apply(vec![Command::Release {
            session: b,
            name: "x".into(),
            token: FencingToken::new(3).unwrap(),
        }]);
        apply(vec![Command::ExpireSession { session: a }]);
        apply(vec![acquire(SessionId(9), false)]);
        let releases = |how: &str| counters.releases.with_label_values(&[how]).get();
        assert_eq!(counters.entries.get(), 6);
        assert_eq!(counters.commands_per_entry.get_sample_count(), 6);
        assert_eq!(counters.commands_per_entry.get_sample_sum(), 7.0);
        assert_eq!(counters.sessions_created.get(), 2);
        assert_eq!(
            counters.grants.get(),
            1,
            "b only queued; the expiry started lock-delay"
        );
        assert_eq!((releases("release"), releases("expiry")), (0, 1));
        assert_eq!(counters.expiries.get(), 1);
        assert_eq!(counters.lock_delays.get(), 1);
        let refused = |why: &str| counters.refused.with_label_values(&[why]).get();
        assert_eq!(refused("not_holder"), 1, "b released a lock it waits for");
        assert_eq!(refused("unknown_session"), 1);
        assert_eq!(counters.commands.with_label_values(&["acquire"]).get(), 3);
    }
}
