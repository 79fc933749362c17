//! What the simulated clients do: take a lock, work under it, write to a
//! fenced resource, release — over and over, each drawing its choices from its
//! own seed, until the run's end.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use palisade_chaos::{EventKind, Holding};
use palisade_client::{AcquireOptions, Claim, Client, ClientConfig, ClientError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{Recorder, sim_now_us};

/// Every client's session lease.
pub const SESSION_TTL: Duration = Duration::from_secs(2);

/// The recipes' names, beside the plain locks: a semaphore of
/// [`SEMAPHORE_PERMITS`], a read/write lock, an election.
pub const SEMAPHORE: &str = "sem-0";
/// See [`SEMAPHORE`].
pub const READ_WRITE: &str = "rw-0";
/// See [`SEMAPHORE`].
pub const ELECTION: &str = "leader-0";
/// The semaphore's size: fewer than the default four clients, so they contend.
pub const SEMAPHORE_PERMITS: u32 = 2;

/// One client's part in a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its number (1, 2, …), as in the history.
    pub client: u32,
    /// The nodes' client addresses.
    pub endpoints: Vec<String>,
    /// It contends for `lock-0` … `lock-{locks-1}`.
    pub locks: usize,
    /// Whether it also claims the recipes ([`SEMAPHORE`], [`READ_WRITE`],
    /// [`ELECTION`]): then each acquire is one of the four shapes, equally
    /// likely.
    pub recipes: bool,
    /// Its own random choices follow from it.
    pub seed: u64,
    /// It starts no new acquire after this (simulated µs).
    pub end_us: u64,
    /// Whether it sometimes stops looking at its guard past its lease (a
    /// process pause between the check and the write, as in the source
    /// documents): its late write must then be refused by the fence.
    pub pauses: bool,
}

/// The resource the clients write to: per lock (per slot of the semaphore),
/// a counter guarded by the highest token it has accepted (what
/// `palisade_fence::Fence` does, kept in the simulation so that its decisions
/// land in the history in order).
#[derive(Debug, Clone, Default)]
pub struct Fence {
    state: Rc<RefCell<BTreeMap<String, Resource>>>,
}

impl Fence {
    /// A write of `value + 1` under `token`: accepted unless a higher token
    /// was already accepted, by a write or a read. Returns `(accepted, read,
    /// wrote)`.
    fn write(&self, resource: &str, token: u64) -> (bool, i64, i64) {
        let mut state = self.state.borrow_mut();
        let r = state.entry(resource.to_owned()).or_default();
        let read = r.value;
        if token < r.written.max(r.read) {
            return (false, read, read + 1);
        }
        r.written = token;
        r.value += 1;
        (true, read, read + 1)
    }

    /// A read under `token`: answered unless a write under a higher token
    /// was accepted (the reader was overtaken by a writer).
    fn read(&self, resource: &str, token: u64) -> bool {
        let mut state = self.state.borrow_mut();
        let r = state.entry(resource.to_owned()).or_default();
        if token < r.written {
            return false;
        }
        r.read = r.read.max(token);
        true
    }
}

/// One fenced resource: the highest tokens it accepted, and its counter.
#[derive(Debug, Clone, Copy, Default)]
struct Resource {
    written: u64,
    read: u64,
    value: i64,
}

/// What a client claims next, drawn from its seed: the name, and the claim.
fn next_claim(plan: &Plan, rng: &mut SmallRng) -> (String, Claim) {
    match if plan.recipes {
        rng.random_range(0..4)
    } else {
        0
    } {
        1 => (
            SEMAPHORE.into(),
            Claim::Permit {
                permits: SEMAPHORE_PERMITS,
            },
        ),
        2 if rng.random_bool(0.3) => (READ_WRITE.into(), Claim::Write),
        2 => (READ_WRITE.into(), Claim::Read),
        3 => (
            ELECTION.into(),
            Claim::Lead {
                value: format!("c{}", plan.client),
            },
        ),
        _ => (
            format!("lock-{}", rng.random_range(0..plan.locks)),
            Claim::Lock,
        ),
    }
}

fn config(plan: &Plan) -> ClientConfig {
    let mut config = ClientConfig::new(plan.endpoints.clone());
    config.session_ttl = SESSION_TTL;
    config.rpc_timeout = Duration::from_millis(1000);
    config.retry_for = Duration::from_secs(4);
    config.label = format!("c{}", plan.client);
    config.dialer = Some(Arc::new(crate::net::SimNet));
    config
}

/// The client's loop; ends once simulated time passes `plan.end_us`.
pub async fn run(plan: Plan, rec: Recorder, fence: Fence) -> turmoil::Result {
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let id = plan.client;
    let mut client: Option<Client> = None;
    while sim_now_us() < plan.end_us {
        let c = match &client {
            Some(c) => c,
            None => match Client::connect(config(&plan)).await {
                Ok(c) => client.insert(c),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let (lock, claim) = next_claim(&plan, &mut rng);
        rec.record(id, EventKind::AcquireInvoke { lock: lock.clone() });
        let options = AcquireOptions {
            wait: Duration::from_millis(rng.random_range(0..2_000)),
            claim: claim.clone(),
            ..AcquireOptions::default()
        };
        match c.acquire(&lock, &options).await {
            Ok(guard) => {
                let token = guard.token().get();
                let guaranteed = |guard: &palisade_client::FencedGuard| {
                    sim_now_us() + guard.remaining().as_micros() as u64
                };
                let valid_until_us = guaranteed(&guard);
                let grant = rec.record(
                    id,
                    EventKind::AcquireOk {
                        lock: lock.clone(),
                        token: Some(token),
                        valid_until_us: Some(valid_until_us),
                        holding: Holding::of(&claim, guard.slot()),
                    },
                );
                let paused = plan.pauses && rng.random_bool(0.1);
                let lost = guard.lost();
                if paused {
                    // Past the lease without looking: the guard cannot warn.
                    tokio::time::sleep(SESSION_TTL * 2).await;
                } else {
                    // Mostly short; one in five long enough to span an election.
                    let work = if rng.random_bool(0.2) {
                        Duration::from_millis(rng.random_range(300..1_500))
                    } else {
                        Duration::from_millis(rng.random_range(0..300))
                    };
                    tokio::select! {
                        () = tokio::time::sleep(work) => {}
                        () = lost => {}
                    }
                }
                let believed = paused || guard.remaining() > Duration::ZERO;
                if !believed {
                    rec.record(id, EventKind::LeaseLost { lock: lock.clone() });
                } else {
                    if !paused {
                        // What the client counts on as it writes.
                        rec.extend_guarantee(grant, guaranteed(&guard));
                    }
                    // Each permit guards a resource of its own (what a slot is
                    // for); a reader reads, everyone else writes.
                    let resource = match claim {
                        Claim::Permit { .. } => format!("{lock}/slot-{}", guard.slot()),
                        _ => lock.clone(),
                    };
                    let kind = if claim == Claim::Read {
                        EventKind::Read {
                            lock: lock.clone(),
                            accepted: fence.read(&resource, token),
                            resource,
                            token: Some(token),
                        }
                    } else {
                        let (accepted, read, wrote) = fence.write(&resource, token);
                        EventKind::Write {
                            lock: lock.clone(),
                            resource,
                            token: Some(token),
                            accepted,
                            read,
                            wrote,
                        }
                    };
                    rec.record(0, kind);
                }
                rec.record(id, EventKind::ReleaseInvoke { lock: lock.clone() });
                match guard.release().await {
                    Ok(()) => {
                        rec.record(id, EventKind::ReleaseOk { lock });
                    }
                    // Whether it still holds the lock is unknown: a retry with
                    // the same session would get the same grant back (an
                    // acquire of a lock the session holds returns its grant),
                    // which the history could not tell from a second grant.
                    // Start over with a new session, as an application would.
                    Err(_) => client = None,
                }
            }
            Err(ClientError::SessionExpired | ClientError::GrantTooLate) => {
                rec.record(id, EventKind::AcquireFail { lock });
                client = None;
            }
            Err(ClientError::Unavailable { .. }) => {
                rec.record(id, EventKind::AcquireUnknown { lock });
            }
            Err(_) => {
                rec.record(id, EventKind::AcquireFail { lock });
            }
        }
        if client.as_ref().is_some_and(|c| c.remaining().is_zero()) {
            // The session's guarantee is gone: a new session for the next round.
            client = None;
        }
    }
    if let Some(c) = client {
        let _ = tokio::time::timeout(Duration::from_secs(3), c.close()).await;
    }
    Ok(())
}
