use super::*;
use crate::limits::{InputError, MAX_NAME_LEN};

fn acquired(applied: &Applied) -> FencingToken {
    match applied.outcome {
        Ok(Reply::Acquired { token, .. }) => token,
        ref other => panic!("not acquired: {other:?}"),
    }
}

#[test]
fn session_id_and_first_token_are_entry_indices() {
    let mut h = Harness::new();
    h.next = 7;
    let s = h.session();
    assert_eq!(s, SessionId(7));
    let a = h.apply(acquire(s, "db", false, 0));
    assert_eq!(a.index, 8);
    assert_eq!(
        a.outcome,
        Ok(Reply::Acquired {
            token: tok(8),
            reacquired: false,
            slot: 0
        })
    );
    assert_eq!(
        a.grants,
        vec![Grant {
            name: "db".into(),
            session: s,
            token: tok(8),
            slot: 0
        }]
    );
    let view = h.m.get("db").unwrap();
    assert_eq!(view.holder, Some(s));
    assert_eq!(view.token, Some(tok(8)));
}

#[test]
fn five_waiters_are_served_in_fifo_order_with_handoff_indices_as_tokens() {
    let mut h = Harness::new();
    let owner = h.session();
    let waiters: Vec<SessionId> = (0..5).map(|_| h.session()).collect();
    let mut token = acquired(&h.apply(acquire(owner, "q", true, 0)));
    for (i, w) in waiters.iter().enumerate() {
        let a = h.apply(acquire(*w, "q", true, 0));
        assert_eq!(a.outcome, Ok(Reply::Queued { position: i + 1 }));
        assert!(a.grants.is_empty());
    }
    assert_eq!(h.m.get("q").unwrap().waiters, waiters);

    let mut holder = owner;
    for w in &waiters {
        let a = h.apply(release(holder, "q", token));
        assert_eq!(a.outcome, Ok(Reply::Released { retried: false }));
        assert_eq!(a.grants.len(), 1);
        let g = &a.grants[0];
        assert_eq!((g.name.as_str(), g.session), ("q", *w));
        assert_eq!(
            g.token.get(),
            a.index,
            "token must be the handing-off entry's index"
        );
        assert!(g.token > token, "tokens must strictly increase");
        token = g.token;
        holder = *w;
        assert_eq!(h.m.get("q").unwrap().token, Some(token));
    }
    let a = h.apply(release(holder, "q", token));
    assert!(a.grants.is_empty());
    assert_eq!(
        h.m.get("q"),
        None,
        "a released lock with no waiters is free"
    );
}

#[test]
fn reacquire_by_holder_returns_the_same_grant() {
    let mut h = Harness::new();
    let s = h.session();
    let token = acquired(&h.apply(acquire(s, "x", false, 0)));
    for wait in [false, true] {
        let a = h.unchanged(acquire(s, "x", wait, 500));
        assert_eq!(
            a.outcome,
            Ok(Reply::Acquired {
                token,
                reacquired: true,
                slot: 0
            })
        );
    }
}

#[test]
fn queued_session_asking_again_gets_its_position_not_a_second_place() {
    let mut h = Harness::new();
    let (a, b, c) = (h.session(), h.session(), h.session());
    h.apply(acquire(a, "x", false, 0));
    h.apply(acquire(b, "x", true, 0));
    h.apply(acquire(c, "x", true, 0));
    let again = h.unchanged(acquire(c, "x", true, 0));
    assert_eq!(again.outcome, Ok(Reply::Queued { position: 2 }));
    assert_eq!(h.m.get("x").unwrap().waiters, vec![b, c]);
}

#[test]
fn would_block_reports_holder_token_and_changes_nothing() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let token = acquired(&h.apply(acquire(a, "x", false, 0)));
    let applied = h.unchanged(acquire(b, "x", false, 0));
    assert_eq!(
        applied.outcome,
        Ok(Reply::WouldBlock {
            holder_token: Some(token)
        })
    );
}

#[test]
fn a_retried_release_is_answered_released_and_changes_nothing() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let t1 = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(acquire(b, "x", true, 0));
    // The first attempt commits and hands the lock to b; its answer is lost.
    let t2 = h.apply(release(a, "x", t1)).grants[0].token;
    // The retry, after a failover: the same answer, and b keeps the lock.
    let retry = h.unchanged(release(a, "x", t1));
    assert_eq!(retry.outcome, Ok(Reply::Released { retried: true }));
    assert_eq!(h.m.check_token("x", t2), TokenCheck::Current);
    // Only the session that released it, and only with its token.
    assert_eq!(
        h.refused(release(b, "x", t1)),
        MachineError::StaleToken {
            presented: t1,
            current: t2
        }
    );
    let c = h.session();
    assert_eq!(
        h.refused(release(c, "x", t1)),
        MachineError::NotHolder { name: "x".into() }
    );
    // A session remembers its last few releases, not every one.
    for i in 0..RELEASES_REMEMBERED {
        let name = format!("l{i}");
        let t = acquired(&h.apply(acquire(a, &name, false, 0)));
        h.apply(release(a, &name, t));
    }
    assert_eq!(
        h.refused(release(a, "x", t1)),
        MachineError::NotHolder { name: "x".into() }
    );
    // What it remembers survives a snapshot, format 3 (before the recipes)
    // loads to the same state, and format 2 still loads.
    let restored = LockMachine::from_snapshot_bytes(&h.m.to_snapshot_bytes()).unwrap();
    assert_eq!(restored, h.m);
    let three = LockMachine::from_snapshot_bytes(&h.m.to_format_3_bytes()).unwrap();
    assert_eq!(three, h.m);
    let old = LockMachine::from_snapshot_bytes(&h.m.to_format_2_bytes()).unwrap();
    assert_eq!(old.locks, h.m.locks);
    assert!(old.sessions.values().all(|s| s.released.is_empty()));
}

#[test]
fn release_by_another_session_is_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let token = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(acquire(b, "x", true, 0));
    assert_eq!(
        h.refused(release(b, "x", token)),
        MachineError::NotHolder { name: "x".into() }
    );
}

#[test]
fn release_with_stale_token_is_refused() {
    let mut h = Harness::new();
    let a = h.session();
    let old = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(release(a, "x", old));
    let new = acquired(&h.apply(acquire(a, "x", false, 0)));
    assert!(new > old);
    let never = FencingToken::new(new.get() - 1).unwrap();
    assert_ne!(never, old);
    assert_eq!(
        h.refused(release(a, "x", never)),
        MachineError::StaleToken {
            presented: never,
            current: new
        }
    );
    assert_eq!(
        h.refused(release(a, "nope", new)),
        MachineError::NoSuchLock {
            name: "nope".into()
        }
    );
}

#[test]
fn expiry_starts_lock_delay_and_end_lock_delay_grants_first_waiter() {
    let mut h = Harness::new();
    let (a, b, c) = (h.session(), h.session(), h.session());
    h.apply(acquire(a, "x", false, 5_000));
    h.apply(acquire(b, "x", true, 0));
    let expire = h.apply(Command::ExpireSession { session: a });
    assert!(
        expire.grants.is_empty(),
        "lock-delay must hold the lock back"
    );
    assert_eq!(
        expire.outcome,
        Ok(Reply::SessionEnded {
            session: a,
            released: vec!["x".into()],
            lock_delay: vec![DelayedLock {
                name: "x".into(),
                lock_delay_ms: 5_000
            }],
            dropped_waits: vec![],
        })
    );
    let view = h.m.get("x").unwrap();
    assert!(view.in_lock_delay);
    assert_eq!((view.holder, view.token), (None, None));
    assert_eq!(view.waiters, vec![b]);
    assert_eq!(view.lock_delay_since, Some(expire.index));

    // Unavailable to everyone meanwhile; newcomers may queue behind b.
    let blocked = h.unchanged(acquire(c, "x", false, 0));
    assert_eq!(
        blocked.outcome,
        Ok(Reply::WouldBlock { holder_token: None })
    );
    h.apply(acquire(c, "x", true, 0));

    let end = h.apply(end_delay("x"));
    assert_eq!(end.outcome, Ok(Reply::LockDelayEnded));
    assert_eq!(
        end.grants,
        vec![Grant {
            name: "x".into(),
            session: b,
            token: tok(end.index),
            slot: 0
        }]
    );
    let view = h.m.get("x").unwrap();
    assert!(!view.in_lock_delay);
    assert_eq!(view.waiters, vec![c]);
    assert_eq!(
        h.refused(end_delay("x")),
        MachineError::NotInLockDelay { name: "x".into() }
    );
}

#[test]
fn end_lock_delay_with_no_waiters_frees_the_lock() {
    let mut h = Harness::new();
    let a = h.session();
    h.apply(acquire(a, "x", false, 100));
    h.apply(Command::ExpireSession { session: a });
    let end = h.apply(end_delay("x"));
    assert!(end.grants.is_empty());
    assert_eq!(h.m.get("x"), None);
    assert_eq!(
        h.refused(end_delay("never")),
        MachineError::NotInLockDelay {
            name: "never".into()
        }
    );
}

#[test]
fn expiry_without_lock_delay_hands_over_at_once() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    h.apply(acquire(a, "x", false, 0));
    h.apply(acquire(b, "x", true, 0));
    let e = h.apply(Command::ExpireSession { session: a });
    assert_eq!(e.grants.len(), 1);
    assert_eq!((e.grants[0].session, e.grants[0].token), (b, tok(e.index)));
}

#[test]
fn release_and_close_never_start_lock_delay() {
    let mut h = Harness::new();
    let (a, b, c) = (h.session(), h.session(), h.session());
    let t = acquired(&h.apply(acquire(a, "x", false, 60_000)));
    h.apply(acquire(b, "x", true, 60_000));
    let r = h.apply(release(a, "x", t));
    assert_eq!(
        r.grants[0].session, b,
        "release hands over despite lock_delay_ms"
    );
    assert_eq!(h.m.get("x").unwrap().lock_delay_ms, 60_000);

    h.apply(acquire(c, "x", true, 0));
    let close = h.apply(Command::CloseSession { session: b });
    assert_eq!(close.grants.len(), 1);
    assert_eq!(close.grants[0].session, c);
    match close.outcome {
        Ok(Reply::SessionEnded { lock_delay, .. }) => assert!(lock_delay.is_empty()),
        other => panic!("{other:?}"),
    }
    assert!(!h.m.get("x").unwrap().in_lock_delay);
}

#[test]
fn close_session_releases_all_locks_and_drops_its_waits() {
    let mut h = Harness::new();
    let (a, b, c) = (h.session(), h.session(), h.session());
    h.apply(acquire(a, "l1", false, 0));
    h.apply(acquire(a, "l2", false, 0));
    h.apply(acquire(b, "l1", true, 0));
    h.apply(acquire(c, "l3", false, 0));
    h.apply(acquire(a, "l3", true, 0));
    h.apply(acquire(b, "l3", true, 0));
    let close = h.apply(Command::CloseSession { session: a });
    assert_eq!(
        close.outcome,
        Ok(Reply::SessionEnded {
            session: a,
            released: vec!["l1".into(), "l2".into()],
            lock_delay: vec![],
            dropped_waits: vec!["l3".into()],
        })
    );
    assert_eq!(
        close.grants,
        vec![Grant {
            name: "l1".into(),
            session: b,
            token: tok(close.index),
            slot: 0
        }]
    );
    assert_eq!(h.m.get("l2"), None);
    assert_eq!(h.m.get("l3").unwrap().waiters, vec![b]);
    assert_eq!(h.m.session(a), None);
}

#[test]
fn cancel_wait_leaves_the_queue_and_keeps_order() {
    let mut h = Harness::new();
    let (a, b, c, d) = (h.session(), h.session(), h.session(), h.session());
    let t = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(acquire(b, "x", true, 0));
    h.apply(acquire(c, "x", true, 0));
    h.apply(acquire(d, "x", true, 0));
    let cancel_c = h.apply(cancel(c, "x"));
    assert_eq!(cancel_c.outcome, Ok(Reply::WaitCancelled));
    assert!(cancel_c.grants.is_empty());
    assert_eq!(h.m.get("x").unwrap().waiters, vec![b, d]);
    assert_eq!(
        h.refused(cancel(c, "x")),
        MachineError::NotWaiting { name: "x".into() }
    );
    assert_eq!(
        h.refused(cancel(a, "x")),
        MachineError::AlreadyGranted { token: t }
    );
    let r = h.apply(release(a, "x", t));
    assert_eq!(r.grants[0].session, b);
    assert_eq!(
        h.refused(cancel(b, "x")),
        MachineError::AlreadyGranted {
            token: r.grants[0].token
        }
    );
    assert_eq!(h.m.session(c).unwrap().waiting, Vec::<String>::new());
}

#[test]
fn unknown_session_is_refused_by_every_command() {
    let mut h = Harness::new();
    let a = h.session();
    let t = acquired(&h.apply(acquire(a, "x", false, 100)));
    let closed = h.session();
    h.apply(Command::CloseSession { session: closed });
    for ghost in [SessionId(0), SessionId(999), closed] {
        let want = MachineError::UnknownSession { session: ghost };
        for cmd in [
            acquire(ghost, "x", true, 0),
            acquire(ghost, "free", false, 0),
            release(ghost, "x", t),
            cancel(ghost, "x"),
            Command::CloseSession { session: ghost },
            Command::ExpireSession { session: ghost },
        ] {
            assert_eq!(h.refused(cmd), want);
        }
    }
}

#[test]
fn bad_names_are_refused() {
    let mut h = Harness::new();
    let a = h.session();
    let t = acquired(&h.apply(acquire(a, "x", false, 0)));
    let long = "n".repeat(MAX_NAME_LEN + 1);
    for (name, want) in [
        ("", InputError::EmptyName),
        (
            long.as_str(),
            InputError::NameTooLong {
                len: MAX_NAME_LEN + 1,
            },
        ),
        ("a\0b", InputError::NameHasControlChar { at: 1 }),
    ] {
        let want = MachineError::from(want);
        assert_eq!(h.refused(acquire(a, name, true, 0)), want);
        assert_eq!(h.refused(release(a, name, t)), want);
        assert_eq!(h.refused(cancel(a, name)), want);
        assert_eq!(h.refused(end_delay(name)), want);
    }
    // The longest allowed name works.
    acquired(&h.apply(acquire(a, &"n".repeat(MAX_NAME_LEN), false, 0)));
}

#[test]
fn bad_session_parameters_are_refused() {
    let mut h = Harness::new();
    for ttl_ms in [0, 9, 24 * 60 * 60 * 1000 + 1, u64::MAX] {
        assert!(
            matches!(
                h.refused(create(ttl_ms, "")),
                MachineError::Input {
                    input: InputError::TtlOutOfRange { .. }
                }
            ),
            "ttl {ttl_ms} accepted"
        );
    }
    assert_eq!(
        h.refused(create(1_000, &"l".repeat(MAX_LABEL_LEN + 1))),
        MachineError::LabelTooLong {
            len: MAX_LABEL_LEN + 1,
            limit: MAX_LABEL_LEN
        }
    );
    assert!(
        h.apply(create(10, &"l".repeat(MAX_LABEL_LEN)))
            .outcome
            .is_ok()
    );
}

#[test]
fn absurd_lock_delay_is_refused() {
    let mut h = Harness::new();
    let a = h.session();
    for delay in [MAX_LOCK_DELAY_MS + 1, u64::MAX] {
        assert_eq!(
            h.refused(acquire(a, "x", true, delay)),
            MachineError::LockDelayTooLong {
                lock_delay_ms: delay,
                limit: MAX_LOCK_DELAY_MS
            }
        );
    }
    acquired(&h.apply(acquire(a, "x", true, MAX_LOCK_DELAY_MS)));
}

#[test]
fn too_many_waiters_is_refused() {
    let mut h = Harness::new();
    let owner = h.session();
    h.apply(acquire(owner, "hot", false, 0));
    for i in 0..MAX_WAITERS_PER_LOCK {
        let s = SessionId(h.bulk(create(1_000, "")).index);
        let a = h.bulk(acquire(s, "hot", true, 0));
        assert_eq!(a.outcome, Ok(Reply::Queued { position: i + 1 }));
    }
    let late = h.session();
    assert_eq!(
        h.refused(acquire(late, "hot", true, 0)),
        MachineError::TooManyWaiters {
            name: "hot".into(),
            limit: MAX_WAITERS_PER_LOCK
        }
    );
    // Not waiting is still answered.
    assert!(matches!(
        h.unchanged(acquire(late, "hot", false, 0)).outcome,
        Ok(Reply::WouldBlock { .. })
    ));
}

#[test]
fn too_many_locks_per_session_is_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    h.apply(acquire(b, "taken", false, 0));
    for i in 0..MAX_LOCKS_PER_SESSION - 1 {
        acquired(&h.apply(acquire(a, &format!("l{i}"), false, 0)));
    }
    assert!(matches!(
        h.apply(acquire(a, "taken", true, 0)).outcome,
        Ok(Reply::Queued { .. })
    ));
    let want = MachineError::TooManyLocks {
        session: a,
        limit: MAX_LOCKS_PER_SESSION,
    };
    assert_eq!(h.refused(acquire(a, "one-more", false, 0)), want);
    // Re-asking for what it already has is not a new lock.
    assert!(matches!(
        h.unchanged(acquire(a, "l0", false, 0)).outcome,
        Ok(Reply::Acquired {
            reacquired: true,
            ..
        })
    ));
}

#[test]
fn too_many_sessions_is_refused() {
    let mut h = Harness::new();
    for _ in 0..MAX_SESSIONS {
        h.bulk(create(1_000, ""));
    }
    assert_eq!(h.m.sessions().len(), MAX_SESSIONS);
    assert_eq!(
        h.refused(create(1_000, "")),
        MachineError::TooManySessions {
            limit: MAX_SESSIONS
        }
    );
}

#[test]
fn check_token_tells_current_from_stale() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let t1 = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(acquire(b, "x", true, 0));
    assert_eq!(h.m.check_token("x", t1), TokenCheck::Current);
    let t2 = h.apply(release(a, "x", t1)).grants[0].token;
    assert_eq!(
        h.m.check_token("x", t1),
        TokenCheck::Stale { current: Some(t2) }
    );
    assert_eq!(h.m.check_token("x", t2), TokenCheck::Current);
    assert_eq!(
        h.m.check_token("other", t2),
        TokenCheck::Stale { current: None }
    );
}

#[test]
fn views_are_sorted_and_complete() {
    let mut h = Harness::new();
    let a = h.apply(create(5_000, "worker-1")).index;
    let a = SessionId(a);
    let b = h.session();
    let tz = acquired(&h.apply(acquire(a, "z", false, 0)));
    let tm = acquired(&h.apply(acquire(a, "m", false, 250)));
    h.apply(acquire(b, "m", true, 0));
    let names: Vec<String> = h.m.list().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["m", "z"]);
    assert_eq!(
        h.m.locks_held_by(a),
        vec![
            Grant {
                name: "m".into(),
                session: a,
                token: tm,
                slot: 0
            },
            Grant {
                name: "z".into(),
                session: a,
                token: tz,
                slot: 0
            },
        ]
    );
    assert!(h.m.locks_held_by(SessionId(12345)).is_empty());
    assert_eq!(
        h.m.session(a),
        Some(SessionView {
            id: a,
            ttl_ms: 5_000,
            label: "worker-1".into(),
            owner: Default::default(),
            held: vec!["m".into(), "z".into()],
            waiting: vec![],
        })
    );
    assert_eq!(h.m.session(b).unwrap().waiting, vec!["m".to_owned()]);
    let ids: Vec<SessionId> = h.m.sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(ids, [a, b]);
    assert_eq!(h.m.get("m").unwrap().lock_delay_ms, 250);
}

/// A small history touching every kind of state: holders, queues, lock-delay.
fn busy_history(h: &mut Harness) -> Vec<SessionId> {
    let s: Vec<SessionId> = (0..4).map(|_| h.session()).collect();
    h.apply(acquire(s[0], "a", false, 1_000));
    h.apply(acquire(s[1], "a", true, 0));
    h.apply(acquire(s[2], "a", true, 0));
    h.apply(acquire(s[1], "b", false, 0));
    h.apply(acquire(s[3], "b", true, 0));
    h.apply(Command::ExpireSession { session: s[0] });
    s
}

#[test]
fn snapshot_round_trip_is_equal_and_continues_identically() {
    let mut h = Harness::new();
    let s = busy_history(&mut h);
    let bytes = h.m.to_snapshot_bytes();
    let restored = LockMachine::from_snapshot_bytes(&bytes).unwrap();
    assert_eq!(restored, h.m);
    assert_eq!(restored.last_applied(), h.m.last_applied());
    assert_eq!(restored.to_snapshot_bytes(), bytes);

    let mut twin = Harness {
        m: restored,
        next: h.next,
    };
    let tail = [
        end_delay("a"),
        acquire(s[3], "a", true, 0),
        cancel(s[2], "a"),
        Command::CloseSession { session: s[1] },
        acquire(s[2], "c", false, 0),
    ];
    for cmd in tail {
        assert_eq!(h.apply(cmd.clone()), twin.apply(cmd));
        assert_eq!(h.m, twin.m);
    }
    assert_eq!(h.m.to_snapshot_bytes(), twin.m.to_snapshot_bytes());
}

#[test]
fn a_snapshot_of_format_1_json_still_loads() {
    // Format 1, written by earlier versions: the machine as one JSON object.
    let mut h = Harness::new();
    busy_history(&mut h);
    let json = serde_json::to_vec(&h.m.to_format_1_json()).unwrap();
    assert_eq!(json.first(), Some(&b'{'));
    let restored = LockMachine::from_snapshot_bytes(&json).unwrap();
    assert_eq!(restored, h.m);
    // Written again, it is format 4 and loads to the same state.
    let bytes = restored.to_snapshot_bytes();
    assert!(bytes.starts_with(b"PLSDSNAP"));
    assert!(bytes.len() < json.len());
    assert_eq!(LockMachine::from_snapshot_bytes(&bytes).unwrap(), h.m);
}

#[test]
fn corrupt_snapshots_are_rejected() {
    let mut h = Harness::new();
    busy_history(&mut h);
    let bytes = h.m.to_snapshot_bytes();
    // Format 2.
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&bytes[..10]),
        Err(SnapshotError::Truncated)
    ));
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&newer),
        Err(SnapshotError::UnknownFormat(5))
    ));
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&bytes[..bytes.len() - 3]),
        Err(SnapshotError::Decode(_))
    ));
    // Decodes fine, but a holder's session is not in the snapshot.
    let mut orphaned = h.m.clone();
    let holder = h.m.locks.get("b").unwrap().holders[0].session;
    orphaned.sessions.remove(&holder);
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&orphaned.to_snapshot_bytes()),
        Err(SnapshotError::Inconsistent(_))
    ));
    // Decodes fine, but a token is from after the snapshot's last entry.
    let mut rewound = h.m.clone();
    rewound.last_applied = 1;
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&rewound.to_snapshot_bytes()),
        Err(SnapshotError::Inconsistent(_))
    ));
    assert!(rewound.check_invariants().is_err());

    // Format 1 (JSON).
    let json = h.m.to_format_1_json().to_string();
    assert!(matches!(
        LockMachine::from_snapshot_bytes(b"{not json"),
        Err(SnapshotError::DecodeJson(_))
    ));
    // A holder token of 0 is no token at all.
    let t = h.m.get("b").unwrap().token.unwrap();
    let zero = json.replace(&format!("\"token\":{t}"), "\"token\":0");
    assert_ne!(zero, json);
    assert!(matches!(
        LockMachine::from_snapshot_bytes(zero.as_bytes()),
        Err(SnapshotError::DecodeJson(_))
    ));
    // Decodes fine, but the lock table and the sessions' mirrors disagree
    // (format 2 cannot even express this: it rebuilds the mirrors).
    let mut broken = h.m.clone();
    let ids: Vec<SessionId> = broken.sessions.keys().copied().collect();
    for id in ids {
        broken.sessions.get_mut(&id).unwrap().held.clear();
    }
    assert!(matches!(
        LockMachine::from_snapshot_bytes(&broken.to_format_1_json().to_string().into_bytes()),
        Err(SnapshotError::Inconsistent(_))
    ));
    assert_eq!(
        LockMachine::from_snapshot_bytes(&broken.to_snapshot_bytes()).unwrap(),
        h.m
    );
}

#[test]
fn commands_and_results_survive_serde() {
    let mut h = Harness::new();
    let s = busy_history(&mut h);
    let cmds = [
        create(1_000, "x"),
        Command::CloseSession { session: s[0] },
        Command::ExpireSession { session: s[1] },
        acquire(s[1], "a", true, 10),
        release(s[1], "a", tok(3)),
        cancel(s[2], "a"),
        end_delay("a"),
        acquire(s[1], "", true, 10),
    ];
    for cmd in cmds {
        let json = serde_json::to_string(&cmd).unwrap();
        assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), cmd);
        let applied = h.apply(cmd);
        let json = serde_json::to_string(&applied).unwrap();
        assert_eq!(serde_json::from_str::<Applied>(&json).unwrap(), applied);
    }
    for view in h.m.list() {
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<LockView>(&json).unwrap(), view);
    }
    assert!(
        serde_json::from_str::<Command>(r#"{"op":"release","session":1,"name":"a","token":0}"#)
            .is_err()
    );
}

#[test]
#[should_panic(expected = "is not after the last applied index 5")]
fn reapplying_an_index_panics() {
    let mut m = LockMachine::new();
    m.apply(5, create(1_000, ""));
    m.apply(5, create(1_000, ""));
}

#[test]
#[should_panic(expected = "log index 0 is not after")]
fn index_zero_panics() {
    LockMachine::new().apply(0, create(1_000, ""));
}

#[test]
fn refused_entries_still_advance_last_applied() {
    let mut m = LockMachine::new();
    let a = m.apply(3, create(0, ""));
    assert!(a.outcome.is_err());
    assert_eq!(m.last_applied(), 3);
    // Gaps (entries that were not commands, e.g. membership changes) are fine.
    assert!(m.apply(10, create(1_000, "")).outcome.is_ok());
    assert_eq!(m.session(SessionId(10)).unwrap().ttl_ms, 1_000);
}

#[test]
fn a_batch_grants_distinct_locks_at_its_index() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let index = h.next;
    h.next += 1;
    let applied = h.m.apply_batch(
        index,
        vec![acquire(a, "x", false, 0), acquire(b, "y", false, 0)],
    );
    h.m.check_invariants().unwrap();
    assert_eq!(h.m.last_applied(), index);
    for (applied, name) in applied.iter().zip(["x", "y"]) {
        assert!(
            matches!(applied.outcome, Ok(Reply::Acquired { token, .. }) if token == tok(index))
        );
        assert_eq!(h.m.get(name).unwrap().token, Some(tok(index)));
    }
}

#[test]
fn a_batch_shares_a_lock_but_not_a_session_creation_or_a_session_end() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let index = h.next;
    h.next += 1;
    let applied = h.m.apply_batch(
        index,
        vec![
            acquire(a, "x", false, 0),
            acquire(b, "x", true, 0),
            create(1_000, "second"),
            create(1_000, "third"),
            Command::CloseSession { session: a },
        ],
    );
    h.m.check_invariants().unwrap();
    assert_eq!(acquired(&applied[0]), tok(index));
    assert_eq!(applied[1].outcome, Ok(Reply::Queued { position: 1 }));
    assert!(applied[2].outcome.is_ok());
    assert_eq!(applied[3].outcome, Err(MachineError::BatchConflict));
    assert_eq!(applied[4].outcome, Err(MachineError::BatchConflict));
    // The refused commands changed nothing: a still holds x, b waits for it.
    let x = h.m.get("x").unwrap();
    assert_eq!(x.holder, Some(a));
    assert_eq!(x.waiters, vec![b]);
    // A lone session end is fine.
    let end =
        h.m.apply_batch(h.next, vec![Command::CloseSession { session: a }]);
    assert!(end[0].outcome.is_ok());
}

#[test]
fn a_release_and_the_previous_holders_next_acquire_share_an_entry_with_one_grant() {
    let mut h = Harness::new();
    let (p, q, r) = (h.session(), h.session(), h.session());
    let t = acquired(&h.apply(acquire(p, "x", false, 0)));
    h.apply(acquire(q, "x", true, 0));
    h.apply(acquire(r, "x", true, 0));
    let index = h.next;
    h.next += 1;
    // p releases, and (as a busy worker would) asks again at once.
    let applied =
        h.m.apply_batch(index, vec![release(p, "x", t), acquire(p, "x", true, 0)]);
    h.m.check_invariants().unwrap();
    assert_eq!(applied[0].outcome, Ok(Reply::Released { retried: false }));
    assert_eq!(
        applied[0].grants,
        vec![Grant {
            name: "x".into(),
            session: q,
            token: tok(index),
            slot: 0
        }]
    );
    assert_eq!(applied[1].outcome, Ok(Reply::Queued { position: 2 }));
    assert!(applied[1].grants.is_empty());
    assert_eq!(h.m.get("x").unwrap().waiters, vec![r, p]);
}

#[test]
fn a_release_of_a_grant_made_by_its_own_entry_is_refused() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    let index = h.next;
    h.next += 1;
    // a guesses the index its acquire will land at; were the release accepted,
    // b's acquire would be a second grant of x at the same index.
    let applied = h.m.apply_batch(
        index,
        vec![
            acquire(a, "x", false, 0),
            release(a, "x", tok(index)),
            acquire(b, "x", true, 0),
        ],
    );
    h.m.check_invariants().unwrap();
    assert_eq!(acquired(&applied[0]), tok(index));
    assert_eq!(
        applied[1].outcome,
        Err(MachineError::NotHolder { name: "x".into() })
    );
    assert_eq!(applied[2].outcome, Ok(Reply::Queued { position: 1 }));
    let grants: usize = applied.iter().map(|a| a.grants.len()).sum();
    assert_eq!(grants, 1, "one entry, one grant of x");
    assert_eq!(h.m.get("x").unwrap().holder, Some(a));
    // In the next entry the same release is a real one.
    assert_eq!(
        h.apply(release(a, "x", tok(index))).outcome,
        Ok(Reply::Released { retried: false })
    );
}

#[test]
fn batched_expiries_share_an_entry_but_never_grant_a_lock_twice() {
    let mut h = Harness::new();
    let (a, b, c, d) = (h.session(), h.session(), h.session(), h.session());
    let tx = acquired(&h.apply(acquire(a, "x", false, 0)));
    h.apply(acquire(b, "x", true, 0));
    h.apply(acquire(c, "x", true, 0));
    acquired(&h.apply(acquire(d, "y", false, 0)));
    let index = h.next;
    h.next += 1;
    // a's expiry hands x to b at this index; b's expiry in the same entry would
    // hand x on to c with the same token, so it is refused; d's goes through.
    let applied = h.m.apply_batch(
        index,
        vec![
            Command::ExpireInBatch { session: a },
            Command::ExpireInBatch { session: b },
            Command::ExpireInBatch { session: d },
        ],
    );
    h.m.check_invariants().unwrap();
    assert!(matches!(applied[0].outcome, Ok(Reply::SessionEnded { .. })));
    assert_eq!(
        applied[0].grants,
        vec![Grant {
            name: "x".into(),
            session: b,
            token: tok(index),
            slot: 0
        }]
    );
    assert_eq!(applied[1].outcome, Err(MachineError::BatchConflict));
    assert!(applied[1].grants.is_empty());
    assert!(matches!(applied[2].outcome, Ok(Reply::SessionEnded { .. })));
    let grants: usize = applied.iter().map(|a| a.grants.len()).sum();
    assert_eq!(grants, 1, "one entry, one grant of x");
    let x = h.m.get("x").unwrap();
    assert_eq!((x.holder, x.token), (Some(b), Some(tok(index))));
    assert!(x.token > Some(tx));
    assert!(h.m.get("y").is_none(), "d's lock is free");
    // In the next entry b's expiry goes through and x moves on to c.
    let next = h.apply(Command::ExpireInBatch { session: b });
    assert_eq!(next.grants.len(), 1);
    assert_eq!(next.grants[0].session, c);
}

#[test]
fn end_lock_delay_names_the_delay_it_ends() {
    let mut h = Harness::new();
    let (a, b) = (h.session(), h.session());
    h.apply(acquire(a, "x", false, 5_000));
    h.apply(acquire(b, "x", true, 0));
    h.apply(Command::ExpireSession { session: a });
    let since =
        h.m.get("x")
            .unwrap()
            .lock_delay_since
            .expect("in lock-delay");
    // An entry for some other (earlier) delay changes nothing.
    let stale = h.refused(Command::EndLockDelay {
        name: "x".into(),
        since: Some(since - 1),
    });
    assert!(matches!(stale, MachineError::NotInLockDelay { .. }));
    let ended = h.apply(Command::EndLockDelay {
        name: "x".into(),
        since: Some(since),
    });
    assert_eq!(ended.grants.len(), 1);
    assert_eq!(ended.grants[0].session, b);
}

#[test]
fn a_session_keeps_its_owner_through_snapshots_and_old_entries_have_none() {
    let mut h = Harness::new();
    let owner = SessionOwner {
        identity: "nightly".into(),
        key_sha256: "ab".repeat(32),
    };
    let s = match h
        .apply(Command::CreateSession {
            ttl_ms: 5_000,
            label: String::new(),
            owner: owner.clone(),
        })
        .outcome
    {
        Ok(Reply::SessionCreated { session }) => session,
        other => panic!("{other:?}"),
    };
    assert_eq!(h.m.session_owner(s), Some(&owner));
    let restored = LockMachine::from_snapshot_bytes(&h.m.to_snapshot_bytes()).unwrap();
    assert_eq!(restored.session_owner(s), Some(&owner));
    assert_eq!(restored.session_owner(SessionId(s.0 + 1)), None);
    // An entry written before sessions had owners reads as owned by nobody:
    // no key matches its empty digest, so nobody can act on it.
    let old: Command =
        serde_json::from_str(r#"{"op":"create_session","ttl_ms":1000,"label":"x"}"#).unwrap();
    let s2 = match h.apply(old).outcome {
        Ok(Reply::SessionCreated { session }) => session,
        other => panic!("{other:?}"),
    };
    assert_eq!(h.m.session_owner(s2), Some(&SessionOwner::default()));
}

#[test]
fn counts_follow_holders_waiters_delays_and_sessions() {
    let mut h = Harness::new();
    assert_eq!(h.m.counts(), MachineCounts::default());
    let (a, b, c) = (h.session(), h.session(), h.session());
    h.apply(acquire(a, "x", false, 5_000));
    h.apply(acquire(a, "y", false, 0));
    h.apply(acquire(b, "x", true, 0));
    h.apply(acquire(c, "x", true, 0));
    let counts = h.m.counts();
    assert_eq!(
        (
            counts.sessions,
            counts.held,
            counts.waiters,
            counts.in_lock_delay
        ),
        (3, 2, 2, 0)
    );
    // a expires: y is free, x enters lock-delay with its two waiters queued.
    h.apply(Command::ExpireSession { session: a });
    let counts = h.m.counts();
    assert_eq!(
        (
            counts.sessions,
            counts.held,
            counts.waiters,
            counts.in_lock_delay
        ),
        (2, 0, 2, 1)
    );
}

#[test]
fn a_commands_kind_is_its_name_in_the_log() {
    let s = SessionId(1);
    for cmd in [
        create(1_000, ""),
        Command::CloseSession { session: s },
        Command::ExpireSession { session: s },
        Command::ExpireInBatch { session: s },
        acquire(s, "x", false, 0),
        release(s, "x", tok(1)),
        cancel(s, "x"),
        end_delay("x"),
    ] {
        let json = serde_json::to_value(&cmd).unwrap();
        assert_eq!(json["op"], cmd.kind().as_str(), "{json}");
    }
}

#[test]
fn sessions_are_counted_per_owner_through_close_expiry_and_snapshots() {
    let mut h = Harness::new();
    let open_as = |h: &mut Harness, identity: &str| match h
        .apply(Command::CreateSession {
            ttl_ms: 10_000,
            label: String::new(),
            owner: SessionOwner {
                identity: identity.to_owned(),
                key_sha256: "k".into(),
            },
        })
        .outcome
    {
        Ok(Reply::SessionCreated { session }) => session,
        other => panic!("{other:?}"),
    };
    let a: Vec<SessionId> = (0..3).map(|_| open_as(&mut h, "alice")).collect();
    let b = open_as(&mut h, "bob");
    assert_eq!((h.m.sessions_of("alice"), h.m.sessions_of("bob")), (3, 1));
    assert_eq!(h.m.sessions_of("carol"), 0);
    h.apply(Command::CloseSession { session: a[0] });
    h.apply(Command::ExpireSession { session: b });
    assert_eq!((h.m.sessions_of("alice"), h.m.sessions_of("bob")), (2, 0));
    let restored = LockMachine::from_snapshot_bytes(&h.m.to_snapshot_bytes()).unwrap();
    assert_eq!(restored.sessions_of("alice"), 2);
    let json = LockMachine::from_snapshot_bytes(&serde_json::to_vec(&h.m).unwrap()).unwrap();
    assert_eq!(json.sessions_of("alice"), 2);
    assert_eq!(restored, h.m);
    // A count that disagrees with the sessions is a broken state.
    let mut broken = h.m.clone();
    broken.sessions_per_owner.insert("alice".into(), 5);
    assert!(broken.check_invariants().is_err());
}

#[test]
fn each_command_says_what_it_did_as_a_typed_effect() {
    let mut h = Harness::new();
    let created = h.apply(create(7_000, "a"));
    let Ok(Reply::SessionCreated { session: a }) = created.outcome else {
        panic!("{created:?}")
    };
    assert_eq!(created.kind, CommandKind::CreateSession);
    assert_eq!(
        created.effect,
        Effect::SessionStarted {
            session: a,
            ttl_ms: 7_000
        }
    );
    let b = h.session();
    let got = h.apply(acquire(a, "db", false, 0));
    assert_eq!(
        (got.kind, &got.effect),
        (CommandKind::Acquire, &Effect::None)
    );
    let token = acquired(&got);
    assert_eq!(h.apply(acquire(b, "db", true, 0)).effect, Effect::None);

    // A refused release names who asked, what and with which token; a refusal
    // of another kind has no effect.
    let stale = h.apply(release(a, "db", tok(token.get() - 1)));
    assert_eq!(
        stale.effect,
        Effect::ReleaseRefused {
            session: a,
            name: "db".into(),
            token: tok(token.get() - 1)
        }
    );
    assert_eq!(h.apply(release(a, "nothing", token)).effect, Effect::None);

    let cancelled = h.apply(cancel(b, "db"));
    assert_eq!(
        cancelled.effect,
        Effect::WaitCancelled {
            session: b,
            name: "db".into()
        }
    );
    assert_eq!(h.apply(cancel(b, "db")).effect, Effect::None);

    // An expiry frees what the session held, with its token.
    let expired = h.apply(Command::ExpireSession { session: a });
    assert_eq!(expired.kind, CommandKind::ExpireSession);
    assert_eq!(
        expired.effect,
        Effect::SessionEnded {
            session: a,
            expired: true,
            freed: vec![Grant {
                name: "db".into(),
                session: a,
                token,
                slot: 0
            }]
        }
    );
    let closed = h.apply(Command::CloseSession { session: b });
    assert_eq!(
        closed.effect,
        Effect::SessionEnded {
            session: b,
            expired: false,
            freed: Vec::new()
        }
    );
}
