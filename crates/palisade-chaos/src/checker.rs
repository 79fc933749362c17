//! Counting what went wrong in a history.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{EventKind, History};

/// What one history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Pairs of grants to different clients whose believed-held intervals on one
    /// lock intersect.
    pub overlaps: usize,
    /// Writes the resource accepted that it should not have (see the crate docs).
    pub stale_writes_accepted: usize,
    /// Writes the resource refused.
    pub stale_writes_rejected: usize,
    /// Accepted counter writes whose read missed the previous accepted write.
    pub lost_updates: usize,
    /// Pairs of grants on one lock where the earlier (in real time) has a token
    /// not below the later's.
    pub non_monotonic_tokens: usize,
    /// For token-carrying grants: whether each lock's grants can be ordered
    /// consistently with real time with strictly increasing tokens (unique tokens,
    /// none below a grant that completed before it began). Mutual exclusion is not
    /// part of this model — a lease can end at the server at any time, which is
    /// what fencing is for — and is counted by `overlaps`. `None` without tokens.
    pub linearizable: Option<bool>,
}

struct Grant {
    client: u32,
    lock: String,
    invoked_at: u64,
    ok_at: u64,
    token: Option<u64>,
    /// When the client stopped believing it held the lock (release invoked, lease
    /// reported lost, validity ended); `u64::MAX` if never.
    believed_until: u64,
}

fn grants(h: &History) -> Vec<Grant> {
    let mut out: Vec<Grant> = Vec::new();
    let mut invoked: HashMap<(u32, String), u64> = HashMap::new();
    let mut open: HashMap<(u32, String), usize> = HashMap::new();
    for e in &h.events {
        match &e.kind {
            EventKind::AcquireInvoke { lock } => {
                invoked.insert((e.client, lock.clone()), e.at_us);
            }
            EventKind::AcquireOk {
                lock,
                token,
                valid_until_us,
            } => {
                let key = (e.client, lock.clone());
                open.insert(key.clone(), out.len());
                out.push(Grant {
                    client: e.client,
                    lock: lock.clone(),
                    invoked_at: invoked.get(&key).copied().unwrap_or(e.at_us),
                    ok_at: e.at_us,
                    token: *token,
                    believed_until: valid_until_us.unwrap_or(u64::MAX),
                });
            }
            EventKind::ReleaseInvoke { lock } | EventKind::LeaseLost { lock } => {
                if let Some(i) = open.remove(&(e.client, lock.clone())) {
                    out[i].believed_until = out[i].believed_until.min(e.at_us);
                }
            }
            _ => {}
        }
    }
    out
}

/// Counts everything [`Report`] lists.
pub fn check(h: &History) -> Report {
    let grants = grants(h);
    let mut report = Report::default();

    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.lock == b.lock
                && a.client != b.client
                && a.ok_at < b.believed_until
                && b.ok_at < a.believed_until
            {
                report.overlaps += 1;
            }
        }
    }

    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut counter: HashMap<&str, i64> = HashMap::new();
    for e in &h.events {
        let EventKind::Write {
            lock,
            resource,
            token,
            accepted,
            read,
            wrote,
        } = &e.kind
        else {
            continue;
        };
        if !accepted {
            report.stale_writes_rejected += 1;
            continue;
        }
        let stale = match token {
            Some(t) => {
                let seen = highest.entry(resource).or_insert(0);
                let stale = *t < *seen;
                *seen = (*seen).max(*t);
                stale
            }
            // Unfenced: stale when another client was granted the lock after the
            // writer's own grant and before this write.
            None => {
                let own = grants
                    .iter()
                    .filter(|g| g.client == e.client && &g.lock == lock && g.ok_at <= e.at_us)
                    .map(|g| g.ok_at)
                    .max();
                own.is_some_and(|own| {
                    grants.iter().any(|g| {
                        &g.lock == lock
                            && g.client != e.client
                            && g.ok_at > own
                            && g.ok_at < e.at_us
                    })
                })
            }
        };
        if stale {
            report.stale_writes_accepted += 1;
        }
        let current = counter.entry(resource).or_insert(0);
        if read != current {
            report.lost_updates += 1;
        }
        *current = *wrote;
    }

    let mut by_lock: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants.iter().filter(|g| g.token.is_some()) {
        by_lock.entry(&g.lock).or_default().push(g);
    }
    let mut duplicate_tokens = 0;
    for gs in by_lock.values() {
        for (i, a) in gs.iter().enumerate() {
            for b in &gs[i + 1..] {
                let (ta, tb) = (a.token.unwrap_or(0), b.token.unwrap_or(0));
                if ta == tb {
                    duplicate_tokens += 1;
                } else if (a.ok_at < b.invoked_at && ta > tb) || (b.ok_at < a.invoked_at && tb > ta)
                {
                    report.non_monotonic_tokens += 1;
                }
            }
        }
    }
    report.non_monotonic_tokens += duplicate_tokens;
    if !by_lock.is_empty() {
        report.linearizable = Some(report.non_monotonic_tokens == 0);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Event;

    fn ev(at_us: u64, client: u32, kind: EventKind) -> Event {
        Event {
            at_us,
            client,
            kind,
        }
    }
    fn invoke(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::AcquireInvoke { lock: "L".into() })
    }
    fn ok(at: u64, c: u32, token: Option<u64>) -> Event {
        ev(
            at,
            c,
            EventKind::AcquireOk {
                lock: "L".into(),
                token,
                valid_until_us: None,
            },
        )
    }
    fn release(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::ReleaseInvoke { lock: "L".into() })
    }
    fn lost(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::LeaseLost { lock: "L".into() })
    }
    fn write(at: u64, c: u32, token: Option<u64>, accepted: bool, read: i64) -> Event {
        ev(
            at,
            c,
            EventKind::Write {
                lock: "L".into(),
                resource: "counter".into(),
                token,
                accepted,
                read,
                wrote: read + 1,
            },
        )
    }
    fn history(events: Vec<Event>) -> History {
        History {
            events,
            ..History::default()
        }
    }

    #[test]
    fn a_clean_fenced_history_has_no_violation() {
        let r = check(&history(vec![
            invoke(0, 1),
            ok(10, 1, Some(33)),
            write(20, 1, Some(33), true, 0),
            release(30, 1),
            invoke(31, 2),
            ok(40, 2, Some(34)),
            write(50, 2, Some(34), true, 1),
            release(60, 2),
        ]));
        assert_eq!(
            r,
            Report {
                linearizable: Some(true),
                ..Report::default()
            }
        );
    }

    #[test]
    fn the_essays_pause_is_an_overlap_and_a_rejected_stale_write_when_fenced() {
        // Client 1 pauses holding token 33; client 2 gets 34 and writes; client 1
        // wakes and writes with 33, which the fenced resource refuses.
        let r = check(&history(vec![
            invoke(0, 1),
            ok(10, 1, Some(33)),
            invoke(20, 2),
            ok(1_000, 2, Some(34)),
            write(1_010, 2, Some(34), true, 0),
            write(2_000, 1, Some(33), false, 0),
            lost(2_001, 1),
        ]));
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.stale_writes_rejected, 1);
        assert_eq!(r.stale_writes_accepted, 0);
        assert_eq!(r.lost_updates, 0);
        assert_eq!(r.linearizable, Some(true));
    }

    #[test]
    fn a_fenced_store_accepting_33_after_34_is_a_stale_write() {
        let r = check(&history(vec![
            ok(10, 1, Some(33)),
            ok(20, 2, Some(34)),
            write(30, 2, Some(34), true, 0),
            write(40, 1, Some(33), true, 0),
        ]));
        assert_eq!(r.stale_writes_accepted, 1);
        assert_eq!(r.lost_updates, 1, "33's write read 0 after 34 wrote 1");
    }

    #[test]
    fn an_unfenced_write_by_a_superseded_holder_is_stale() {
        let r = check(&history(vec![
            ok(10, 1, None),
            ok(20, 2, None),
            write(30, 2, None, true, 0),
            write(40, 1, None, true, 0),
        ]));
        assert_eq!(r.stale_writes_accepted, 1);
        assert_eq!(r.lost_updates, 1);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.linearizable, None, "no tokens, no token model");
    }

    #[test]
    fn a_write_that_missed_the_previous_one_is_a_lost_update() {
        let r = check(&history(vec![
            ok(10, 1, Some(5)),
            write(20, 1, Some(5), true, 0),
            release(25, 1),
            ok(30, 2, Some(6)),
            write(40, 2, Some(6), true, 0),
        ]));
        assert_eq!(r.lost_updates, 1);
        assert_eq!(r.stale_writes_accepted, 0);
        assert_eq!(r.overlaps, 0);
    }

    #[test]
    fn tokens_that_go_backwards_in_real_time_are_not_linearizable() {
        let r = check(&history(vec![
            invoke(0, 1),
            ok(10, 1, Some(40)),
            release(15, 1),
            invoke(20, 2),
            ok(30, 2, Some(39)),
        ]));
        assert_eq!(r.non_monotonic_tokens, 1);
        assert_eq!(r.linearizable, Some(false));
        // Concurrent acquires may complete in either order: not a violation.
        let r = check(&history(vec![
            invoke(0, 1),
            invoke(1, 2),
            ok(10, 2, Some(8)),
            release(11, 2),
            ok(12, 1, Some(7)),
        ]));
        assert_eq!(r.non_monotonic_tokens, 0);
    }

    #[test]
    fn a_token_issued_twice_is_not_linearizable() {
        let r = check(&history(vec![
            ok(10, 1, Some(7)),
            release(11, 1),
            ok(20, 2, Some(7)),
        ]));
        assert_eq!(r.linearizable, Some(false));
    }

    #[test]
    fn histories_round_trip_through_json() {
        let h = history(vec![ok(10, 1, Some(7)), write(20, 1, Some(7), true, 0)]);
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back.events, h.events);
    }
}
