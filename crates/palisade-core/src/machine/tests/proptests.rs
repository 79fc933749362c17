//! Random command sequences over a few sessions and locks, checked against
//! invariants that hold whatever the sequence, and against a twin replica that is
//! snapshotted and restored midway.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;

use super::*;

const NAMES: [&str; 3] = ["a", "b", "c"];

/// A command in terms of "the k-th session ever created" and "the k-th lock", so
/// that shrinking keeps sequences meaningful.
#[derive(Debug, Clone)]
enum Op {
    Create,
    Close(usize),
    Expire(usize),
    ExpireInBatch(usize),
    Acquire {
        who: usize,
        lock: usize,
        wait: bool,
        delay: bool,
    },
    Release {
        who: usize,
        lock: usize,
        current: bool,
        raw: u64,
    },
    Cancel {
        who: usize,
        lock: usize,
    },
    EndDelay(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let who = 0..8usize;
    let lock = 0..10usize;
    prop_oneof![
        2 => Just(Op::Create),
        1 => who.clone().prop_map(Op::Close),
        1 => who.clone().prop_map(Op::Expire),
        2 => who.clone().prop_map(Op::ExpireInBatch),
        8 => (who.clone(), lock.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(who, lock, wait, delay)| Op::Acquire { who, lock, wait, delay }),
        4 => (who.clone(), lock.clone(), prop::bool::weighted(0.8), any::<u64>())
            .prop_map(|(who, lock, current, raw)| Op::Release { who, lock, current, raw }),
        1 => (who, lock.clone()).prop_map(|(who, lock)| Op::Cancel { who, lock }),
        2 => lock.prop_map(Op::EndDelay),
    ]
}

/// Mostly the three real names; sometimes an invalid (empty) one.
fn lock_name(lock: usize) -> String {
    if lock == 9 {
        String::new()
    } else {
        NAMES[lock % NAMES.len()].to_owned()
    }
}

/// Turns an [`Op`] into a concrete command, given the sessions created so far
/// (alive or not) and the current state.
fn command(op: &Op, ids: &[SessionId], m: &LockMachine) -> Command {
    // One slot past the end names a session that never existed.
    let pick = |who: usize| {
        ids.get(who % (ids.len() + 1))
            .copied()
            .unwrap_or(SessionId(u64::MAX))
    };
    match *op {
        Op::Create => Command::CreateSession {
            ttl_ms: 1_000,
            label: String::new(),
            owner: Default::default(),
        },
        Op::Close(who) => Command::CloseSession { session: pick(who) },
        Op::Expire(who) => Command::ExpireSession { session: pick(who) },
        Op::ExpireInBatch(who) => Command::ExpireInBatch { session: pick(who) },
        Op::Acquire {
            who,
            lock,
            wait,
            delay,
        } => Command::Acquire {
            session: pick(who),
            name: lock_name(lock),
            wait,
            lock_delay_ms: if delay { 1_000 } else { 0 },
        },
        Op::Release {
            who,
            lock,
            current,
            raw,
        } => {
            let name = lock_name(lock);
            let held = m.get(&name).and_then(|v| v.token);
            let token = match held {
                Some(t) if current => t,
                _ => tok(raw % (m.last_applied() + 2) + 1),
            };
            Command::Release {
                session: pick(who),
                name,
                token,
            }
        }
        Op::Cancel { who, lock } => Command::CancelWait {
            session: pick(who),
            name: lock_name(lock),
        },
        Op::EndDelay(lock) => Command::EndLockDelay {
            name: lock_name(lock),
            since: None,
        },
    }
}

fn holders(m: &LockMachine) -> BTreeMap<String, (SessionId, FencingToken)> {
    m.list()
        .into_iter()
        .filter_map(|v| Some((v.name, (v.holder?, v.token?))))
        .collect()
}

/// Everything that must hold after one step, given the state before it.
fn check_step(
    pre: &LockMachine,
    post: &LockMachine,
    cmd: &Command,
    applied: &Applied,
    model: &mut BTreeMap<String, (SessionId, FencingToken)>,
    max_token: &mut u64,
) -> Result<(), TestCaseError> {
    let index = applied.index;
    post.check_invariants()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(post.last_applied(), index);

    let Ok(reply) = &applied.outcome else {
        prop_assert!(applied.grants.is_empty());
        let mut expected = pre.clone();
        expected.last_applied = index;
        prop_assert_eq!(post, &expected, "a refused command changed the state");
        return Ok(());
    };

    // Idempotent acquire: the holder asking again gets the same grant, nothing moves.
    if let Command::Acquire { session, name, .. } = cmd
        && let Some(v) = pre.get(name).filter(|v| v.holder == Some(*session))
    {
        prop_assert_eq!(
            reply,
            &Reply::Acquired {
                token: v.token.unwrap(),
                reacquired: true
            }
        );
        prop_assert!(applied.grants.is_empty());
    }

    // Observable holders: what the outputs say, replayed on a model.
    match (cmd, reply) {
        (Command::Release { name, .. }, Reply::Released { retried: false }) => {
            prop_assert!(model.remove(name).is_some());
        }
        (_, Reply::SessionEnded { released, .. }) => {
            for name in released {
                prop_assert!(model.remove(name).is_some());
            }
        }
        _ => {}
    }
    let mut names_granted = Vec::new();
    for g in &applied.grants {
        // Tokens: the entry's index, above every earlier entry's grants.
        prop_assert_eq!(g.token.get(), index);
        prop_assert!(
            g.token.get() > *max_token,
            "token {} not increasing",
            g.token
        );
        prop_assert!(
            !names_granted.contains(&g.name),
            "two grants of one lock in one entry"
        );
        names_granted.push(g.name.clone());
        // At most one holder: the lock must be free in the observable history.
        prop_assert!(
            !model.contains_key(&g.name),
            "{} granted while held by {:?}",
            g.name,
            model[&g.name]
        );
        model.insert(g.name.clone(), (g.session, g.token));

        // FIFO: a hand-off goes to the first waiter that is still alive; a fresh
        // grant only to the acquirer of a free lock.
        match pre.get(&g.name) {
            Some(before) => {
                let first = before
                    .waiters
                    .iter()
                    .copied()
                    .find(|w| post.session(*w).is_some());
                prop_assert_eq!(Some(g.session), first, "grant out of FIFO order");
            }
            None => {
                let by_acquirer =
                    matches!(cmd, Command::Acquire { session, .. } if *session == g.session);
                prop_assert!(by_acquirer, "free lock granted by {:?}", cmd);
            }
        }
    }
    if !applied.grants.is_empty() {
        *max_token = index;
    }
    prop_assert_eq!(
        &holders(post),
        model,
        "holders changed without a grant or release"
    );

    // Queue order: survivors keep their relative order; newcomers only at the back.
    for lock in NAMES {
        let before = pre.get(lock).map(|v| v.waiters).unwrap_or_default();
        let after = post.get(lock).map(|v| v.waiters).unwrap_or_default();
        let kept: Vec<SessionId> = before
            .iter()
            .copied()
            .filter(|w| after.contains(w))
            .collect();
        prop_assert_eq!(
            &after[..kept.len()],
            &kept[..],
            "queue of {} reordered",
            lock
        );
        for w in &after[kept.len()..] {
            prop_assert!(!before.contains(w), "queue of {} reordered", lock);
        }
        // Lock-delay starts only on expiry and ends only on EndLockDelay.
        let was = pre.get(lock).is_some_and(|v| v.in_lock_delay);
        let is = post.get(lock).is_some_and(|v| v.in_lock_delay);
        if !was && is {
            let expiry = matches!(
                cmd,
                Command::ExpireSession { .. } | Command::ExpireInBatch { .. }
            );
            prop_assert!(expiry, "lock-delay started by {:?}", cmd);
        }
        if was && !is {
            let ended = matches!(cmd, Command::EndLockDelay { name, .. } if name == lock);
            prop_assert!(ended, "lock-delay ended by {:?}", cmd);
        }
    }
    Ok(())
}

proptest! {
    // Failures are kept beside this file (proptests.regressions), inside the
    // module that owns them.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_histories_keep_every_invariant(
        steps in prop::collection::vec((op(), 1..=3u64), 1..120),
        cut in any::<Index>(),
    ) {
        let cut = cut.index(steps.len());
        let mut a = LockMachine::new();
        let mut b = LockMachine::new();
        let mut ids = Vec::new();
        let mut model = BTreeMap::new();
        let mut max_token = 0;
        let mut index = 0;
        for (i, (op, gap)) in steps.iter().enumerate() {
            if i == cut {
                b = LockMachine::from_snapshot_bytes(&b.to_snapshot_bytes()).unwrap();
                prop_assert_eq!(&a, &b);
            }
            index += gap;
            let cmd = command(op, &ids, &a);
            let pre = a.clone();
            let applied = a.apply(index, cmd.clone());
            if let Ok(Reply::SessionCreated { session }) = applied.outcome {
                ids.push(session);
            }
            check_step(&pre, &a, &cmd, &applied, &mut model, &mut max_token)?;
            let twin = b.apply(index, cmd);
            prop_assert_eq!(&twin, &applied, "replicas answered differently");
            prop_assert_eq!(&a, &b, "replicas diverged");
        }
        prop_assert_eq!(a.to_snapshot_bytes(), b.to_snapshot_bytes());
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// Entries of several commands, as the proposer builds them — lock commands
    /// share entries even on one lock — including releases that guess the token
    /// their own entry will grant: every entry grants each lock at most once,
    /// tokens only grow, holders change only by grants, releases and session ends,
    /// and a replica restored from a snapshot midway answers the same.
    #[test]
    fn entries_of_many_commands_grant_each_lock_at_most_once(
        entries in prop::collection::vec(
            (prop::collection::vec((op(), prop::bool::weighted(0.2)), 1..6), 1..=3u64),
            1..60,
        ),
        cut in any::<Index>(),
    ) {
        let cut = cut.index(entries.len());
        let mut a = LockMachine::new();
        let mut b = LockMachine::new();
        let mut ids = Vec::new();
        let mut model = BTreeMap::new();
        let mut max_token = 0;
        let mut index = 0;
        for (i, (ops, gap)) in entries.iter().enumerate() {
            if i == cut {
                b = LockMachine::from_snapshot_bytes(&b.to_snapshot_bytes()).unwrap();
                prop_assert_eq!(&a, &b);
            }
            index += gap;
            let cmds: Vec<Command> = ops
                .iter()
                .map(|(op, guess)| {
                    let mut cmd = command(op, &ids, &a);
                    if let (true, Command::Release { token, .. }) = (*guess, &mut cmd) {
                        *token = tok(index);
                    }
                    cmd
                })
                .collect();
            let applied = a.apply_batch(index, cmds.clone());
            a.check_invariants()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(a.last_applied(), index);
            let mut granted = Vec::new();
            for (cmd, ap) in cmds.iter().zip(&applied) {
                match (cmd, &ap.outcome) {
                    (Command::Release { name, .. }, Ok(Reply::Released { retried: false })) => {
                        prop_assert!(model.remove(name).is_some());
                    }
                    (_, Ok(Reply::SessionEnded { released, .. })) => {
                        for name in released {
                            prop_assert!(model.remove(name).is_some());
                        }
                    }
                    (_, Ok(Reply::SessionCreated { session })) => ids.push(*session),
                    _ => {}
                }
                for g in &ap.grants {
                    prop_assert_eq!(g.token.get(), index);
                    prop_assert!(g.token.get() > max_token, "token {} not increasing", g.token);
                    prop_assert!(
                        !granted.contains(&g.name),
                        "entry {} granted {} twice",
                        index,
                        g.name
                    );
                    granted.push(g.name.clone());
                    prop_assert!(!model.contains_key(&g.name), "{} granted while held", g.name);
                    model.insert(g.name.clone(), (g.session, g.token));
                }
            }
            if !granted.is_empty() {
                max_token = index;
            }
            prop_assert_eq!(&holders(&a), &model, "holders changed without a grant or release");
            let twin = b.apply_batch(index, cmds);
            prop_assert_eq!(&twin, &applied, "replicas answered differently");
            prop_assert_eq!(&a, &b, "replicas diverged");
        }
    }
}
