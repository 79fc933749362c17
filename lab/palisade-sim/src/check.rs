//! Judging a simulated history: `palisade-chaos`'s checker, plus what only a
//! simulator can see — every grant of the whole run on one clock, and a quiet
//! period after the faults in which every request must be answered.

use std::collections::BTreeMap;

use palisade_chaos::{EventKind, History, Holding, Report};
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
    if report.over_capacity > 0 {
        violations.push(format!(
            "{} permits granted beyond their semaphore's size",
            report.over_capacity
        ));
    }
    if report.stale_reads_accepted > 0 {
        violations.push(format!(
            "{} reads answered under a token a writer had overtaken",
            report.stale_reads_accepted
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

    // Per lock (per slot, for a semaphore's permits), in the order the
    // clients learnt of their grants: an exclusive grant's token is above
    // every token learnt before it, a reader's above every writer's. (A grant
    // is learnt only after the previous exclusive holder's release or expiry,
    // so grant order and learning order agree — unless a grant was acted on
    // too late, which is a violation. Readers may learn theirs in any order.)
    #[derive(Default)]
    struct Seen {
        any: Option<(u64, u32)>,
        exclusive: Option<(u64, u32)>,
    }
    let mut last: BTreeMap<(&str, Option<u32>), Seen> = BTreeMap::new();
    let mut grants = 0;
    for e in &h.events {
        if let EventKind::AcquireOk {
            lock,
            token: Some(token),
            holding,
            ..
        } = &e.kind
        {
            grants += 1;
            let seen = last.entry((lock.as_str(), holding.slot())).or_default();
            let shared = *holding == Holding::Read;
            let above = if shared { seen.exclusive } else { seen.any };
            if let Some((before, by)) = above
                && *token <= before
            {
                violations.push(format!(
                    "{lock}: token {token} granted to client {} at {} µs after token {before} \
                     to client {by}",
                    e.client, e.at_us
                ));
            }
            if seen.any.is_none_or(|(t, _)| *token > t) {
                seen.any = Some((*token, e.client));
            }
            if !shared {
                seen.exclusive = Some((*token, e.client));
            }
        }
    }

    // Liveness: once everything has been healed for RECOVERY_US, every acquire
    // is answered (granted, refused, or timed out in its own wait — never
    // "unavailable"), and the cluster grants locks again: some acquire asked
    // after that point is granted, unless every one of them timed out while
    // another client held its lock (a holder may legitimately keep a lock
    // through the whole quiet period, e.g. paused with its session alive).
    let settled = healed_at_us + RECOVERY_US;
    let held = holdings(h);
    let held_by_other = |lock: &str, client: u32, at: u64| {
        held.get(lock).is_some_and(|spans| {
            spans
                .iter()
                .any(|&(by, from, to)| by != client && from <= at && at <= to)
        })
    };
    let mut open: BTreeMap<u32, u64> = BTreeMap::new();
    let mut granted_after = 0;
    let mut asked_after = 0;
    let mut excused = 0;
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
                        EventKind::AcquireFail { ref lock }
                            if held_by_other(lock, e.client, e.at_us) =>
                        {
                            excused += 1;
                        }
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
    if settled < end_us && asked_after > excused && granted_after == 0 {
        violations.push(format!(
            "no lock granted after every fault had healed ({asked_after} acquires asked, \
             {excused} of them while another client held the lock)"
        ));
    }
    Verdict {
        report,
        violations,
        grants,
    }
}

/// Per lock, who held it when, as far as the clients knew: `(client, from, to)`
/// in µs, from the grant to its confirmed release or its loss. A release that
/// was never confirmed left the lock held until the server expired the
/// abandoned session: counted up to the client's next acquire plus two session
/// TTLs (the lease runs a TTL past the session's last keep-alive, and the
/// expiry must then commit), or to the end if it asked nothing more.
fn holdings(h: &History) -> BTreeMap<&str, Vec<(u32, u64, u64)>> {
    let ttl = crate::workload::SESSION_TTL.as_micros() as u64;
    let mut held: BTreeMap<&str, Vec<(u32, u64, u64)>> = BTreeMap::new();
    // Per client: the lock it holds (or last released unconfirmed) and the
    // index of its span.
    let mut holding: BTreeMap<u32, (&str, usize, bool)> = BTreeMap::new();
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireOk { lock, .. } => {
                let spans = held.entry(lock.as_str()).or_default();
                spans.push((e.client, e.at_us, u64::MAX));
                holding.insert(e.client, (lock.as_str(), spans.len() - 1, false));
            }
            EventKind::ReleaseInvoke { .. } => {
                if let Some(h) = holding.get_mut(&e.client) {
                    h.2 = true;
                }
            }
            EventKind::ReleaseOk { .. } | EventKind::LeaseLost { .. } => {
                if let Some((lock, i, _)) = holding.remove(&e.client) {
                    held.get_mut(lock).expect("recorded")[i].2 = e.at_us;
                }
            }
            EventKind::AcquireInvoke { .. } => {
                if let Some(&(lock, i, true)) = holding.get(&e.client) {
                    held.get_mut(lock).expect("recorded")[i].2 = e.at_us + 2 * ttl;
                    holding.remove(&e.client);
                }
            }
            _ => {}
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use palisade_chaos::Event;

    use super::*;

    fn ev(at_s: f64, client: u32, kind: EventKind) -> Event {
        Event {
            at_us: (at_s * 1e6) as u64,
            client,
            kind,
        }
    }

    fn lock() -> String {
        "lock-1".into()
    }

    /// Client 2 asks for lock-1 twice after the faults settled (healed at 0 s,
    /// settled at 6 s) and times out both times; client 1 holds it from
    /// 5 s until `released_at` (if it ever does).
    fn history(released_at: Option<f64>) -> History {
        let mut events = vec![
            ev(1.0, 1, EventKind::AcquireInvoke { lock: lock() }),
            ev(
                5.0,
                1,
                EventKind::AcquireOk {
                    lock: lock(),
                    token: Some(1),
                    valid_until_us: Some(7_000_000),
                    holding: Holding::Lock,
                },
            ),
            ev(6.5, 2, EventKind::AcquireInvoke { lock: lock() }),
            ev(7.5, 2, EventKind::AcquireFail { lock: lock() }),
            ev(7.6, 2, EventKind::AcquireInvoke { lock: lock() }),
            ev(9.0, 2, EventKind::AcquireFail { lock: lock() }),
        ];
        if let Some(at) = released_at {
            events.push(ev(at - 0.1, 1, EventKind::ReleaseInvoke { lock: lock() }));
            events.push(ev(at, 1, EventKind::ReleaseOk { lock: lock() }));
        }
        events.sort_by_key(|e| e.at_us);
        History {
            events,
            ..History::default()
        }
    }

    fn liveness(h: &History) -> Vec<String> {
        judge(h, 0, 10_000_000)
            .violations
            .into_iter()
            .filter(|v| v.starts_with("no lock granted"))
            .collect()
    }

    #[test]
    fn an_acquire_timed_out_behind_a_live_holder_is_excused() {
        assert_eq!(liveness(&history(None)), Vec::<String>::new());
        assert_eq!(liveness(&history(Some(9.5))), Vec::<String>::new());
    }

    #[test]
    fn an_acquire_timed_out_on_a_free_lock_is_not() {
        // Released at 8 s: the second acquire (7.6 s – 9 s) ended with the
        // lock free and was not granted.
        let found = liveness(&history(Some(8.0)));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("2 acquires asked, 1 of them"),
            "{found:?}"
        );
    }
}
