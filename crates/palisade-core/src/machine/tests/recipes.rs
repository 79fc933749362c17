//! The recipes beyond the mutex: semaphore, read/write lock, election.

use super::*;

fn granted(applied: &Applied) -> (FencingToken, u32) {
    match applied.outcome {
        Ok(Reply::Acquired { token, slot, .. }) => (token, slot),
        ref other => panic!("not granted: {other:?}"),
    }
}

fn queued(applied: &Applied) -> usize {
    match applied.outcome {
        Ok(Reply::Queued { position }) => position,
        ref other => panic!("not queued: {other:?}"),
    }
}

fn holders_of(h: &Harness, name: &str) -> Vec<SessionId> {
    h.m.get(name)
        .map(|v| v.holders.iter().map(|x| x.session).collect())
        .unwrap_or_default()
}

const PERMITS3: Claim = Claim::Permit { permits: 3 };

#[test]
fn a_semaphore_grants_at_most_its_permits_each_in_a_slot_of_its_own() {
    let mut h = Harness::new();
    let s: Vec<SessionId> = (0..5).map(|_| h.session()).collect();
    let mut tokens = Vec::new();
    for (i, who) in s[..3].iter().enumerate() {
        let (token, slot) = granted(&h.apply(claim(*who, "pool", PERMITS3, true)));
        assert_eq!(slot, i as u32);
        tokens.push(token);
    }
    assert_eq!(queued(&h.apply(claim(s[3], "pool", PERMITS3, true))), 1);
    assert_eq!(queued(&h.apply(claim(s[4], "pool", PERMITS3, true))), 2);
    assert_eq!(holders_of(&h, "pool"), s[..3]);
    // Not waiting: would block, and says the newest grant.
    let t = h.session();
    assert_eq!(
        h.unchanged(claim(t, "pool", PERMITS3, false)).outcome,
        Ok(Reply::WouldBlock {
            holder_token: Some(tokens[2])
        })
    );
    // The holder of slot 1 leaves: its slot goes to the first waiter, with a
    // token above every earlier grant of that slot.
    let freed = h.apply(release(s[1], "pool", tokens[1]));
    assert_eq!(
        freed.grants,
        vec![Grant {
            name: "pool".into(),
            session: s[3],
            token: tok(freed.index),
            slot: 1,
        }]
    );
    assert!(tok(freed.index) > tokens[2]);
    assert_eq!(holders_of(&h, "pool"), vec![s[0], s[2], s[3]]);
    // A retry by a holder gets its own grant back, slot and all.
    assert_eq!(
        h.unchanged(claim(s[3], "pool", PERMITS3, true)).outcome,
        Ok(Reply::Acquired {
            token: tok(freed.index),
            reacquired: true,
            slot: 1
        })
    );
    // Everyone leaves: the name is forgotten.
    for who in [s[0], s[2], s[3], s[4]] {
        h.apply(Command::CloseSession { session: who });
    }
    assert_eq!(h.m.get("pool"), None);
}

#[test]
fn a_claim_that_does_not_fit_the_name_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    h.apply(claim(a, "pool", PERMITS3, true));
    h.apply(acquire(a, "m", false, 0));
    let semaphore3 = Shape::Semaphore { permits: 3 };
    assert_eq!(
        h.refused(claim(b, "pool", Claim::Permit { permits: 5 }, true)),
        MachineError::ShapeMismatch {
            name: "pool".into(),
            held_as: semaphore3,
            asked: Shape::Semaphore { permits: 5 }
        }
    );
    assert_eq!(
        h.refused(acquire(b, "pool", true, 0)),
        MachineError::ShapeMismatch {
            name: "pool".into(),
            held_as: semaphore3,
            asked: Shape::Mutex
        }
    );
    assert_eq!(
        h.refused(claim(b, "m", Claim::Read, true)),
        MachineError::ShapeMismatch {
            name: "m".into(),
            held_as: Shape::Mutex,
            asked: Shape::ReadWrite
        }
    );
    assert!(matches!(
        h.refused(claim(b, "z", Claim::Permit { permits: 0 }, true)),
        MachineError::BadPermits { permits: 0, .. }
    ));
    assert!(matches!(
        h.refused(claim(b, "z", Claim::Permit { permits: 10_001 }, true)),
        MachineError::BadPermits { .. }
    ));
    let delayed_reader = Command::Claim {
        session: b,
        name: "z".into(),
        claim: Claim::Read,
        wait: true,
        lock_delay_ms: 100,
    };
    assert!(matches!(
        h.refused(delayed_reader),
        MachineError::LockDelayNeedsExclusive { .. }
    ));
    let huge = "v".repeat(claim::MAX_VALUE_LEN + 1);
    assert!(matches!(
        h.refused(claim(b, "e", Claim::Lead { value: huge }, true)),
        MachineError::ValueTooLong { .. }
    ));
    // The stateless checks the leader runs before proposing say the same.
    let bad = claim(b, "z", Claim::Permit { permits: 0 }, true);
    assert!(matches!(
        bad.check_input(),
        Err(MachineError::BadPermits { .. })
    ));
}

#[test]
fn readers_share_a_writer_is_alone_and_its_token_is_above_every_reader() {
    let mut h = Harness::new();
    let (r1, r2, w, r3) = (h.session(), h.session(), h.session(), h.session());
    let (t1, _) = granted(&h.apply(claim(r1, "doc", Claim::Read, true)));
    let (t2, _) = granted(&h.apply(claim(r2, "doc", Claim::Read, true)));
    assert_eq!(holders_of(&h, "doc"), vec![r1, r2]);
    assert_eq!(queued(&h.apply(claim(w, "doc", Claim::Write, true))), 1);
    // FIFO: a reader behind a waiting writer waits, though it would fit.
    assert_eq!(queued(&h.apply(claim(r3, "doc", Claim::Read, true))), 2);
    h.apply(release(r1, "doc", t1));
    assert_eq!(holders_of(&h, "doc"), vec![r2]);
    let last = h.apply(release(r2, "doc", t2));
    let (writer, token) = (last.grants[0].session, last.grants[0].token);
    assert_eq!((writer, last.grants.len()), (w, 1));
    assert!(token > t1 && token > t2);
    assert_eq!(holders_of(&h, "doc"), vec![w]);
    // A reader asking to write, or the writer to read, is told there is no
    // upgrade in place.
    assert_eq!(
        h.refused(claim(w, "doc", Claim::Read, true)),
        MachineError::HeldInOtherMode {
            name: "doc".into(),
            mode: Mode::Exclusive
        }
    );
    // The writer leaves; every reader queued behind it is granted by that one
    // entry, with one token.
    let r4 = h.session();
    h.apply(claim(r4, "doc", Claim::Read, true));
    let done = h.apply(release(w, "doc", token));
    let readers: Vec<SessionId> = done.grants.iter().map(|g| g.session).collect();
    assert_eq!(readers, vec![r3, r4]);
    assert!(done.grants.iter().all(|g| g.token == tok(done.index)));
}

#[test]
fn a_writer_that_gives_up_lets_the_readers_behind_it_in() {
    let mut h = Harness::new();
    let (r1, w, r2) = (h.session(), h.session(), h.session());
    h.apply(claim(r1, "doc", Claim::Read, true));
    h.apply(claim(w, "doc", Claim::Write, true));
    h.apply(claim(r2, "doc", Claim::Read, true));
    let cancel = h.apply(cancel(w, "doc"));
    assert_eq!(cancel.outcome, Ok(Reply::WaitCancelled));
    assert_eq!(
        cancel.grants.iter().map(|g| g.session).collect::<Vec<_>>(),
        vec![r2]
    );
    assert_eq!(holders_of(&h, "doc"), vec![r1, r2]);
    // So does a writer whose session ends while it waits.
    let (w2, r3) = (h.session(), h.session());
    h.apply(claim(w2, "doc", Claim::Write, true));
    h.apply(claim(r3, "doc", Claim::Read, true));
    let gone = h.apply(Command::ExpireSession { session: w2 });
    assert_eq!(
        gone.grants.iter().map(|g| g.session).collect::<Vec<_>>(),
        vec![r3]
    );
}

#[test]
fn a_writer_that_expires_keeps_readers_out_for_its_lock_delay() {
    let mut h = Harness::new();
    let (w, r) = (h.session(), h.session());
    h.apply(Command::Claim {
        session: w,
        name: "doc".into(),
        claim: Claim::Write,
        wait: true,
        lock_delay_ms: 500,
    });
    h.apply(claim(r, "doc", Claim::Read, true));
    let gone = h.apply(Command::ExpireSession { session: w });
    assert!(gone.grants.is_empty());
    assert!(h.m.get("doc").unwrap().in_lock_delay);
    let end = h.apply(end_delay("doc"));
    assert_eq!(end.grants[0].session, r);
    // A reader's grant carries no lock-delay of its own.
    assert_eq!(h.m.get("doc").unwrap().lock_delay_ms, 0);
}

#[test]
fn an_election_has_one_leader_whose_value_only_it_may_change() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let lead = |v: &str| Claim::Lead { value: v.into() };
    let (ta, _) = granted(&h.apply(claim(a, "primary", lead("10.0.0.1:5432"), true)));
    assert_eq!(
        queued(&h.apply(claim(b, "primary", lead("10.0.0.2:5432"), true))),
        1
    );
    let leader = |h: &Harness| {
        let v = h.m.get("primary").unwrap();
        let x = &v.holders[0];
        (v.holders.len(), x.session, x.token, x.value.clone())
    };
    assert_eq!(leader(&h), (1, a, ta, "10.0.0.1:5432".into()));
    let proclaim = |who, token, value: &str| Command::Proclaim {
        session: who,
        name: "primary".into(),
        token,
        value: value.into(),
    };
    assert_eq!(
        h.apply(proclaim(a, ta, "10.0.0.1:6432")).outcome,
        Ok(Reply::Proclaimed)
    );
    assert_eq!(leader(&h).3, "10.0.0.1:6432");
    assert_eq!(
        h.refused(proclaim(b, ta, "me")),
        MachineError::NotHolder {
            name: "primary".into()
        }
    );
    // The leader's lease runs out: the candidate leads, with its own value and
    // a larger token; the old leader's token proclaims nothing any more.
    let gone = h.apply(Command::ExpireSession { session: a });
    let tb = gone.grants[0].token;
    assert!(tb > ta);
    assert_eq!(leader(&h), (1, b, tb, "10.0.0.2:5432".into()));
    assert!(matches!(
        h.refused(proclaim(b, ta, "x")),
        MachineError::StaleToken { .. }
    ));
    // A plain lock proclaims nothing.
    h.apply(acquire(b, "m", false, 0));
    let tm = h.m.get("m").unwrap().token.unwrap();
    assert!(matches!(
        h.refused(Command::Proclaim {
            session: b,
            name: "m".into(),
            token: tm,
            value: "x".into()
        }),
        MachineError::ShapeMismatch { .. }
    ));
}

#[test]
fn recipes_survive_a_snapshot_and_go_on_identically() {
    let mut h = Harness::new();
    let s: Vec<SessionId> = (0..6).map(|_| h.session()).collect();
    h.apply(claim(s[0], "pool", PERMITS3, true));
    h.apply(claim(s[1], "pool", PERMITS3, true));
    h.apply(claim(s[2], "doc", Claim::Read, true));
    h.apply(claim(s[3], "doc", Claim::Write, true));
    h.apply(claim(s[4], "doc", Claim::Read, true));
    h.apply(claim(
        s[5],
        "primary",
        Claim::Lead { value: "x".into() },
        true,
    ));
    h.apply(claim(
        s[0],
        "primary",
        Claim::Lead { value: "y".into() },
        true,
    ));
    let bytes = h.m.to_snapshot_bytes();
    let mut twin = Harness {
        m: LockMachine::from_snapshot_bytes(&bytes).unwrap(),
        next: h.next,
    };
    assert_eq!(twin.m, h.m);
    for cmd in [
        Command::CloseSession { session: s[2] },
        Command::ExpireSession { session: s[5] },
        claim(s[4], "pool", PERMITS3, true),
    ] {
        assert_eq!(h.apply(cmd.clone()), twin.apply(cmd));
    }
    assert_eq!(h.m.to_snapshot_bytes(), twin.m.to_snapshot_bytes());
    // The old formats cannot hold these: writing one is a bug, not a downgrade.
    let result = std::panic::catch_unwind(|| h.m.to_format_3_bytes());
    assert!(result.is_err());
}

#[test]
fn readers_past_the_bound_wait_their_turn() {
    let mut h = Harness::new();
    let readers: Vec<SessionId> = (0..=claim::MAX_READERS)
        .map(|_| match h.bulk(create(10_000, "r")).outcome {
            Ok(Reply::SessionCreated { session }) => session,
            ref other => panic!("{other:?}"),
        })
        .collect();
    let mut tokens = Vec::new();
    for r in &readers[..claim::MAX_READERS] {
        tokens.push(granted(&h.bulk(claim(*r, "doc", Claim::Read, true))).0);
    }
    let last = readers[claim::MAX_READERS];
    assert_eq!(queued(&h.apply(claim(last, "doc", Claim::Read, true))), 1);
    let freed = h.apply(release(readers[0], "doc", tokens[0]));
    assert_eq!(freed.grants.len(), 1);
    assert_eq!(freed.grants[0].session, last);
}

/// Each planted bug (what `palisade sim --plant` uses) really departs from
/// the rules, and the machine's own invariants catch it as soon as it acts;
/// with none planted the same entries keep them.
#[test]
fn each_planted_recipe_bug_breaks_an_invariant_the_first_time_it_acts() {
    let lead = |v: &str| Claim::Lead { value: v.into() };
    let cases: [(RecipeBugs, [Claim; 3]); 3] = [
        (
            RecipeBugs {
                extra_permit: true,
                ..RecipeBugs::default()
            },
            [
                Claim::Permit { permits: 2 },
                Claim::Permit { permits: 2 },
                Claim::Permit { permits: 2 },
            ],
        ),
        (
            RecipeBugs {
                writer_beside_readers: true,
                ..RecipeBugs::default()
            },
            [Claim::Read, Claim::Read, Claim::Write],
        ),
        (
            RecipeBugs {
                second_leader: true,
                ..RecipeBugs::default()
            },
            [lead("a"), lead("b"), lead("c")],
        ),
    ];
    for (bugs, claims) in cases {
        for planted in [false, true] {
            let mut h = Harness::new();
            let s: Vec<SessionId> = (0..3).map(|_| h.session()).collect();
            if planted {
                h.m.plant(bugs);
            }
            let mut broken = None;
            for (who, c) in s.iter().zip(claims.clone()) {
                h.bulk(claim(*who, "name", c, true));
                if let Err(e) = h.m.check_invariants() {
                    broken = Some(e);
                    break;
                }
            }
            assert_eq!(
                broken.is_some(),
                planted,
                "{bugs:?} planted: {planted}: {broken:?}"
            );
        }
    }
}
