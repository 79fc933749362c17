//! The conformance suite checked against a toy: an in-memory lock server with
//! sessions kept alive by a client task, FIFO queues, and a token counter that
//! survives its "crash". The healthy toy passes every property; each planted
//! bug fails exactly the property it breaks.
//!
//! The toy is also the smallest complete example of what a backend gives the
//! suite (`Fixture`) and of the client side of a lease (`Guarantee` measured
//! from when each keep-alive was sent).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_core::conformance::{self, Cut, Fixture, Opening, Property, Session};
use palisade_core::guarantee::Guarantee;
use palisade_core::lock::BoxFuture;
use palisade_core::{
    FencedLease, FencedLocks, FencingToken, GuaranteedLease, LockError, LockOptions,
};

/// A bug the toy can be built with.
const HEALTHY: u8 = 0;
/// Waiters are granted newest first.
const LIFO: u8 = 1;
/// The token counter is not durable: a crash starts it again at 1.
const VOLATILE_TOKENS: u8 = 2;

#[derive(Default)]
struct Lock {
    holder: Option<(u64, u64)>,
    waiting: VecDeque<u64>,
}

#[derive(Default)]
struct State {
    /// The last token handed out: on "disk", it survives a crash.
    last_token: u64,
    next_session: u64,
    /// Session → when the server lets it expire.
    sessions: HashMap<u64, Instant>,
    locks: HashMap<String, Lock>,
}

impl State {
    /// Drops expired sessions and everything they held or queued.
    fn reap(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.forget_session(id);
        }
    }

    fn forget_session(&mut self, id: u64) {
        self.sessions.remove(&id);
        for lock in self.locks.values_mut() {
            if lock.holder.is_some_and(|(s, _)| s == id) {
                lock.holder = None;
            }
            lock.waiting.retain(|s| *s != id);
        }
    }
}

/// The toy server: one mutex, polled by waiters.
struct Server<const BUG: u8> {
    state: Mutex<State>,
}

impl<const BUG: u8> Server<BUG> {
    fn unavailable() -> LockError {
        LockError::Unavailable {
            backend: "toy",
            detail: "cut off".into(),
            why: palisade_core::Unreachable::Unknown,
        }
    }

    fn open(&self, ttl: Duration) -> u64 {
        let mut state = self.state.lock().unwrap();
        state.next_session += 1;
        let id = state.next_session;
        state.sessions.insert(id, Instant::now() + ttl);
        id
    }

    fn renew(&self, id: u64, ttl: Duration) -> bool {
        let mut state = self.state.lock().unwrap();
        state.reap(Instant::now());
        match state.sessions.get_mut(&id) {
            Some(until) => {
                *until = Instant::now() + ttl;
                true
            }
            None => false,
        }
    }

    /// One look at the queue: granted, still waiting, or not allowed.
    fn try_take(&self, id: u64, name: &str, queue: bool) -> Result<Option<u64>, LockError> {
        let mut state = self.state.lock().unwrap();
        state.reap(Instant::now());
        if !state.sessions.contains_key(&id) {
            return Err(LockError::SessionExpired);
        }
        let State {
            last_token, locks, ..
        } = &mut *state;
        let lock = locks.entry(name.to_owned()).or_default();
        if !lock.waiting.contains(&id) {
            if BUG == LIFO {
                lock.waiting.push_front(id);
            } else {
                lock.waiting.push_back(id);
            }
        }
        if lock.holder.is_none() && lock.waiting.front() == Some(&id) {
            lock.waiting.pop_front();
            *last_token += 1;
            lock.holder = Some((id, *last_token));
            return Ok(Some(*last_token));
        }
        if !queue {
            lock.waiting.retain(|s| *s != id);
            return Err(LockError::WouldBlock);
        }
        Ok(None)
    }

    fn give_up(&self, id: u64, name: &str) {
        if let Some(lock) = self.state.lock().unwrap().locks.get_mut(name) {
            lock.waiting.retain(|s| *s != id);
        }
    }

    fn release(&self, id: u64, name: &str, token: u64) -> Result<(), LockError> {
        let mut state = self.state.lock().unwrap();
        match state.locks.get_mut(name) {
            Some(lock) if lock.holder == Some((id, token)) => {
                lock.holder = None;
                Ok(())
            }
            _ => Err(LockError::NotHolder(format!("{name} with token {token}"))),
        }
    }

    fn queued(&self, name: &str) -> usize {
        let mut state = self.state.lock().unwrap();
        state.reap(Instant::now());
        state
            .locks
            .get(name)
            .map_or(0, |l| usize::from(l.holder.is_some()) + l.waiting.len())
    }

    /// `kill -9`: everything in memory is gone; the token counter was on disk
    /// (unless it was not).
    fn crash(&self) {
        let mut state = self.state.lock().unwrap();
        let last_token = if BUG == VOLATILE_TOKENS {
            0
        } else {
            state.last_token
        };
        *state = State {
            last_token,
            next_session: state.next_session,
            ..State::default()
        };
    }
}

/// A client session on the toy server, kept alive by its own task.
struct ToySession<const BUG: u8> {
    server: Arc<Server<BUG>>,
    id: u64,
    guarantee: Guarantee,
    cut: Arc<AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
}

impl<const BUG: u8> ToySession<BUG> {
    fn open(
        server: Arc<Server<BUG>>,
        ttl: Duration,
        cut: Arc<AtomicBool>,
    ) -> Result<Self, LockError> {
        palisade_core::limits::validate_ttl(ttl)
            .map_err(|e| LockError::InvalidInput(e.to_string()))?;
        let sent = Instant::now();
        let id = server.open(ttl);
        let guarantee = Guarantee::new(sent, ttl);
        let keeper = tokio::spawn({
            let (server, guarantee, cut) = (server.clone(), guarantee.clone(), cut.clone());
            async move {
                loop {
                    tokio::time::sleep(ttl / 4).await;
                    if cut.load(Ordering::SeqCst) {
                        continue;
                    }
                    let sent = Instant::now();
                    if server.renew(id, ttl) {
                        guarantee.renewed(sent);
                    } else {
                        guarantee.end();
                        return;
                    }
                }
            }
        });
        Ok(ToySession {
            server,
            id,
            guarantee,
            cut,
            keeper,
        })
    }

    fn reachable(&self) -> Result<(), LockError> {
        if self.cut.load(Ordering::SeqCst) {
            Err(Server::<BUG>::unavailable())
        } else {
            Ok(())
        }
    }
}

impl<const BUG: u8> Drop for ToySession<BUG> {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

impl<const BUG: u8> FencedLocks for ToySession<BUG> {
    fn backend(&self) -> &'static str {
        "toy"
    }

    fn acquire<'a>(
        &'a self,
        name: &'a str,
        options: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Box<dyn FencedLease>, LockError>> {
        Box::pin(async move {
            palisade_core::limits::validate_name(name)
                .map_err(|e| LockError::InvalidInput(e.to_string()))?;
            options.plain_lock_only("toy")?;
            let deadline = Instant::now() + options.wait;
            loop {
                self.reachable()?;
                if let Some(token) = self
                    .server
                    .try_take(self.id, name, !options.wait.is_zero())?
                {
                    return Ok(Box::new(Lease {
                        server: self.server.clone(),
                        session: self.id,
                        name: name.to_owned(),
                        token: FencingToken::new(token).expect("tokens start at 1"),
                        guarantee: self.guarantee.clone(),
                    }) as Box<dyn FencedLease>);
                }
                if Instant::now() >= deadline {
                    self.server.give_up(self.id, name);
                    return Err(LockError::WaitTimeout);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }

    fn close(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            self.reachable()?;
            self.server.state.lock().unwrap().forget_session(self.id);
            Ok(())
        })
    }
}

#[derive(Clone)]
struct Lease<const BUG: u8> {
    server: Arc<Server<BUG>>,
    session: u64,
    name: String,
    token: FencingToken,
    guarantee: Guarantee,
}

impl<const BUG: u8> std::fmt::Debug for Lease<BUG> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} with token {}", self.name, self.token)
    }
}

impl<const BUG: u8> GuaranteedLease for Lease<BUG> {
    fn lock_name(&self) -> &str {
        &self.name
    }

    fn fencing_token(&self) -> FencingToken {
        self.token
    }

    fn guarantee(&self) -> &Guarantee {
        &self.guarantee
    }

    fn release_boxed(self: Box<Self>) -> BoxFuture<'static, Result<(), LockError>> {
        Box::pin(async move {
            self.server
                .release(self.session, &self.name, self.token.get())
        })
    }
}

/// The toy as the suite sees it: one server, whatever `replicated` asks.
struct Toy<const BUG: u8> {
    server: Arc<Server<BUG>>,
}

impl<const BUG: u8> Fixture for Toy<BUG> {
    fn start(_replicated: bool) -> Result<Self, String> {
        Ok(Toy {
            server: Arc::new(Server {
                state: Mutex::new(State::default()),
            }),
        })
    }

    fn session(&self, ttl: Duration) -> Opening<'_, Session> {
        Box::pin(async move {
            let session = ToySession::open(self.server.clone(), ttl, Arc::default())?;
            Ok(Box::new(session) as Box<dyn FencedLocks>)
        })
    }

    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)> {
        Box::pin(async move {
            let cut = Arc::new(AtomicBool::new(false));
            let session = ToySession::open(self.server.clone(), ttl, cut.clone())?;
            let healed = cut.clone();
            let sever = Cut::new(
                move || cut.store(true, Ordering::SeqCst),
                move || healed.store(false, Ordering::SeqCst),
            );
            Ok((Box::new(session) as Box<dyn FencedLocks>, sever))
        })
    }

    fn kill_and_restart(&mut self) -> Result<(), String> {
        self.server.crash();
        Ok(())
    }

    fn queued<'a>(&'a self, name: &'a str) -> Option<BoxFuture<'a, usize>> {
        Some(Box::pin(async move { self.server.queued(name) }))
    }
}

type Healthy = Toy<HEALTHY>;

palisade_core::conformance_suite!(Healthy);

/// Runs every property against `F`; returns those that failed.
fn failing<F: Fixture>() -> Vec<Property> {
    Property::ALL
        .into_iter()
        .filter(|p| std::panic::catch_unwind(|| conformance::run::<F>(*p)).is_err())
        .collect()
}

#[test]
fn a_planted_bug_fails_exactly_the_property_it_breaks() {
    assert_eq!(failing::<Toy<LIFO>>(), [Property::Handoff]);
    assert_eq!(
        failing::<Toy<VOLATILE_TOKENS>>(),
        [Property::TokensRiseAcrossKill9]
    );
}
