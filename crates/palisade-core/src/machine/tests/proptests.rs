//! Random command sequences over a few sessions and locks, checked against
//! invariants that hold whatever the sequence, and against a twin replica that is
//! snapshotted and restored midway.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;

use super::*;

/// A mutex, a semaphore of two, a read/write lock and an election.
const NAMES: [&str; 4] = ["a", "b", "c", "d"];

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
        /// Which claim on the name: mostly one that fits its shape (for the
        /// read/write lock, a read or a write), sometimes one that does not.
        kind: u8,
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
        8 => (who.clone(), lock.clone(), any::<bool>(), any::<bool>(), 0..10u8)
            .prop_map(|(who, lock, wait, delay, kind)| Op::Acquire { who, lock, wait, delay, kind }),
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

/// The claim an [`Op::Acquire`] makes on `name`.
fn claim_on(name: &str, kind: u8) -> Claim {
    let fitting = match name {
        "b" => Claim::Permit { permits: 2 },
        "c" if kind.is_multiple_of(2) => Claim::Read,
        "c" => Claim::Write,
        "d" => Claim::Lead {
            value: format!("v{kind}"),
        },
        _ => Claim::Lock,
    };
    match kind {
        // One in ten does not fit: another shape, or another permit count.
        9 if name == "b" => Claim::Permit { permits: 3 },
        9 => Claim::Permit { permits: 2 },
        _ => fitting,
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
            kind,
        } => {
            let name = lock_name(lock);
            let claim = claim_on(&name, kind);
            // Shared claims mostly ask no lock-delay (the refusal is tested
            // once in a while).
            let delay = delay && (claim.mode() == Mode::Exclusive || kind == 0);
            let lock_delay_ms = if delay { 1_000 } else { 0 };
            if claim == Claim::Lock {
                Command::Acquire {
                    session: pick(who),
                    name,
                    wait,
                    lock_delay_ms,
                }
            } else {
                Command::Claim {
                    session: pick(who),
                    name,
                    claim,
                    wait,
                    lock_delay_ms,
                }
            }
        }
        Op::Release {
            who,
            lock,
            current,
            raw,
        } => {
            let name = lock_name(lock);
            let session = pick(who);
            let held = m
                .get(&name)
                .and_then(|v| v.holders.into_iter().find(|h| h.session == session))
                .map(|h| h.token);
            let token = match held {
                Some(t) if current => t,
                _ => tok(raw % (m.last_applied() + 2) + 1),
            };
            Command::Release {
                session,
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

/// Who holds each name, with which token: what the outputs say, replayed.
type Model = BTreeMap<String, BTreeMap<SessionId, FencingToken>>;

fn holders(m: &LockMachine) -> Model {
    m.list()
        .into_iter()
        .filter(|v| !v.holders.is_empty())
        .map(|v| {
            let held = v.holders.iter().map(|h| (h.session, h.token)).collect();
            (v.name, held)
        })
        .collect()
}

/// Exclusion, from each name's shape rather than the machine's own
/// bookkeeping: one holder of a mutex and of an election, `permits` of a
/// semaphore, a writer alone.
fn check_exclusion(m: &LockMachine) -> Result<(), TestCaseError> {
    for v in m.list() {
        let writers = v
            .holders
            .iter()
            .filter(|h| h.mode == Mode::Exclusive)
            .count();
        let most = match v.shape {
            Shape::Semaphore { permits } => permits as usize,
            Shape::ReadWrite if writers == 0 => usize::MAX,
            _ => 1,
        };
        prop_assert!(
            v.holders.len() <= most,
            "{} has {} holders",
            v.name,
            v.holders.len()
        );
    }
    Ok(())
}

/// Replays on the model what one command's answer says was given back.
fn replay_releases(cmd: &Command, reply: &Reply, model: &mut Model) -> Result<(), TestCaseError> {
    let mut drop = |name: &str, session: SessionId| -> Result<(), TestCaseError> {
        let held = model.get_mut(name);
        prop_assert!(
            held.is_some_and(|h| h.remove(&session).is_some()),
            "{} gave back {} it did not hold",
            session,
            name
        );
        if model[name].is_empty() {
            model.remove(name);
        }
        Ok(())
    };
    match (cmd, reply) {
        (Command::Release { name, session, .. }, Reply::Released { retried: false }) => {
            drop(name, *session)?;
        }
        (
            _,
            Reply::SessionEnded {
                released, session, ..
            },
        ) => {
            for name in released {
                drop(name, *session)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Checks one grant against the model and records it: a session is granted a
/// name it does not hold, the token is the entry's index, above every grant of
/// earlier entries.
fn record_grant(
    g: &Grant,
    index: u64,
    max_token: u64,
    model: &mut Model,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(g.token.get(), index);
    prop_assert!(
        g.token.get() > max_token,
        "token {} not increasing",
        g.token
    );
    let held = model.entry(g.name.clone()).or_default();
    prop_assert!(
        held.insert(g.session, g.token).is_none(),
        "{} granted {} it already held",
        g.session,
        g.name
    );
    Ok(())
}

/// The session that gave up waiting for `lock`, if `cmd` is that.
fn cancelled(cmd: &Command, lock: &str) -> Option<SessionId> {
    match cmd {
        Command::CancelWait { session, name } if name == lock => Some(*session),
        _ => None,
    }
}

/// The session a command acts for, if any.
fn actor(cmd: &Command) -> Option<SessionId> {
    match cmd {
        Command::Acquire { session, .. } | Command::Claim { session, .. } => Some(*session),
        _ => None,
    }
}

/// Everything that must hold after one step, given the state before it.
fn check_step(
    pre: &LockMachine,
    post: &LockMachine,
    cmd: &Command,
    applied: &Applied,
    model: &mut Model,
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
    if let Command::Acquire { session, name, .. } | Command::Claim { session, name, .. } = cmd
        && let Some(h) = pre
            .get(name)
            .and_then(|v| v.holders.into_iter().find(|h| h.session == *session))
    {
        prop_assert_eq!(
            reply,
            &Reply::Acquired {
                token: h.token,
                reacquired: true,
                slot: h.slot,
            }
        );
        prop_assert!(applied.grants.is_empty());
    }

    replay_releases(cmd, reply, model)?;
    for g in &applied.grants {
        record_grant(g, index, *max_token, model)?;
    }
    if !applied.grants.is_empty() {
        *max_token = index;
    }
    prop_assert_eq!(
        &holders(post),
        model,
        "holders changed without a grant or release"
    );
    check_exclusion(post)?;

    // FIFO: the waiters granted are the front of the queue as it was (those
    // still alive, in order); anyone else granted is the claimer itself.
    for lock in NAMES {
        let to_lock: Vec<SessionId> = applied
            .grants
            .iter()
            .filter(|g| g.name == lock)
            .map(|g| g.session)
            .collect();
        let before = pre.get(lock).map(|v| v.waiters).unwrap_or_default();
        let (from_queue, fresh): (Vec<SessionId>, Vec<SessionId>) =
            to_lock.iter().partition(|s| before.contains(s));
        let alive: Vec<SessionId> = before
            .iter()
            .copied()
            .filter(|w| post.session(*w).is_some() && Some(*w) != cancelled(cmd, lock))
            .collect();
        prop_assert_eq!(
            &from_queue[..],
            &alive[..from_queue.len()],
            "{} granted out of FIFO order",
            lock
        );
        prop_assert!(
            fresh.len() <= 1 && fresh.iter().all(|s| Some(*s) == actor(cmd)),
            "{} granted to {:?} by {:?}",
            lock,
            fresh,
            cmd
        );
    }

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
                match &ap.outcome {
                    Ok(Reply::SessionCreated { session }) => ids.push(*session),
                    Ok(reply) => replay_releases(cmd, reply, &mut model)?,
                    Err(_) => {}
                }
                for g in &ap.grants {
                    record_grant(g, index, max_token, &mut model)?;
                    granted.push(g.clone());
                }
            }
            // No hold this entry granted also ended in it: so two holders that
            // share the entry's token held at once (readers, permits in
            // different slots), and an exclusive name was granted once.
            let now = holders(&a);
            for g in &granted {
                let kept = now.get(&g.name).and_then(|h| h.get(&g.session));
                prop_assert_eq!(kept, Some(&g.token), "entry {} granted {} twice", index, g.name);
            }
            if !granted.is_empty() {
                max_token = index;
            }
            prop_assert_eq!(&holders(&a), &model, "holders changed without a grant or release");
            check_exclusion(&a)?;
            let twin = b.apply_batch(index, cmds);
            prop_assert_eq!(&twin, &applied, "replicas answered differently");
            prop_assert_eq!(&a, &b, "replicas diverged");
        }
    }
}
