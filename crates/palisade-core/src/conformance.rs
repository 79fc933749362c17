//! The lock contract every correctness backend keeps, as a test suite each
//! backend runs against its own real servers (feature `conformance`).
//!
//! A backend's tests implement [`Fixture`] — how to start its servers, open a
//! session, open one whose connections can be cut, kill every server with
//! `kill -9` and start them again — and call
//! [`conformance_suite!`](crate::conformance_suite). That expands to one
//! `#[test]` per [`Property`], so a run lists one line per property and a
//! backend that breaks one fails exactly that test:
//!
//! ```ignore
//! struct Etcd { cluster: EtcdCluster }
//! impl palisade_core::conformance::Fixture for Etcd { … }
//! palisade_core::conformance_suite!(Etcd);
//! ```
//!
//! No check depends on how fast the machine is: waits are generous bounds on
//! something that must happen, never a measure of how soon; order is
//! established by asking the backend what it has queued, not by sleeping.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::lock::BoxFuture;
use crate::{FencedLease, FencedLocks, FencingToken, LeaseState, LockError, LockOptions};

/// The session TTL of every property: short, so that what must expire does,
/// long enough that a loaded machine keeps what it holds.
pub const TTL: Duration = Duration::from_secs(2);

/// The bound on anything that must happen (a waiter granted, servers back
/// after a restart). Reaching it fails the property.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A session on the backend under test.
pub type Session = Box<dyn FencedLocks>;

/// A session being opened.
pub type Opening<'a, T> = BoxFuture<'a, Result<T, LockError>>;

/// A backend's servers, as the suite needs them. Blocking methods are called
/// from a blocking context; the futures run on a multi-threaded runtime.
pub trait Fixture: Sized + Send + Sync + 'static {
    /// Starts the backend's servers: `replicated` asks for its fault-tolerant
    /// shape (a 3-member cluster) where a property is about surviving
    /// failures; a single server otherwise.
    ///
    /// # Errors
    /// Why the servers could not be started.
    fn start(replicated: bool) -> Result<Self, String>;

    /// Opens a session whose locks outlive its silence by `ttl`.
    fn session(&self, ttl: Duration) -> Opening<'_, Session>;

    /// Opens a session whose every connection to the servers goes through
    /// something [`Cut`] can sever (the fault proxy).
    fn cuttable_session(&self, ttl: Duration) -> Opening<'_, (Session, Cut)>;

    /// Kills every server with `kill -9` and starts them again on their
    /// data.
    ///
    /// # Errors
    /// Why a server did not come back.
    fn kill_and_restart(&mut self) -> Result<(), String>;

    /// How many grants and waiters the lock `name` has queued, read around
    /// the client under test — or `None` if the backend does not grant
    /// waiters in arrival order (the handoff property then checks exclusion
    /// and tokens only).
    fn queued<'a>(&'a self, name: &'a str) -> Option<BoxFuture<'a, usize>>;
}

/// Severs a [`Fixture::cuttable_session`]'s connections and heals them; it
/// owns whatever carries them (the proxies), which live as long as it does.
pub struct Cut {
    sever: Box<dyn Fn() + Send + Sync>,
    heal: Box<dyn Fn() + Send + Sync>,
}

impl Cut {
    /// A cut that calls `sever` to cut and `heal` to heal.
    pub fn new(
        sever: impl Fn() + Send + Sync + 'static,
        heal: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Cut {
            sever: Box::new(sever),
            heal: Box::new(heal),
        }
    }

    /// Cuts the session off from every server.
    pub fn cut(&self) {
        (self.sever)();
    }

    /// Lets the session reach the servers again.
    pub fn heal(&self) {
        (self.heal)();
    }
}

/// One promise of the lock contract, tested on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Property {
    /// A grant is held with a live guarantee; while held, another session is
    /// refused at once (`WouldBlock`) or when its wait runs out
    /// (`WaitTimeout`).
    Exclusion,
    /// Every grant of a lock has a token above the previous grant's, whichever
    /// session takes it.
    TokensRise,
    /// Tokens keep rising across a `kill -9` of every server, also past a
    /// lock held at the crash.
    TokensRiseAcrossKill9,
    /// A holder cut off from the servers has lost its guarantee before
    /// anyone else is granted the lock, and is told so; its release, once it
    /// can reach the servers again, leaves the new holder holding.
    CutOffHolderLosesFirst,
    /// Several waiters are granted one at a time, each with a higher token,
    /// in arrival order where the backend promises it.
    Handoff,
    /// A waiter whose wait runs out leaves nothing behind that would hold
    /// the lock up.
    TimedOutWaiterLeavesNothing,
    /// Bad names and TTLs get `InvalidInput` and change nothing.
    BadInput,
    /// Closing a session releases what it holds.
    CloseReleases,
}

impl Property {
    /// Every property, in the order the suite lists them.
    pub const ALL: [Property; 8] = [
        Property::Exclusion,
        Property::TokensRise,
        Property::TokensRiseAcrossKill9,
        Property::CutOffHolderLosesFirst,
        Property::Handoff,
        Property::TimedOutWaiterLeavesNothing,
        Property::BadInput,
        Property::CloseReleases,
    ];

    /// Whether the property needs the backend's replicated shape.
    pub fn replicated(self) -> bool {
        matches!(
            self,
            Property::TokensRiseAcrossKill9 | Property::CutOffHolderLosesFirst
        )
    }
}

/// Starts `F`'s servers and checks `property` against them on a fresh
/// runtime; panics (fails the test) with what broke.
pub fn run<F: Fixture>(property: Property) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut fixture = F::start(property.replicated())
        .unwrap_or_else(|e| panic!("{property:?}: the servers did not start: {e}"));
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(check(&mut fixture, property));
    }));
    // Sessions and their background tasks go before the servers do.
    drop(runtime);
    drop(fixture);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn check<F: Fixture>(fixture: &mut F, property: Property) {
    match property {
        Property::Exclusion => exclusion(fixture).await,
        Property::TokensRise => tokens_rise(fixture).await,
        Property::TokensRiseAcrossKill9 => tokens_rise_across_kill9(fixture).await,
        Property::CutOffHolderLosesFirst => cut_off_holder_loses_first(fixture).await,
        Property::Handoff => handoff(fixture).await,
        Property::TimedOutWaiterLeavesNothing => timed_out_waiter_leaves_nothing(fixture).await,
        Property::BadInput => bad_input(fixture).await,
        Property::CloseReleases => close_releases(fixture).await,
    }
}

fn now_or_never() -> LockOptions {
    LockOptions::default()
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions {
        wait,
        ..LockOptions::default()
    }
}

/// A session, retried while the servers do not answer yet (a JVM that has
/// just started, a cluster electing).
async fn session<F: Fixture>(fixture: &F) -> Box<dyn FencedLocks> {
    let give_up = Instant::now() + PATIENCE;
    loop {
        match fixture.session(TTL).await {
            Ok(session) => return session,
            Err(e) if transient(&e) && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no session: {e}"),
        }
    }
}

/// `name` on `locks`, waiting for it and retrying while the servers do not
/// answer yet.
async fn acquire(locks: &dyn FencedLocks, name: &str) -> Box<dyn FencedLease> {
    let give_up = Instant::now() + PATIENCE;
    loop {
        match locks.acquire(name, &waiting(PATIENCE)).await {
            Ok(lease) => return lease,
            Err(e) if transient(&e) && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{name}: not granted: {e}"),
        }
    }
}

/// The servers did not answer, or answered too late: the same call may
/// succeed once they do.
fn transient(e: &LockError) -> bool {
    matches!(e, LockError::Unavailable { .. } | LockError::GrantTooLate)
}

/// Whether the fixture promises arrival order (and can show its queue).
fn keeps_order<F: Fixture>(fixture: &F) -> bool {
    fixture.queued("conformance/order").is_some()
}

async fn exclusion<F: Fixture>(fixture: &mut F) {
    let (a, b) = (session(fixture).await, session(fixture).await);
    let held = acquire(a.as_ref(), "conformance/x").await;
    assert_eq!(held.name(), "conformance/x");
    assert_eq!(held.state(), LeaseState::Held);
    assert!(!held.remaining().is_zero(), "granted without a guarantee");
    let e = b
        .acquire("conformance/x", &now_or_never())
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WouldBlock, "a held lock granted again");
    let e = b
        .acquire("conformance/x", &waiting(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WaitTimeout, "a held lock granted again");
    // Kept alive past several TTLs: still held, still exclusive.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(held.state(), LeaseState::Held, "lost while kept alive");
    let e = b
        .acquire("conformance/x", &now_or_never())
        .await
        .unwrap_err();
    assert_eq!(
        e,
        LockError::WouldBlock,
        "granted beside a kept-alive holder"
    );
    held.release().await.expect("release");
    let again = acquire(b.as_ref(), "conformance/x").await;
    again.release().await.expect("release");
}

async fn tokens_rise<F: Fixture>(fixture: &mut F) {
    let sessions = [session(fixture).await, session(fixture).await];
    let mut tokens: Vec<FencingToken> = Vec::new();
    for round in 0..6 {
        let lease = acquire(sessions[round % 2].as_ref(), "conformance/rise").await;
        tokens.push(lease.token());
        lease.release().await.expect("release");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must only rise: {tokens:?}"
    );
}

async fn tokens_rise_across_kill9<F: Fixture>(fixture: &mut F) {
    let mut tokens = Vec::new();
    let locks = session(fixture).await;
    for _ in 0..2 {
        let lease = acquire(locks.as_ref(), "conformance/crash").await;
        tokens.push(lease.token());
        lease.release().await.expect("release");
    }
    drop(locks);
    // Held at the crash by a client that is gone for good (cut off, never
    // releasing): the hold ends with its session, by the TTL.
    let (gone, cut) = fixture
        .cuttable_session(TTL)
        .await
        .unwrap_or_else(|e| panic!("no cuttable session: {e}"));
    let held = acquire(gone.as_ref(), "conformance/crash").await;
    tokens.push(held.token());
    cut.cut();
    tokio::task::block_in_place(|| fixture.kill_and_restart())
        .unwrap_or_else(|e| panic!("restart: {e}"));
    let locks = session(fixture).await;
    let after = acquire(locks.as_ref(), "conformance/crash").await;
    tokens.push(after.token());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must only rise across the crash: {tokens:?}"
    );
    after.release().await.expect("release");
    drop((held, gone, cut));
}

async fn cut_off_holder_loses_first<F: Fixture>(fixture: &mut F) {
    let (cut_off, cut) = fixture
        .cuttable_session(TTL)
        .await
        .unwrap_or_else(|e| panic!("no cuttable session: {e}"));
    let held = acquire(cut_off.as_ref(), "conformance/cut").await;
    let lost = held.lost();
    cut.cut();
    let other = session(fixture).await;
    let granted = acquire(other.as_ref(), "conformance/cut").await;
    let at_grant = Instant::now();
    assert!(
        held.guaranteed_until() <= at_grant,
        "two holders inside their guarantees: the cut-off one's ends {:?} after the next grant",
        held.guaranteed_until() - at_grant
    );
    tokio::time::timeout(PATIENCE, lost)
        .await
        .expect("the cut-off holder was never told it lost the lock");
    assert_eq!(held.state(), LeaseState::Lost);
    assert!(
        granted.token() > held.token(),
        "{} granted after {}",
        granted.token(),
        held.token()
    );
    // Back in touch, the old holder releases what it no longer holds: a
    // refusal or a no-op, never the new holder's lock.
    cut.heal();
    let _refused_or_nothing = held.release().await;
    let e = cut_off
        .acquire("conformance/cut", &now_or_never())
        .await
        .map(|lease| lease.token());
    assert!(
        matches!(
            e,
            Err(LockError::WouldBlock | LockError::SessionExpired | LockError::Unavailable { .. })
        ),
        "the old holder's release freed the new holder's lock: {e:?}"
    );
    granted.release().await.expect("release");
}

/// How many waiters the handoff queues behind its holder.
const WAITERS: usize = 3;

async fn handoff<F: Fixture>(fixture: &mut F) {
    const NAME: &str = "conformance/handoff";
    let holder_session = session(fixture).await;
    let holder = acquire(holder_session.as_ref(), NAME).await;
    let first = holder.token();
    // Set by whoever is inside; a second one inside finds it set.
    let inside = Arc::new(AtomicBool::new(false));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let locks = session(fixture).await;
        let inside = inside.clone();
        waiters.push(tokio::spawn(async move {
            let lease = acquire(locks.as_ref(), NAME).await;
            let at = Instant::now();
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "waiter {i} granted while another was inside"
            );
            let token = lease.token();
            tokio::task::yield_now().await;
            inside.store(false, Ordering::SeqCst);
            lease.release().await.expect("release");
            locks.close().await.expect("close");
            (i, token, at)
        }));
        // The next waiter arrives only once this one is queued.
        if keeps_order(fixture) {
            wait_until_queued(fixture, NAME, i + 2).await;
        }
    }
    holder.release().await.expect("release");
    let mut grants = Vec::new();
    for waiter in waiters {
        grants.push(waiter.await.expect("a waiter panicked"));
    }
    grants.sort_by_key(|(_, _, at)| *at);
    let tokens: Vec<FencingToken> = grants.iter().map(|(_, t, _)| *t).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]) && tokens[0] > first,
        "each grant's token must be above the one before: {first} then {tokens:?}"
    );
    if keeps_order(fixture) {
        let order: Vec<usize> = grants.iter().map(|(i, _, _)| *i).collect();
        assert_eq!(
            order,
            (0..WAITERS).collect::<Vec<_>>(),
            "waiters granted out of their arrival order"
        );
    }
}

async fn wait_until_queued<F: Fixture>(fixture: &F, name: &str, n: usize) {
    let give_up = Instant::now() + PATIENCE;
    loop {
        let queued = fixture.queued(name).expect("asked only where queued");
        if queued.await == n {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{name} never had {n} grants and waiters queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn timed_out_waiter_leaves_nothing<F: Fixture>(fixture: &mut F) {
    const NAME: &str = "conformance/timeout";
    let (a, b, c) = (
        session(fixture).await,
        session(fixture).await,
        session(fixture).await,
    );
    let held = acquire(a.as_ref(), NAME).await;
    let e = b
        .acquire(NAME, &waiting(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert_eq!(e, LockError::WaitTimeout);
    if keeps_order(fixture) {
        // Only the holder is queued.
        wait_until_queued(fixture, NAME, 1).await;
    }
    held.release().await.expect("release");
    // The session that gave up lives on; what it queued must not come
    // before a third session (which would then wait past PATIENCE).
    let lease = acquire(c.as_ref(), NAME).await;
    lease.release().await.expect("release");
    drop(b);
}

async fn bad_input<F: Fixture>(fixture: &mut F) {
    let locks = session(fixture).await;
    let long = "n".repeat(300);
    for bad in ["", long.as_str(), "bad\nname", "nul\0name"] {
        let e = locks.acquire(bad, &now_or_never()).await.unwrap_err();
        assert!(
            matches!(e, LockError::InvalidInput(_)),
            "the name {bad:?}: {e:?}"
        );
    }
    for ttl in [Duration::ZERO, Duration::from_secs(100 * 24 * 60 * 60)] {
        let e = fixture.session(ttl).await.err();
        assert!(
            matches!(e, Some(LockError::InvalidInput(_))),
            "a session with TTL {ttl:?}: {e:?}"
        );
    }
    // Nothing changed: the lock next to the bad names is free.
    let lease = locks
        .acquire("conformance/good", &now_or_never())
        .await
        .expect("a good name after bad ones");
    lease.release().await.expect("release");
}

async fn close_releases<F: Fixture>(fixture: &mut F) {
    let (a, b) = (session(fixture).await, session(fixture).await);
    let held = acquire(a.as_ref(), "conformance/close").await;
    let token = held.token();
    std::mem::forget(held);
    a.close().await.expect("close");
    let after = acquire(b.as_ref(), "conformance/close").await;
    assert!(after.token() > token);
    after.release().await.expect("release");
}

/// Expands to a module `lock_contract` with one `#[test]` per [`Property`]
/// for the fixture type given, each starting its own servers. Put it in a backend's integration test:
/// `palisade_core::conformance_suite!(MyFixture);`.
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:ty) => {
        mod lock_contract {
            #[allow(unused_imports)]
            use super::*;
            use $crate::conformance::{Property, run};

            #[test]
            fn exclusion() {
                run::<$fixture>(Property::Exclusion);
            }
            #[test]
            fn tokens_rise() {
                run::<$fixture>(Property::TokensRise);
            }
            #[test]
            fn tokens_rise_across_kill9() {
                run::<$fixture>(Property::TokensRiseAcrossKill9);
            }
            #[test]
            fn cut_off_holder_loses_first() {
                run::<$fixture>(Property::CutOffHolderLosesFirst);
            }
            #[test]
            fn handoff() {
                run::<$fixture>(Property::Handoff);
            }
            #[test]
            fn timed_out_waiter_leaves_nothing() {
                run::<$fixture>(Property::TimedOutWaiterLeavesNothing);
            }
            #[test]
            fn bad_input() {
                run::<$fixture>(Property::BadInput);
            }
            #[test]
            fn close_releases() {
                run::<$fixture>(Property::CloseReleases);
            }
        }
    };
}
