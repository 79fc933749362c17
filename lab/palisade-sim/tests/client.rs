//! The client's own behaviour against real nodes, on virtual time: the
//! keep-alive cadence and the guarantee it yields, following a new leader after
//! a crash, and refusing a grant that arrives after the guarantee ran out.
//!
//! Each test scripts one simulation: clients run as turmoil hosts, and the
//! test's loop injects its faults at the moments the clients ask for them.
//! Every time below is simulated, so no assert depends on the machine's speed.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Duration;

use palisade_client::{AcquireOptions, Client, ClientConfig, ClientError, LeaseState};
use palisade_sim::{SimConfig, builder, client_config, prepare, sim_now_us, start_cluster};

/// One simulation per process at a time (see `palisade_sim::run`).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const NODES: usize = 3;

fn config(label: &str, ttl: Duration) -> ClientConfig {
    let mut config = client_config(NODES);
    config.label = label.into();
    config.session_ttl = ttl;
    config.rpc_timeout = Duration::from_secs(1);
    config
}

fn wait(secs: u64) -> AcquireOptions {
    AcquireOptions {
        wait: Duration::from_secs(secs),
        ..AcquireOptions::default()
    }
}

/// A client once the cluster has a leader (it elects one in the first second).
async fn connect(config: ClientConfig) -> Client {
    Client::connect(config).await.expect("connected")
}

/// Steps `sim` until every client has finished, calling `between` after each
/// step with the simulated time in µs.
fn drive(sim: &mut turmoil::Sim<'_>, mut between: impl FnMut(&mut turmoil::Sim<'_>, u64)) {
    loop {
        match sim.step() {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => panic!("the simulation failed: {e}"),
        }
        let now = sim.elapsed().as_micros() as u64;
        between(sim, now);
    }
}

/// A simulation of `NODES` real nodes, all randomness from `seed`, and this
/// test's turn (one simulation per process at a time).
fn cluster(seed: u64) -> (std::sync::MutexGuard<'static, ()>, turmoil::Sim<'static>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    prepare(seed);
    let mut sim = builder(seed, Duration::from_secs(120)).build();
    start_cluster(&mut sim, &SimConfig::new(seed));
    (turn, sim)
}

fn node(id: u64) -> String {
    format!("n{id}")
}

/// With a 2 s TTL the client renews every 500 ms and counts on the lease until
/// the last acknowledged renewal's send time + TTL − 10 %: on a healthy
/// cluster the guarantee it reports stays between about 1.2 s and 1.8 s. Cut
/// off from every node, its guarantee runs out, and only after that — at least
/// the safety margin later, less what the leader's clock may run fast over a
/// TTL — does the server hand the lock to another client.
#[test]
fn keep_alives_hold_the_guarantee_and_it_ends_before_the_server_frees_the_lock() {
    let seed = 11;
    let (_turn, mut sim) = cluster(seed);
    let ttl = Duration::from_secs(2);
    let margin = ttl / 10;

    let samples = Rc::new(RefCell::new(Vec::<Duration>::new()));
    let cut_off = Rc::new(Cell::new(false));
    let guarantee_ended_us = Rc::new(Cell::new(0u64));
    let (s, cut, ended) = (samples.clone(), cut_off.clone(), guarantee_ended_us.clone());
    sim.client("c1", async move {
        let client = connect(config("c1", ttl)).await;
        let guard = client.acquire("shared", &wait(5)).await.expect("granted");
        for _ in 0..2000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            s.borrow_mut().push(client.remaining());
        }
        cut.set(true);
        while guard.state() != LeaseState::Lost {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The instant it ended, not when this loop noticed (up to a timer tick
        // later): the margin below is checked to the millisecond.
        let noticed_late =
            palisade_core::clock::now().saturating_duration_since(guard.guaranteed_until());
        ended.set(sim_now_us() - noticed_late.as_micros() as u64);
        Ok(())
    });
    let granted_us = Rc::new(Cell::new(0u64));
    let granted = granted_us.clone();
    sim.client("c2", async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let client = connect(config("c2", ttl)).await;
        let guard = client.acquire("shared", &wait(60)).await.expect("granted");
        granted.set(sim_now_us());
        guard.release().await.expect("released");
        Ok(())
    });
    let mut held = false;
    drive(&mut sim, |sim, _| {
        if cut_off.get() && !held {
            for id in 1..=NODES as u64 {
                sim.hold("c1", node(id));
            }
            held = true;
        }
    });

    let samples = samples.borrow();
    let (low, high) = (
        samples.iter().min().copied().unwrap_or_default(),
        samples.iter().max().copied().unwrap_or_default(),
    );
    assert_eq!(samples.len(), 2000);
    assert!(
        high <= ttl - margin,
        "guarantee {high:?} beyond TTL − margin"
    );
    assert!(
        low >= ttl - margin - ttl / 4 - Duration::from_millis(100),
        "guarantee fell to {low:?}: a renewal was late"
    );
    let (ended, granted) = (guarantee_ended_us.get(), granted_us.get());
    assert!(
        ended > 0 && granted > 0,
        "ended {ended} µs, granted {granted} µs"
    );
    // The nodes' clocks run up to `max_skew` fast or slow (the skew fault is
    // on): a leader whose clock is fast frees the lock that much of a TTL
    // early, which is what the margin is for. What is left of the margin must
    // still separate the two holders.
    let drift = ttl.mul_f64(SimConfig::new(seed).max_skew);
    assert!(
        granted >= ended + (margin - drift).as_micros() as u64,
        "the lock was handed on at {granted} µs, the first holder's guarantee ended at {ended} µs"
    );
}

/// The leader crashes while the client holds a lock: the client finds the new
/// leader by itself, its session survives (TTL 5 s, an election takes about
/// one), it still holds its lock, and it acquires another.
#[test]
fn the_client_follows_a_new_leader_and_keeps_its_session() {
    let (_turn, mut sim) = cluster(12);

    let crash = Rc::new(Cell::new(0u64));
    let report = Rc::new(RefCell::new(None));
    let (c, r) = (crash.clone(), report.clone());
    sim.client("c1", async move {
        let client = connect(config("c1", Duration::from_secs(5))).await;
        let session = client.session_id();
        let first = client.acquire("first", &wait(5)).await.expect("granted");
        let leader = client
            .status()
            .await
            .expect("status")
            .leader
            .expect("a leader");
        c.set(leader);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let second = client.acquire("second", &wait(10)).await;
        let status = client.status().await.expect("status after the crash");
        *r.borrow_mut() = Some((
            leader,
            status.leader,
            session == client.session_id(),
            second.is_ok(),
            first.state(),
        ));
        first.release().await.expect("the first lock is still ours");
        if let Ok(second) = second {
            second.release().await.expect("released");
        }
        Ok(())
    });
    let mut crashed_at = None;
    drive(&mut sim, |sim, now| {
        if crash.get() != 0 && crashed_at.is_none() {
            sim.crash(node(crash.get()));
            crashed_at = Some(now);
        }
        if crashed_at.is_some_and(|at| now == at + 3_000_000) {
            sim.bounce(node(crash.get()));
        }
    });
    let (old, new, same_session, second_ok, first_state) =
        (*report.borrow()).expect("the client reported");
    assert!(second_ok, "acquired after the crash");
    assert!(same_session, "one session throughout");
    assert_ne!(new, Some(old), "a new leader, not node {old}");
    assert!(new.is_some());
    assert_ne!(
        first_state,
        LeaseState::Lost,
        "the first lock still guaranteed"
    );
}

/// A grant the network held back until after the session's guarantee ran out
/// is refused: `GrantTooLate`, counted, and the lock given back — the server
/// may have expired the session and handed the lock on meanwhile.
#[test]
fn a_grant_that_arrives_after_the_guarantee_is_refused() {
    let (_turn, mut sim) = cluster(13);
    let ttl = Duration::from_secs(4);

    let waiting = Rc::new(Cell::new(false));
    let release_now = Rc::new(Cell::new(false));
    let (w, go) = (waiting.clone(), release_now.clone());
    sim.client("holder", async move {
        let client = connect(config("holder", ttl)).await;
        let guard = client.acquire("late", &wait(5)).await.expect("granted");
        w.set(true);
        while !go.get() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        guard.release().await.expect("released");
        Ok(())
    });
    let outcome = Rc::new(RefCell::new(None));
    let (w, out) = (waiting.clone(), outcome.clone());
    sim.client("late", async move {
        while !w.get() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let client = connect(config("late", ttl)).await;
        let result = client.acquire("late", &wait(30)).await.map(|g| g.token());
        *out.borrow_mut() = Some((result, client.lock_safety().render()));
        Ok(())
    });
    // Once the second client waits in the queue: cut it off, let the holder
    // release (the grant goes to the waiter and is held on the way), and let
    // everything through only after the server has expired the waiter's
    // session (TTL 4 s without a renewal).
    let mut cut_at = None;
    drive(&mut sim, |sim, now| {
        if waiting.get() && cut_at.is_none() && now > 8_000_000 {
            for id in 1..=NODES as u64 {
                sim.hold("late", node(id));
            }
            cut_at = Some(now);
        }
        if cut_at.is_some_and(|at| now == at + 100_000) {
            release_now.set(true);
        }
        if cut_at.is_some_and(|at| now == at + 6_000_000) {
            for id in 1..=NODES as u64 {
                sim.release("late", node(id));
            }
        }
    });
    let (result, metrics) = outcome.borrow_mut().take().expect("the waiter reported");
    assert!(
        matches!(result, Err(ClientError::GrantTooLate)),
        "{result:?}"
    );
    assert!(
        metrics.contains("palisade_lock_grants_too_late_total 1"),
        "{metrics}"
    );
}
