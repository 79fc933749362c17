//! A checker for histories of concurrent admits, shared by the test files.

use std::collections::BTreeMap;

use palisade_core::FencingToken;

/// What one admit returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted; the highest token before it.
    Accepted(Option<FencingToken>),
    /// Rejected as stale; the highest token reported.
    Stale(FencingToken),
}

/// One admit of a history: which resource, which token, what came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Resource index.
    pub resource: usize,
    /// Token presented.
    pub token: FencingToken,
    /// The answer.
    pub outcome: Outcome,
}

pub fn t(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

/// Checks that a history of admits (in any order: threads' logs concatenated) is
/// explained by some sequence of atomic check-and-advance steps. For each resource:
/// no accepted token is lower than the highest before it; the "previous" values of
/// the accepted admits are exactly the chain `None, a1, …, a(n-1)` of the sorted
/// accepted tokens (so no two admits read the same highest unless their tokens
/// allow it — a check-then-set race breaks the chain); every rejection reports a
/// higher token that was itself accepted; and `finals` holds the highest accepted.
pub fn check_history(
    events: &[Event],
    finals: &BTreeMap<usize, Option<FencingToken>>,
) -> Result<(), String> {
    let mut resources: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for e in events {
        resources.entry(e.resource).or_default().push(e);
    }
    for (r, evs) in &resources {
        let mut accepted = Vec::new();
        let mut previous = Vec::new();
        for e in evs {
            if let Outcome::Accepted(p) = e.outcome {
                if p.is_some_and(|p| p > e.token) {
                    return Err(format!("resource {r}: accepted {} after {:?}", e.token, p));
                }
                accepted.push(e.token);
                previous.push(p);
            }
        }
        accepted.sort();
        previous.sort();
        let mut chain = vec![None];
        chain.extend(accepted.iter().copied().map(Some));
        chain.pop();
        if !accepted.is_empty() && previous != chain {
            return Err(format!(
                "resource {r}: accepted {accepted:?} saw previous {previous:?}, not a chain"
            ));
        }
        for e in evs {
            if let Outcome::Stale(h) = e.outcome
                && (h <= e.token || !accepted.contains(&h))
            {
                return Err(format!("resource {r}: {} rejected citing {h}", e.token));
            }
        }
        let want = accepted.last().copied();
        let got = finals.get(r).copied().flatten();
        if got != want {
            return Err(format!(
                "resource {r}: final highest {got:?}, expected {want:?}"
            ));
        }
    }
    Ok(())
}

/// The lock service's answers as the adapters' verified writes see them: one
/// lock, `jobs/nightly`, whose current grant is `current`, with tokens issued
/// up to `issued`. (The real cluster behind `palisade_client::Admin` is
/// exercised by `palisade-cli`'s `tests/security.rs`.)
#[allow(dead_code)]
pub struct OneGrant {
    pub current: u64,
    pub issued: u64,
}

impl palisade_fence::verify::TokenIssuer for OneGrant {
    fn token_status<'a>(
        &'a self,
        lock: &'a str,
        token: palisade_core::FencingToken,
    ) -> palisade_fence::verify::BoxFuture<'a, Result<palisade_fence::verify::IssuerAnswer, String>>
    {
        let current = (lock == "jobs/nightly")
            .then_some(self.current)
            .and_then(palisade_core::FencingToken::new);
        let answer = palisade_fence::verify::IssuerAnswer {
            current: current == Some(token),
            current_token: current,
            issued_through: self.issued,
        };
        Box::pin(async move { Ok(answer) })
    }
}
