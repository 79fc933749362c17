//! Property tests of the fences: sequential model checks, and concurrent
//! interleavings checked for linearizability of check-and-advance.

mod common;

use std::collections::BTreeMap;
use std::sync::Barrier;

use common::{Event, Outcome, check_history, t};
use palisade_fence::{DurableFence, Fence, FenceError, TokenFence};
use proptest::prelude::*;

const RESOURCES: [&str; 3] = ["file", "accounts/7", "ünï"];

fn admit_event(fence: &impl TokenFence, resource: usize, token: u64) -> Event {
    let token = t(token);
    let outcome = match fence.admit(RESOURCES[resource], token) {
        Ok(a) => {
            assert_eq!(a.token, token);
            Outcome::Accepted(a.previous)
        }
        Err(FenceError::StaleToken { presented, highest }) => {
            assert_eq!(presented, token);
            Outcome::Stale(highest)
        }
        Err(e) => panic!("unexpected error: {e}"),
    };
    Event {
        resource,
        token,
        outcome,
    }
}

/// Runs each thread's plan at once (after a barrier) and returns all events.
fn run_concurrently<F: TokenFence + Sync>(fence: &F, plans: &[Vec<(usize, u64)>]) -> Vec<Event> {
    let barrier = Barrier::new(plans.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .iter()
            .map(|plan| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    plan.iter()
                        .map(|&(r, tok)| admit_event(fence, r, tok))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

fn finals(fence: &impl TokenFence) -> BTreeMap<usize, Option<palisade_core::FencingToken>> {
    (0..RESOURCES.len())
        .map(|r| (r, fence.highest(RESOURCES[r]).unwrap()))
        .collect()
}

/// The model: a map from resource to highest token; compare every answer.
fn model_check(fence: &impl TokenFence, ops: &[(usize, u64)], model: &mut BTreeMap<usize, u64>) {
    for &(r, tok) in ops {
        let e = admit_event(fence, r, tok);
        let highest = model.get(&r).copied();
        match highest {
            Some(h) if h > tok => assert_eq!(e.outcome, Outcome::Stale(t(h)), "{r} {tok}"),
            _ => {
                assert_eq!(e.outcome, Outcome::Accepted(highest.map(t)), "{r} {tok}");
                model.insert(r, tok);
            }
        }
    }
    for (r, h) in finals(fence) {
        assert_eq!(h, model.get(&r).copied().map(t));
    }
}

fn ops(max_len: usize) -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((0..RESOURCES.len(), 1..=12u64), 0..max_len)
}

fn plans(
    threads: std::ops::Range<usize>,
    per_thread: usize,
) -> impl Strategy<Value = Vec<Vec<(usize, u64)>>> {
    prop::collection::vec(
        prop::collection::vec((0..RESOURCES.len(), 1..=40u64), 1..per_thread),
        threads,
    )
}

proptest! {
    #[test]
    fn fence_matches_the_model(ops in ops(60)) {
        model_check(&Fence::new(), &ops, &mut BTreeMap::new());
    }

    #[test]
    fn concurrent_admits_never_go_backwards(plans in plans(2..6, 40)) {
        let fence = Fence::new();
        let events = run_concurrently(&fence, &plans);
        if let Err(e) = check_history(&events, &finals(&fence)) {
            prop_assert!(false, "{e}\nevents: {events:?}");
        }
    }
}

proptest! {
    // Every durable admit is an fsync: fewer, shorter cases.
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn durable_fence_matches_the_model_across_reopens(ops in ops(24), split in 0usize..24) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.redb");
        let split = split.min(ops.len());
        let mut model = BTreeMap::new();
        model_check(&DurableFence::open(&path).unwrap(), &ops[..split], &mut model);
        // A reopen must find exactly the state the model predicts.
        model_check(&DurableFence::open(&path).unwrap(), &ops[split..], &mut model);
    }

    #[test]
    fn concurrent_durable_admits_never_go_backwards(plans in plans(2..4, 10)) {
        let dir = tempfile::tempdir().unwrap();
        let fence = DurableFence::open(dir.path().join("fence.redb")).unwrap();
        let events = run_concurrently(&fence, &plans);
        if let Err(e) = check_history(&events, &finals(&fence)) {
            prop_assert!(false, "{e}\nevents: {events:?}");
        }
    }
}

/// The checker itself must catch the bugs it exists for.
#[test]
fn the_checker_catches_a_check_then_set_race() {
    let acc = |tok, prev: Option<u64>| Event {
        resource: 0,
        token: t(tok),
        outcome: Outcome::Accepted(prev.map(t)),
    };
    let finals = |h| BTreeMap::from([(0, Some(t(h)))]);
    // 35 and 36 both read 34; 35 wrote last. Each answer alone looks fine.
    let racy = [acc(34, None), acc(36, Some(34)), acc(35, Some(34))];
    assert!(check_history(&racy, &finals(35)).is_err());
    // 33 accepted after 34.
    let backwards = [acc(34, None), acc(33, Some(34))];
    assert!(check_history(&backwards, &finals(34)).is_err());
    // A rejection citing a token nobody presented.
    let invented = [
        acc(5, None),
        Event {
            resource: 0,
            token: t(4),
            outcome: Outcome::Stale(t(9)),
        },
    ];
    assert!(check_history(&invented, &finals(5)).is_err());
    let fine = [acc(34, None), acc(34, Some(34)), acc(35, Some(34))];
    assert!(check_history(&fine, &finals(35)).is_ok());
}

#[test]
fn a_racy_fence_is_caught_by_the_concurrent_property() {
    // A check-then-set fence (the bug the real one avoids) must fail the same
    // check under real threads; it proves the property test has teeth.
    #[derive(Default)]
    struct Racy(std::sync::Mutex<BTreeMap<String, palisade_core::FencingToken>>);
    impl TokenFence for Racy {
        fn admit(
            &self,
            resource: &str,
            token: palisade_core::FencingToken,
        ) -> Result<palisade_fence::Admitted, FenceError> {
            let previous = self.0.lock().unwrap().get(resource).copied();
            if let Some(highest) = previous.filter(|&h| h > token) {
                return Err(FenceError::StaleToken {
                    presented: token,
                    highest,
                });
            }
            std::thread::yield_now();
            self.0.lock().unwrap().insert(resource.to_owned(), token);
            Ok(palisade_fence::Admitted { token, previous })
        }
        fn highest(
            &self,
            resource: &str,
        ) -> Result<Option<palisade_core::FencingToken>, FenceError> {
            Ok(self.0.lock().unwrap().get(resource).copied())
        }
    }
    let plans: Vec<Vec<(usize, u64)>> = (0..4u64)
        .map(|i| (1..=200u64).map(|k| (0, k * 4 + i)).collect())
        .collect();
    let caught = (0..20).any(|_| {
        let fence = Racy::default();
        let events = run_concurrently(&fence, &plans);
        check_history(&events, &finals(&fence)).is_err()
    });
    assert!(caught, "the checker never noticed a racy fence");
}
