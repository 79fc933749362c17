//! What the simulated clients do: take a lock, work under it, write to a
//! fenced resource, release — over and over, each drawing its choices from its
//! own seed, until the run's end.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use palisade_chaos::EventKind;
use palisade_client::{AcquireOptions, Client, ClientConfig, ClientError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{Recorder, sim_now_us};

/// Every client's session lease.
pub const SESSION_TTL: Duration = Duration::from_secs(2);

/// One client's part in a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its number (1, 2, …), as in the history.
    pub client: u32,
    /// The nodes' client addresses.
    pub endpoints: Vec<String>,
    /// It contends for `lock-0` … `lock-{locks-1}`.
    pub locks: usize,
    /// Its own random choices follow from it.
    pub seed: u64,
    /// It starts no new acquire after this (simulated µs).
    pub end_us: u64,
    /// Whether it sometimes stops looking at its guard past its lease (a
    /// process pause between the check and the write, as in the source
    /// documents): its late write must then be refused by the fence.
    pub pauses: bool,
}

/// The resource the clients write to: per lock, a counter guarded by the
/// highest token it has accepted (what `palisade_fence::Fence` does, kept in
/// the simulation so that its decisions land in the history in order).
#[derive(Debug, Clone, Default)]
pub struct Fence {
    state: Rc<RefCell<BTreeMap<String, (u64, i64)>>>,
}

impl Fence {
    /// A write of `value + 1` under `token`: accepted unless a higher token
    /// was already accepted. Returns `(accepted, read, wrote)`.
    fn write(&self, lock: &str, token: u64) -> (bool, i64, i64) {
        let mut state = self.state.borrow_mut();
        let (highest, value) = state.entry(lock.to_owned()).or_insert((0, 0));
        let read = *value;
        if token < *highest {
            return (false, read, read + 1);
        }
        *highest = token;
        *value += 1;
        (true, read, read + 1)
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
        let lock = format!("lock-{}", rng.random_range(0..plan.locks));
        rec.record(id, EventKind::AcquireInvoke { lock: lock.clone() });
        let options = AcquireOptions {
            wait: Duration::from_millis(rng.random_range(0..2_000)),
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
                    let (accepted, read, wrote) = fence.write(&lock, token);
                    rec.record(
                        0,
                        EventKind::Write {
                            lock: lock.clone(),
                            resource: lock.clone(),
                            token: Some(token),
                            accepted,
                            read,
                            wrote,
                        },
                    );
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
            Err(ClientError::Unavailable(_)) => {
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
