//! Judging a simulated history: `palisade-chaos`'s checker, plus what only a
//! simulator can see — every grant of the whole run on one clock, and a quiet
//! period after the faults in which every request must be answered.

use std::collections::BTreeMap;

use palisade_chaos::{EventKind, History, Report};
use palisade_server::io::AppliedEntry;

/// How long after the last fault healed the cluster may take to serve again
/// (an election, every node catching up, leases restarted at full length).
pub const RECOVERY_US: u64 = 6_000_000;

/// What every node applied, by log index: the first node's entry, and every
/// entry that differed from it (Raft's state machine safety: one entry per
/// index, on every node).
#[derive(Debug, Default)]
pub struct Applied {
    first: BTreeMap<u64, (u64, u64, u64)>,
    divergent: Vec<String>,
    /// The highest term seen in an applied entry, and the node that led it.
    latest_leader: Option<(u64, u64)>,
}

impl Applied {
    /// Node `node` applied `entry`.
    pub fn record(&mut self, node: u64, entry: AppliedEntry) {
        let AppliedEntry {
            index,
            term,
            leader,
            digest,
        } = entry;
        if self.latest_leader.is_none_or(|(t, _)| term > t) {
            self.latest_leader = Some((term, leader));
        }
        match self.first.get(&index) {
            None => {
                self.first.insert(index, (term, digest, node));
            }
            Some(&(t, d, by)) if (t, d) != (term, digest) && self.divergent.len() < 5 => {
                self.divergent.push(format!(
                    "index {index}: node {node} applied an entry of term {term}, node {by} one of term {t}{}",
                    if t == term { " (different content)" } else { "" }
                ));
            }
            Some(_) => {}
        }
    }

    /// The node that led the highest term any node has applied an entry of:
    /// the leader, as far as the applied log tells.
    pub fn latest_leader(&self) -> Option<u64> {
        self.latest_leader.map(|(_, node)| node)
    }

    /// The divergences found.
    pub fn divergences(&self) -> Vec<String> {
        self.divergent.clone()
    }
}

/// The judgement of one history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// `palisade-chaos`'s counts.
    pub report: Report,
    /// Every invariant broken, in words (empty: the run passed).
    pub violations: Vec<String>,
    /// Grants checked.
    pub grants: usize,
}

/// Judges `h`, whose faults were all healed at `healed_at_us`, and whose
/// clients started nothing new after `end_us`.
pub fn judge(h: &History, healed_at_us: u64, end_us: u64) -> Verdict {
    let report = palisade_chaos::check(h);
    let mut violations = Vec::new();
    if report.overlaps > 0 {
        violations.push(format!(
            "{} pairs of clients both inside their guarantee on one lock",
            report.overlaps
        ));
    }
    if report.stale_writes_accepted > 0 {
        violations.push(format!(
            "{} stale writes accepted by the fenced resource",
            report.stale_writes_accepted
        ));
    }
    if report.lost_updates > 0 {
        violations.push(format!("{} lost updates", report.lost_updates));
    }
    if report.non_monotonic_tokens > 0 {
        violations.push(format!(
            "{} pairs of grants whose tokens go backwards in real time",
            report.non_monotonic_tokens
        ));
    }
    if report.linearizable == Some(false) {
        violations.push("the grants do not fit a fenced mutex".into());
    }

    // Per lock, in the order the clients learnt of their grants: tokens only
    // go up and none is granted twice. (A grant is learnt only after the
    // previous holder's release or expiry, so grant order and learning order
    // agree — unless a grant was acted on too late, which is a violation.)
    let mut last: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    let mut grants = 0;
    for e in &h.events {
        if let EventKind::AcquireOk {
            lock,
            token: Some(token),
            ..
        } = &e.kind
        {
            grants += 1;
            if let Some(&(before, by)) = last.get(lock.as_str())
                && *token <= before
            {
                violations.push(format!(
                    "{lock}: token {token} granted to client {} at {} µs after token {before} \
                     to client {by}",
                    e.client, e.at_us
                ));
            }
            last.insert(lock, (*token, e.client));
        }
    }

    // Liveness: once everything has been healed for RECOVERY_US, every acquire
    // is answered (granted, refused, or timed out in its own wait — never
    // "unavailable"), and the cluster grants locks again.
    let settled = healed_at_us + RECOVERY_US;
    let mut open: BTreeMap<u32, u64> = BTreeMap::new();
    let mut granted_after = 0;
    let mut asked_after = 0;
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke { .. } => {
                open.insert(e.client, e.at_us);
            }
            EventKind::AcquireOk { .. }
            | EventKind::AcquireFail { .. }
            | EventKind::AcquireUnknown { .. } => {
                let asked = open.remove(&e.client).unwrap_or(0);
                if asked >= settled {
                    asked_after += 1;
                    match e.kind {
                        EventKind::AcquireOk { .. } => granted_after += 1,
                        EventKind::AcquireUnknown { ref lock } => violations.push(format!(
                            "client {}: acquire of {lock} at {asked} µs answered unavailable \
                             {} ms after every fault had healed",
                            e.client,
                            (asked - healed_at_us) / 1000
                        )),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    for (client, asked) in open {
        violations.push(format!(
            "client {client}: acquire at {asked} µs never answered"
        ));
    }
    if settled < end_us && asked_after > 0 && granted_after == 0 {
        violations.push(format!(
            "no lock granted after every fault had healed ({asked_after} acquires asked)"
        ));
    }
    Verdict {
        report,
        violations,
        grants,
    }
}
