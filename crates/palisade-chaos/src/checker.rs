//! Counting what went wrong in a history.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{EventKind, History, Holding};

/// What one history shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Pairs of grants to different clients whose believed-held intervals on one
    /// lock intersect, unless both are reads or permits in different slots.
    pub overlaps: usize,
    /// Permits granted beyond their semaphore's size: a slot outside it, or
    /// more permits believed held at once than it has.
    pub over_capacity: usize,
    /// Writes the resource accepted that it should not have (see the crate docs).
    pub stale_writes_accepted: usize,
    /// Writes the resource refused.
    pub stale_writes_rejected: usize,
    /// Token-checked reads the resource answered although a write with a
    /// higher token had been accepted before them.
    pub stale_reads_accepted: usize,
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

/// Which events make up each violation [`Report`] counts, by position in
/// [`History::events`]; [`check`] is [`Violations::report`] of this, so the two
/// always agree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Violations {
    /// Pairs of `AcquireOk` events (earlier-recorded first) whose believed-held
    /// intervals overlap; one per counted overlap.
    pub overlapping_grants: Vec<(usize, usize)>,
    /// Permit `AcquireOk` events beyond their semaphore's size.
    pub over_capacity: Vec<usize>,
    /// Accepted `Write` events that were stale.
    pub stale_accepted: Vec<usize>,
    /// Refused `Write` events.
    pub stale_rejected: Vec<usize>,
    /// Answered `Read` events that were stale.
    pub stale_reads: Vec<usize>,
    /// Accepted `Write` events whose read missed the previous accepted write.
    pub lost_updates: Vec<usize>,
    /// Pairs of `AcquireOk` events on one lock whose tokens are duplicated or go
    /// backwards in real time. Pairs rather than single grants because the
    /// report counts pairs.
    pub non_monotonic: Vec<(usize, usize)>,
    /// As [`Report::linearizable`].
    pub linearizable: Option<bool>,
}

impl Violations {
    /// The counts of these violations.
    pub fn report(&self) -> Report {
        Report {
            overlaps: self.overlapping_grants.len(),
            over_capacity: self.over_capacity.len(),
            stale_writes_accepted: self.stale_accepted.len(),
            stale_writes_rejected: self.stale_rejected.len(),
            stale_reads_accepted: self.stale_reads.len(),
            lost_updates: self.lost_updates.len(),
            non_monotonic_tokens: self.non_monotonic.len(),
            linearizable: self.linearizable,
        }
    }
}

/// One granted acquire, as the checker and the timeline see it.
pub(crate) struct Grant {
    /// Position of the `AcquireOk` in [`History::events`].
    pub(crate) event: usize,
    pub(crate) client: u32,
    pub(crate) lock: String,
    pub(crate) invoked_at: u64,
    pub(crate) ok_at: u64,
    pub(crate) token: Option<u64>,
    /// What it holds.
    pub(crate) holding: Holding,
    /// When the client stopped believing it held the lock (release invoked, lease
    /// reported lost, validity ended); `u64::MAX` if never.
    pub(crate) believed_until: u64,
}

/// The grants of `h`, in recorded order.
pub(crate) fn grants(h: &History) -> Vec<Grant> {
    let mut out: Vec<Grant> = Vec::new();
    let mut invoked: HashMap<(u32, String), u64> = HashMap::new();
    let mut open: HashMap<(u32, String), usize> = HashMap::new();
    for (index, e) in h.events.iter().enumerate() {
        match &e.kind {
            EventKind::AcquireInvoke { lock } => {
                invoked.insert((e.client, lock.clone()), e.at_us);
            }
            EventKind::AcquireOk {
                lock,
                token,
                valid_until_us,
                holding,
            } => {
                let key = (e.client, lock.clone());
                open.insert(key.clone(), out.len());
                out.push(Grant {
                    event: index,
                    client: e.client,
                    lock: lock.clone(),
                    invoked_at: invoked.get(&key).copied().unwrap_or(e.at_us),
                    ok_at: e.at_us,
                    token: *token,
                    holding: *holding,
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
    violations(h).report()
}

/// Finds everything [`Report`] counts, as the events involved.
pub fn violations(h: &History) -> Violations {
    let grants = grants(h);
    let mut found = Violations {
        overlapping_grants: overlapping(&grants),
        over_capacity: over_capacity(&grants),
        ..Violations::default()
    };
    judge_resources(h, &grants, &mut found);
    let (non_monotonic, linearizable) = token_order(&grants);
    found.non_monotonic = non_monotonic;
    found.linearizable = linearizable;
    found
}

/// Pairs of grants of one lock to different clients, incompatible, whose
/// believed-held intervals overlap.
fn overlapping(grants: &[Grant]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.lock == b.lock
                && a.client != b.client
                && !a.holding.compatible(b.holding)
                && a.ok_at < b.believed_until
                && b.ok_at < a.believed_until
            {
                found.push((a.event, b.event));
            }
        }
    }
    found
}

/// What the resources saw: stale writes accepted and refused, stale reads,
/// lost updates.
fn judge_resources(h: &History, grants: &[Grant], found: &mut Violations) {
    // Per resource: the highest token of an accepted write, and of an
    // answered read. A read is stale below the first; a write below either
    // (a writer's token is above every reader's before it).
    let mut highest: HashMap<&str, u64> = HashMap::new();
    let mut read_mark: HashMap<&str, u64> = HashMap::new();
    let mut counter: HashMap<&str, i64> = HashMap::new();
    for (index, e) in h.events.iter().enumerate() {
        if let EventKind::Read {
            resource,
            token: Some(t),
            accepted: true,
            ..
        } = &e.kind
        {
            if highest.get(resource.as_str()).is_some_and(|seen| t < seen) {
                found.stale_reads.push(index);
            }
            let mark = read_mark.entry(resource).or_insert(0);
            *mark = (*mark).max(*t);
        }
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
            found.stale_rejected.push(index);
            continue;
        }
        let stale = match token {
            Some(t) => {
                let read = read_mark.get(resource.as_str()).copied().unwrap_or(0);
                let seen = highest.entry(resource).or_insert(0);
                let stale = *t < (*seen).max(read);
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
            found.stale_accepted.push(index);
        }
        let current = counter.entry(resource).or_insert(0);
        if read != current {
            found.lost_updates.push(index);
        }
        *current = *wrote;
    }
}

/// Pairs of grants whose tokens are duplicated or go backwards in real time,
/// and whether the tokens are linearizable (`None` when no grant had one).
fn token_order(grants: &[Grant]) -> (Vec<(usize, usize)>, Option<bool>) {
    let mut non_monotonic = Vec::new();
    let mut by_lock: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants.iter().filter(|g| g.token.is_some()) {
        by_lock.entry(&g.lock).or_default().push(g);
    }
    for gs in by_lock.values() {
        for (i, a) in gs.iter().enumerate() {
            for b in &gs[i + 1..] {
                // Grants that may be held together need not be ordered: one
                // entry lets readers in at once (and permits in different
                // slots), and a grant retried by its holder comes back with
                // its old token while the others went on. The tokens of each
                // slot, and of writers among readers, are what a fenced
                // resource relies on.
                if a.holding.compatible(b.holding) {
                    continue;
                }
                let (ta, tb) = (a.token.unwrap_or(0), b.token.unwrap_or(0));
                // A token issued twice breaks the model whatever the timing.
                let duplicate = ta == tb;
                let backwards =
                    (a.ok_at < b.invoked_at && ta > tb) || (b.ok_at < a.invoked_at && tb > ta);
                if duplicate || backwards {
                    non_monotonic.push((a.event, b.event));
                }
            }
        }
    }
    let linearizable = (!by_lock.is_empty()).then_some(non_monotonic.is_empty());
    (non_monotonic, linearizable)
}

/// The permits granted beyond their semaphore's size: in a slot outside it,
/// or while as many other clients' permits as it has were believed held.
fn over_capacity(grants: &[Grant]) -> Vec<usize> {
    let mut found = Vec::new();
    for g in grants {
        let Holding::Permit { slot, of } = g.holding else {
            continue;
        };
        let beside = grants
            .iter()
            .filter(|o| {
                o.lock == g.lock
                    && o.client != g.client
                    && matches!(o.holding, Holding::Permit { .. })
                    && o.ok_at <= g.ok_at
                    && g.ok_at < o.believed_until
            })
            .count();
        if slot >= of || beside >= of as usize {
            found.push(g.event);
        }
    }
    found
}

/// Event builders and the hand-written histories the checker is tested on,
/// shared with the summary and timeline tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::history::{Event, EventKind, History, Holding};

    pub(crate) fn ev(at_us: u64, client: u32, kind: EventKind) -> Event {
        Event {
            at_us,
            client,
            kind,
        }
    }
    pub(crate) fn invoke(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::AcquireInvoke { lock: "L".into() })
    }
    pub(crate) fn ok(at: u64, c: u32, token: Option<u64>) -> Event {
        ev(
            at,
            c,
            EventKind::AcquireOk {
                lock: "L".into(),
                token,
                valid_until_us: None,
                holding: Holding::Lock,
            },
        )
    }
    pub(crate) fn fail(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::AcquireFail { lock: "L".into() })
    }
    pub(crate) fn release(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::ReleaseInvoke { lock: "L".into() })
    }
    pub(crate) fn lost(at: u64, c: u32) -> Event {
        ev(at, c, EventKind::LeaseLost { lock: "L".into() })
    }
    pub(crate) fn fault(at: u64, what: &str) -> Event {
        ev(at, 0, EventKind::Fault { what: what.into() })
    }
    pub(crate) fn write(at: u64, c: u32, token: Option<u64>, accepted: bool, read: i64) -> Event {
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
    pub(crate) fn history(events: Vec<Event>) -> History {
        History {
            events,
            ..History::default()
        }
    }

    pub(crate) fn clean_fenced() -> History {
        history(vec![
            invoke(0, 1),
            ok(10, 1, Some(33)),
            write(20, 1, Some(33), true, 0),
            release(30, 1),
            invoke(31, 2),
            ok(40, 2, Some(34)),
            write(50, 2, Some(34), true, 1),
            release(60, 2),
        ])
    }

    /// Client 1 pauses holding token 33; client 2 gets 34 and writes; client 1
    /// wakes and writes with 33, which the fenced resource refuses.
    pub(crate) fn essays_pause_fenced() -> History {
        history(vec![
            invoke(0, 1),
            ok(10, 1, Some(33)),
            invoke(20, 2),
            ok(1_000, 2, Some(34)),
            write(1_010, 2, Some(34), true, 0),
            write(2_000, 1, Some(33), false, 0),
            lost(2_001, 1),
        ])
    }

    pub(crate) fn fenced_store_accepting_33_after_34() -> History {
        history(vec![
            ok(10, 1, Some(33)),
            ok(20, 2, Some(34)),
            write(30, 2, Some(34), true, 0),
            write(40, 1, Some(33), true, 0),
        ])
    }

    pub(crate) fn unfenced_superseded_writer() -> History {
        history(vec![
            ok(10, 1, None),
            ok(20, 2, None),
            write(30, 2, None, true, 0),
            write(40, 1, None, true, 0),
        ])
    }

    pub(crate) fn write_missing_the_previous_one() -> History {
        history(vec![
            ok(10, 1, Some(5)),
            write(20, 1, Some(5), true, 0),
            release(25, 1),
            ok(30, 2, Some(6)),
            write(40, 2, Some(6), true, 0),
        ])
    }

    pub(crate) fn tokens_backwards_in_real_time() -> History {
        history(vec![
            invoke(0, 1),
            ok(10, 1, Some(40)),
            release(15, 1),
            invoke(20, 2),
            ok(30, 2, Some(39)),
        ])
    }

    /// Concurrent acquires may complete in either order: not a violation.
    pub(crate) fn concurrent_acquires_out_of_order() -> History {
        history(vec![
            invoke(0, 1),
            invoke(1, 2),
            ok(10, 2, Some(8)),
            release(11, 2),
            ok(12, 1, Some(7)),
        ])
    }

    pub(crate) fn token_issued_twice() -> History {
        history(vec![ok(10, 1, Some(7)), release(11, 1), ok(20, 2, Some(7))])
    }

    /// Every history above, for properties that must hold on all of them.
    pub(crate) fn all() -> Vec<History> {
        vec![
            clean_fenced(),
            essays_pause_fenced(),
            fenced_store_accepting_33_after_34(),
            unfenced_superseded_writer(),
            write_missing_the_previous_one(),
            tokens_backwards_in_real_time(),
            concurrent_acquires_out_of_order(),
            token_issued_twice(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::history::Event;

    #[test]
    fn a_clean_fenced_history_has_no_violation() {
        let r = check(&clean_fenced());
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
        let r = check(&essays_pause_fenced());
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.stale_writes_rejected, 1);
        assert_eq!(r.stale_writes_accepted, 0);
        assert_eq!(r.lost_updates, 0);
        assert_eq!(r.linearizable, Some(true));
    }

    #[test]
    fn a_fenced_store_accepting_33_after_34_is_a_stale_write() {
        let r = check(&fenced_store_accepting_33_after_34());
        assert_eq!(r.stale_writes_accepted, 1);
        assert_eq!(r.lost_updates, 1, "33's write read 0 after 34 wrote 1");
    }

    #[test]
    fn an_unfenced_write_by_a_superseded_holder_is_stale() {
        let r = check(&unfenced_superseded_writer());
        assert_eq!(r.stale_writes_accepted, 1);
        assert_eq!(r.lost_updates, 1);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.linearizable, None, "no tokens, no token model");
    }

    #[test]
    fn a_write_that_missed_the_previous_one_is_a_lost_update() {
        let r = check(&write_missing_the_previous_one());
        assert_eq!(r.lost_updates, 1);
        assert_eq!(r.stale_writes_accepted, 0);
        assert_eq!(r.overlaps, 0);
    }

    #[test]
    fn tokens_that_go_backwards_in_real_time_are_not_linearizable() {
        let r = check(&tokens_backwards_in_real_time());
        assert_eq!(r.non_monotonic_tokens, 1);
        assert_eq!(r.linearizable, Some(false));
        let r = check(&concurrent_acquires_out_of_order());
        assert_eq!(r.non_monotonic_tokens, 0);
    }

    #[test]
    fn a_token_issued_twice_is_not_linearizable() {
        let r = check(&token_issued_twice());
        assert_eq!(r.linearizable, Some(false));
    }

    #[test]
    fn violations_count_what_check_reports_on_every_history() {
        for h in all() {
            let v = violations(&h);
            let r = check(&h);
            // Lengths taken field by field, not through `Violations::report`, so a
            // mismatch between the listing and the counting would show.
            assert_eq!(v.overlapping_grants.len(), r.overlaps, "{h:?}");
            assert_eq!(v.stale_accepted.len(), r.stale_writes_accepted, "{h:?}");
            assert_eq!(v.stale_rejected.len(), r.stale_writes_rejected, "{h:?}");
            assert_eq!(v.lost_updates.len(), r.lost_updates, "{h:?}");
            assert_eq!(v.non_monotonic.len(), r.non_monotonic_tokens, "{h:?}");
            assert_eq!(v.linearizable, r.linearizable, "{h:?}");
        }
    }

    #[test]
    fn violations_name_the_events_involved() {
        let v = violations(&essays_pause_fenced());
        assert_eq!(v.overlapping_grants, vec![(1, 3)]);
        assert_eq!(v.stale_rejected, vec![5]);
        assert!(v.stale_accepted.is_empty() && v.lost_updates.is_empty());

        let v = violations(&fenced_store_accepting_33_after_34());
        assert_eq!(v.stale_accepted, vec![3]);
        assert_eq!(v.lost_updates, vec![3]);
        assert_eq!(v.overlapping_grants, vec![(0, 1)]);

        assert_eq!(
            violations(&tokens_backwards_in_real_time()).non_monotonic,
            vec![(1, 4)]
        );
        assert_eq!(
            violations(&token_issued_twice()).non_monotonic,
            vec![(0, 2)]
        );
    }

    #[test]
    fn histories_round_trip_through_json() {
        let h = history(vec![ok(10, 1, Some(7)), write(20, 1, Some(7), true, 0)]);
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back.events, h.events);
    }

    fn claim(at: u64, c: u32, token: u64, holding: Holding) -> Event {
        ev(
            at,
            c,
            EventKind::AcquireOk {
                lock: "L".into(),
                token: Some(token),
                valid_until_us: None,
                holding,
            },
        )
    }

    fn read(at: u64, c: u32, token: u64, accepted: bool) -> Event {
        ev(
            at,
            c,
            EventKind::Read {
                lock: "L".into(),
                resource: "counter".into(),
                token: Some(token),
                accepted,
            },
        )
    }

    fn permit(slot: u32) -> Holding {
        Holding::Permit { slot, of: 2 }
    }

    #[test]
    fn readers_together_and_permits_in_different_slots_are_no_overlap_even_with_one_token() {
        let r = check(&history(vec![
            claim(10, 1, 5, Holding::Read),
            claim(11, 2, 5, Holding::Read),
            claim(12, 3, 7, Holding::Read),
            // A reader's retry answered with the grant it already had.
            invoke(13, 4),
            claim(14, 4, 3, Holding::Read),
            release(20, 1),
            release(20, 2),
            release(20, 3),
            release(20, 4),
            claim(30, 1, 9, permit(0)),
            claim(31, 2, 9, permit(1)),
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
    fn a_writer_beside_a_reader_two_leaders_and_one_slot_twice_are_overlaps() {
        let cases = [
            (Holding::Read, Holding::Write),
            (Holding::Write, Holding::Write),
            (Holding::Lead, Holding::Lead),
            (permit(1), permit(1)),
        ];
        for (a, b) in cases {
            let r = check(&history(vec![claim(10, 1, 5, a), claim(11, 2, 7, b)]));
            assert_eq!(r.overlaps, 1, "{a:?} beside {b:?}");
            // The same token twice is a duplicate for these, not for readers.
            let r = check(&history(vec![claim(10, 1, 5, a), claim(11, 2, 5, b)]));
            assert_eq!(r.non_monotonic_tokens, 1, "{a:?} and {b:?} sharing a token");
        }
    }

    #[test]
    fn a_permit_beyond_the_semaphore_is_over_capacity() {
        let third = check(&history(vec![
            claim(10, 1, 5, permit(0)),
            claim(11, 2, 7, permit(1)),
            claim(12, 3, 9, Holding::Permit { slot: 2, of: 2 }),
        ]));
        assert_eq!(third.over_capacity, 1);
        assert_eq!(third.overlaps, 0);
        // In a slot inside the semaphore, but with two others held.
        let crowded = check(&history(vec![
            claim(10, 1, 5, permit(0)),
            claim(11, 2, 7, permit(1)),
            claim(12, 3, 9, permit(0)),
        ]));
        assert_eq!(crowded.over_capacity, 1);
        // After one of them let go, the third fits.
        let after = check(&history(vec![
            claim(10, 1, 5, permit(0)),
            claim(11, 2, 7, permit(1)),
            release(12, 1),
            claim(13, 3, 9, permit(0)),
        ]));
        assert_eq!(after.over_capacity, 0);
        assert_eq!(after.overlaps, 0);
    }

    #[test]
    fn a_read_answered_under_a_token_below_an_accepted_write_is_stale() {
        let h = history(vec![
            claim(10, 1, 5, Holding::Read),
            claim(20, 2, 7, Holding::Write),
            write(21, 2, Some(7), true, 0),
            read(22, 1, 5, true),
            read(23, 1, 5, false),
            read(24, 3, 9, true),
            // A write under 8 after the read under 9: the reader's data
            // changed under it.
            write(25, 4, Some(8), true, 1),
        ]);
        let r = check(&h);
        assert_eq!(r.stale_reads_accepted, 1);
        assert_eq!(r.stale_writes_accepted, 1);
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back.events, h.events);
    }
}
