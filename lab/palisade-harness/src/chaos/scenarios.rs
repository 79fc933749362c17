//! The drills: each failure the essay and the Redlock page describe, staged on
//! real processes. Every scenario only injects faults and drives clients; what
//! went wrong is decided afterwards by `palisade_chaos::check` on the history.

use std::time::{Duration, Instant};

use anyhow::Result;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use rand::rngs::StdRng;

use palisade_core::machine::Claim;

use super::env::{Env, Trial, Worker, WorkerOptions};
use super::worker::{Backend, Between};

/// What a scenario stages; [`run`] dispatches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drill {
    /// The essay's GC pause between the lease check and the write.
    HolderPause,
    /// The essay's network delay of the write past the lease.
    DelayedWrite,
    /// A Redis node's clock jumps during a Redlock hold.
    RedlockClockJump,
    /// The Redlock client pauses after its SETs reached the nodes.
    RedlockPauseDuringAcquire,
    /// A Redis node that granted a lock restarts without persistence.
    RedisCrashRestart,
    /// A Redlock node that granted a lock fails over to its asynchronous
    /// replica, which never received the key.
    RedlockReplicaFailover,
    /// The leader (or the one server) of a correctness lock fails during a hold.
    LeaderFailure,
    /// Random faults while three clients increment a counter.
    Mixed,
    /// A recipe's holder — an election's leader, a semaphore permit's —
    /// pauses between its lease check and its write.
    LeaderPause,
}

/// A drill by name: one row of the one table every part of `chaos` reads.
pub struct Scenario {
    /// What it stages.
    pub drill: Drill,
    /// Its name on the command line.
    pub name: &'static str,
    /// Its variants (`[""]` when it has none).
    pub variants: &'static [&'static str],
    /// The backends it applies to.
    pub backends: Applies,
    /// Variants that pause a server (`SIGSTOP`): not on a backend whose
    /// launcher cannot pause one.
    pub pausing: &'static [&'static str],
    /// The lease its clients take: long enough for the harness to stage the
    /// fault while it runs, short enough to keep trials quick.
    pub ttl: Duration,
    /// What it stages, in one line.
    pub about: &'static str,
}

/// Which backends a scenario applies to.
#[derive(Clone, Copy, Debug)]
pub enum Applies {
    /// Every one, efficiency locks too.
    All,
    /// The correctness-lock backends (tokens, leaders).
    Fenced,
    /// These, by name (a scenario about one backend's own algorithm or
    /// recipe).
    Only(&'static [&'static str]),
}

impl Scenario {
    /// The backends it applies to, in report order.
    pub fn backends(&self) -> Vec<Backend> {
        match self.backends {
            Applies::All => Backend::all().to_vec(),
            Applies::Fenced => Backend::fenced().to_vec(),
            Applies::Only(names) => Backend::all()
                .iter()
                .copied()
                .filter(|b| names.contains(&b.name()))
                .collect(),
        }
    }

    /// Whether `variant` of this scenario runs on `backend`.
    pub fn applies(&self, variant: &str, backend: Backend) -> bool {
        let pauses = self.pausing.contains(&variant);
        self.backends().contains(&backend) && (can_pause(backend) || !pauses)
    }

    /// The variants that do not run on `backend` although the scenario does.
    pub fn exceptions(&self, backend: Backend) -> Vec<&'static str> {
        self.variants
            .iter()
            .copied()
            .filter(|v| !self.applies(v, backend))
            .collect()
    }
}

/// Whether a server of `backend` can be paused (Redis can; a correctness
/// backend as its testkit launcher says).
fn can_pause(backend: Backend) -> bool {
    match backend {
        Backend::Redis | Backend::Redlock => true,
        Backend::Fenced(_) => {
            palisade_testkit::servers::launcher(backend.name()).is_some_and(|l| l.pausable)
        }
    }
}

/// Variant names used by the code as well as the table.
const KILL: &str = "kill";
const PAUSE: &str = "pause";
const JUMP: &str = "jump";
const UPTIME_RULE: &str = "uptime-rule";
const FAILOVER: &str = "failover";
const ELECTION: &str = "election";
const PERMIT: &str = "permit";

/// Every scenario, in report order.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        drill: Drill::HolderPause,
        name: "holder-pause",
        variants: &[""],
        backends: Applies::All,
        pausing: &[],
        ttl: Duration::from_secs(1),
        about: "the holder stops (SIGSTOP) after its lease check, past its lease; another client acquires and writes; the first resumes and writes",
    },
    Scenario {
        drill: Drill::DelayedWrite,
        name: "delayed-write",
        variants: &[""],
        backends: Applies::All,
        pausing: &[],
        ttl: Duration::from_secs(1),
        about: "the holder's write is held by the network past its lease; another client acquires and writes; then the held write arrives",
    },
    Scenario {
        drill: Drill::RedlockClockJump,
        name: "redlock-clock-jump",
        variants: &[JUMP, "no-jump"],
        backends: Applies::Only(&["redlock"]),
        pausing: &[],
        ttl: Duration::from_secs(3),
        about: "client 1 gets redis 1-3 (4, 5 cut off); redis 3's clock jumps past the TTL; client 2 (cut off from 1, 2) asks redis 3-5",
    },
    Scenario {
        drill: Drill::RedlockPauseDuringAcquire,
        name: "redlock-pause-during-acquire",
        variants: &[""],
        backends: Applies::Only(&["redlock"]),
        pausing: &[],
        ttl: Duration::from_secs(2),
        about: "client 1 stops after its SETs reached the nodes and before it reads the replies, past the TTL",
    },
    Scenario {
        drill: Drill::RedisCrashRestart,
        name: "redis-crash-restart",
        variants: &["no-uptime-rule", UPTIME_RULE],
        backends: Applies::Only(&["redis", "redlock"]),
        pausing: &[],
        ttl: Duration::from_secs(3),
        about: "a node that granted client 1 is killed and restarted without persistence; client 2 asks it (with or without the delayed-restart rule)",
    },
    Scenario {
        drill: Drill::RedlockReplicaFailover,
        name: "redlock-replica-failover",
        variants: &[FAILOVER, "independent"],
        backends: Applies::Only(&["redlock"]),
        pausing: &[],
        // Only the staging (a kill, a promotion) lies between the two grants;
        // a long lease keeps a loaded machine from ending client 1's first.
        ttl: Duration::from_secs(5),
        about: "client 1 gets redis 1-3 (4, 5 cut off) while redis 3's asynchronous replica is cut off from it; redis 3 is killed and (failover) its replica, without the key, is promoted in its place or (independent) nothing replaces it; client 2 (cut off from 1, 2) asks redis 3-5",
    },
    Scenario {
        drill: Drill::LeaderFailure,
        name: "leader-failure",
        variants: &[KILL, PAUSE],
        backends: Applies::Fenced,
        // Not where stopping one process would not pause the server
        // (PostgreSQL's sessions run in processes of their own; its failure
        // is the kill).
        pausing: &[PAUSE],
        // The holder's session must outlive a failover (Palisade: election
        // timeout up to 1.2 s, plus the followers' leader lease of 1.2 s, plus
        // the client's retries; ZooKeeper and etcd elect in about as long), or
        // the drill shows expiry instead of a failover.
        ttl: Duration::from_secs(6),
        about: "the leader (ZooKeeper, etcd, Palisade) is killed (kill -9) or paused (SIGSTOP: to its peers, a partition) while client 1 holds the lock and two clients wait; PostgreSQL's postmaster is killed with kill -9 and restarted",
    },
    Scenario {
        drill: Drill::Mixed,
        name: "mixed",
        variants: &[""],
        backends: Applies::All,
        pausing: &[],
        ttl: Duration::from_secs(1),
        about: "three clients increment a lock-protected counter while random pauses, partitions, delays, kills and clock jumps hit them",
    },
    Scenario {
        drill: Drill::LeaderPause,
        name: "leader-pause",
        variants: &[ELECTION, PERMIT],
        // The recipes are the Palisade server's (docs/recipes.md).
        backends: Applies::Only(&["palisade"]),
        pausing: &[],
        ttl: Duration::from_secs(1),
        about: "the elected leader (election), or the holder of a semaphore's permit while a third client holds the other (permit), stops (SIGSTOP) after its lease check, past its lease; the next candidate is elected, or granted the freed slot, and writes; the first resumes and writes with its old token",
    },
];

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Settings that only some scenarios need.
pub struct Knobs {
    /// How long one `mixed` trial injects faults.
    pub mixed_duration: Duration,
}

/// Runs one trial of `drill`.
pub async fn run(
    drill: Drill,
    env: &mut Env,
    t: &mut Trial,
    rng: &mut StdRng,
    knobs: &Knobs,
) -> Result<()> {
    match drill {
        Drill::HolderPause => holder_pause(t).await,
        Drill::DelayedWrite => delayed_write(t).await,
        Drill::RedlockClockJump => clock_jump(env, t).await,
        Drill::RedlockPauseDuringAcquire => pause_during_acquire(t).await,
        Drill::RedisCrashRestart => crash_restart(env, t).await,
        Drill::RedlockReplicaFailover => replica_failover(env, t).await,
        Drill::LeaderFailure => leader_failure(env, t).await,
        Drill::Mixed => mixed(env, t, rng, knobs.mixed_duration).await,
        Drill::LeaderPause => leader_pause(t).await,
    }
}

const LONG_WAIT: Duration = Duration::from_secs(20);

async fn finish_all(workers: impl IntoIterator<Item = Worker>) {
    for w in workers {
        w.finish().await;
    }
}

async fn holder_pause(t: &mut Trial) -> Result<()> {
    let mut w1 = t.worker(1, WorkerOptions::default()).await?;
    let mut w2 = t.worker(2, WorkerOptions::default()).await?;
    if !w1.acquire(&t.lock, Duration::from_secs(5)).await? {
        t.note("client 1 could not acquire the lock");
        finish_all([w1, w2]).await;
        return Ok(());
    }
    if let Some(o) = w1.start_increment(&t.key, Between::Stop).await? {
        t.note(format!("client 1 did not reach its pause: {}", o.detail));
    } else {
        t.fault("client 1 paused (SIGSTOP) between its lease check and its write");
        let o2 = w2.try_acquire(&t.lock, LONG_WAIT).await?;
        if o2.ok {
            w2.increment(&t.key).await?;
        } else {
            t.note(format!("client 2 was not granted the lock: {}", o2.detail));
        }
        w1.resume()?;
        t.fault("client 1 resumed");
        let o = w1.outcome().await?;
        t.note(format!("client 1's write after the pause: {}", o.detail));
    }
    w2.release().await?;
    finish_all([w1, w2]).await;
    Ok(())
}

/// [`holder_pause`] for a recipe: the leader of an election, or the holder
/// of permit 0 of a semaphore of 2 whose permit 1 a third client holds
/// throughout, so that the next client's grant is the paused one's slot.
async fn leader_pause(t: &mut Trial) -> Result<()> {
    let election = t.variant == ELECTION;
    let claim = |n: u32| {
        if election {
            Claim::Lead {
                value: format!("client {n}"),
            }
        } else {
            Claim::Permit { permits: 2 }
        }
    };
    let what = if election { "leader" } else { "permit holder" };
    let mut w1 = t.worker(1, WorkerOptions::default()).await?;
    let mut w2 = t.worker(2, WorkerOptions::default()).await?;
    let mut others = Vec::new();
    let o1 = w1
        .try_claim(&t.lock, claim(1), Duration::from_secs(5))
        .await?;
    if !o1.ok {
        t.note(format!("client 1 was not granted: {}", o1.detail));
        finish_all([w1, w2]).await;
        return Ok(());
    }
    if !election {
        let mut w3 = t.worker(3, WorkerOptions::default()).await?;
        let o3 = w3
            .try_claim(&t.lock, claim(3), Duration::from_secs(5))
            .await?;
        if !o3.ok {
            t.note(format!(
                "client 3 was not granted the other permit: {}",
                o3.detail
            ));
        }
        others.push(w3);
    }
    if let Some(o) = w1.start_increment(&t.key, Between::Stop).await? {
        t.note(format!("client 1 did not reach its pause: {}", o.detail));
    } else {
        t.fault(format!(
            "client 1, the {what}, paused (SIGSTOP) between its lease check and its write"
        ));
        let o2 = w2.try_claim(&t.lock, claim(2), LONG_WAIT).await?;
        if o2.ok {
            w2.increment(&t.key).await?;
        } else {
            t.note(format!("client 2 was not granted: {}", o2.detail));
        }
        w1.resume()?;
        t.fault("client 1 resumed");
        let o = w1.outcome().await?;
        t.note(format!("client 1's write after the pause: {}", o.detail));
    }
    w2.release().await?;
    for w in &mut others {
        w.release().await?;
    }
    finish_all([w1, w2].into_iter().chain(others)).await;
    Ok(())
}

async fn delayed_write(t: &mut Trial) -> Result<()> {
    let mut w1 = t.worker(1, WorkerOptions::default()).await?;
    let mut w2 = t.worker(2, WorkerOptions::default()).await?;
    if !w1.acquire(&t.lock, Duration::from_secs(5)).await? {
        t.note("client 1 could not acquire the lock");
        finish_all([w1, w2]).await;
        return Ok(());
    }
    if let Some(o) = w1.start_increment(&t.key, Between::Hold).await? {
        t.note(format!("client 1 did not reach its write: {}", o.detail));
    } else {
        for link in w1.lock_links() {
            link.partition();
        }
        w1.store_link().partition();
        t.fault("client 1's network holds every packet; its write is sent into it");
        w1.go().await?;
        let o2 = w2.try_acquire(&t.lock, LONG_WAIT).await?;
        if o2.ok {
            w2.increment(&t.key).await?;
        } else {
            t.note(format!("client 2 was not granted the lock: {}", o2.detail));
        }
        w1.heal_all();
        t.fault("client 1's network heals: the held write is delivered");
        let o = w1.outcome().await?;
        t.note(format!("client 1's delayed write: {}", o.detail));
    }
    w2.release().await?;
    finish_all([w1, w2]).await;
    Ok(())
}

/// Whether the Redis server at `addr` holds `key` (asked directly, not through
/// any client's proxy).
async fn redis_has(addr: std::net::SocketAddr, key: &str) -> Result<bool> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let n: i64 = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await?;
    Ok(n > 0)
}

async fn clock_jump(env: &mut Env, t: &mut Trial) -> Result<()> {
    let fast = WorkerOptions {
        node_timeout: Some(Duration::from_millis(50)),
        ..WorkerOptions::default()
    };
    let mut w1 = t.worker(1, fast.clone()).await?;
    let mut w2 = t.worker(2, fast).await?;
    let l1 = w1.lock_links();
    l1[3].partition();
    l1[4].partition();
    t.fault("client 1 cut off from redis 4 and 5");
    let ok1 = w1.acquire(&t.lock, Duration::from_secs(2)).await?;
    if !ok1 {
        t.note("client 1 could not acquire redis 1-3");
    }
    if ok1 && t.variant == JUMP {
        let jump = t.ttl + Duration::from_secs(1);
        if let Some(clock) = env.redis()[2].clock() {
            clock.jump_ahead(jump)?;
        }
        t.fault(format!(
            "redis 3's wall clock jumps {} s ahead",
            jump.as_secs()
        ));
        // The preload re-reads its offset every few ms; wait until redis 3 has
        // actually expired the key (its lazy expiry runs on this very probe).
        let probe = Instant::now();
        while redis_has(t.redis_addr(2), &t.lock).await? {
            if probe.elapsed() > Duration::from_secs(2) {
                t.note("redis 3 still had the key 2 s after the jump");
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let l2 = w2.lock_links();
    l2[0].partition();
    l2[1].partition();
    t.fault("client 2 cut off from redis 1 and 2");
    let ok2 = w2.acquire(&t.lock, Duration::from_millis(500)).await?;
    if ok1 {
        w1.increment(&t.key).await?;
    }
    if ok2 {
        w2.increment(&t.key).await?;
    }
    if let Some(clock) = env.redis()[2].clock() {
        clock.set_ms(0)?;
    }
    finish_all([w1, w2]).await;
    Ok(())
}

async fn pause_during_acquire(t: &mut Trial) -> Result<()> {
    let options = WorkerOptions {
        node_timeout: Some(Duration::from_millis(800)),
        ..WorkerOptions::default()
    };
    let mut w1 = t.worker(1, options.clone()).await?;
    let mut w2 = t.worker(2, options).await?;
    let delay = Duration::from_millis(200);
    for link in w1.lock_links() {
        link.set_delay(delay);
    }
    t.fault("client 1's links to redis 1-5 delay every packet by 200 ms");
    // One attempt (no waiting), so a retry cannot hide what the first one saw.
    w1.start_acquire(&t.lock, Duration::ZERO).await?;
    let watch = Instant::now();
    let landed = loop {
        let mut holding = 0;
        for i in 0..super::env::REDIS_NODES {
            if redis_has(t.redis_addr(i), &t.lock).await? {
                holding += 1;
            }
        }
        if holding >= 3 {
            break true;
        }
        if watch.elapsed() > Duration::from_secs(5) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    if landed {
        w1.pause().await?;
        t.fault("client 1 paused (SIGSTOP): its SETs reached a majority, the replies are still in flight");
        tokio::time::sleep(t.ttl + Duration::from_millis(500)).await;
        for link in w1.lock_links() {
            link.heal();
        }
        w1.resume()?;
        t.fault("client 1 resumed and reads the replies");
    } else {
        t.note("client 1's SETs never reached a majority");
    }
    let o1 = w1.outcome().await?;
    t.note(format!(
        "client 1's acquire (paused {} TTL): {}",
        if landed {
            "past the"
        } else {
            "not at all within the"
        },
        o1.detail
    ));
    let ok2 = w2.acquire(&t.lock, Duration::from_secs(5)).await?;
    if o1.ok {
        w1.increment(&t.key).await?;
    }
    if ok2 {
        w2.increment(&t.key).await?;
        w2.release().await?;
    }
    finish_all([w1, w2]).await;
    Ok(())
}

async fn crash_restart(env: &mut Env, t: &mut Trial) -> Result<()> {
    let uptime_rule = t.variant == UPTIME_RULE;
    let base = WorkerOptions {
        node_timeout: Some(Duration::from_millis(50)),
        ..WorkerOptions::default()
    };
    let mut w1 = t.worker(1, base.clone()).await?;
    let mut w2 = t
        .worker(
            2,
            WorkerOptions {
                min_uptime: uptime_rule.then_some(t.ttl),
                ..base
            },
        )
        .await?;
    let victim = if t.backend == Backend::Redlock {
        let l1 = w1.lock_links();
        l1[3].partition();
        l1[4].partition();
        t.fault("client 1 cut off from redis 4 and 5");
        2
    } else {
        0
    };
    let ok1 = w1.acquire(&t.lock, Duration::from_secs(2)).await?;
    if !ok1 {
        t.note("client 1 could not acquire the lock");
    }
    let server = &mut env.redis()[victim];
    tokio::task::block_in_place(|| {
        server.kill();
        server.restart()
    })?;
    t.fault(format!(
        "redis {} killed and restarted without persistence: it forgot the lock",
        victim + 1
    ));
    if t.backend == Backend::Redlock {
        let l2 = w2.lock_links();
        l2[0].partition();
        l2[1].partition();
        t.fault("client 2 cut off from redis 1 and 2");
    }
    // With the rule, client 2 keeps retrying until the restarted node is old
    // enough to count again — by then client 1's lease is over.
    let wait = if uptime_rule {
        2 * t.ttl + Duration::from_secs(1)
    } else {
        Duration::from_millis(500)
    };
    let ok2 = w2.acquire(&t.lock, wait).await?;
    if ok1 {
        w1.increment(&t.key).await?;
    }
    if ok2 {
        w2.increment(&t.key).await?;
    }
    finish_all([w1, w2]).await;
    Ok(())
}

/// The node that has a replica in `redlock-replica-failover` (redis 3).
const FAILOVER_NODE: usize = 2;

/// An asynchronous replica of a drill's Redis node, replicating through a fault
/// proxy so the harness can hold its replication stream.
struct Replica {
    server: palisade_testkit::RedisServer,
    /// The replication link (replica → master): partitioned, it holds every
    /// byte of the stream; dropped, the held bytes are gone for good.
    stream: palisade_faultproxy::FaultProxy,
}

impl Replica {
    /// Starts a replica of `master` and waits until it has everything the
    /// master had (a marker written to the master arrives).
    async fn start(master: std::net::SocketAddr, marker: &str) -> Result<Replica> {
        let mut m = redis_conn(master).await?;
        // Redis 7 waits 5 s for more replicas before a diskless full sync.
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0)
            .query_async(&mut m)
            .await?;
        let stream = palisade_faultproxy::FaultProxy::start(master).await?;
        let port = stream.addr().port().to_string();
        let server = tokio::task::block_in_place(|| {
            palisade_testkit::RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])
        })?;
        let replica = Replica { server, stream };
        let () = redis::cmd("SET")
            .arg(marker)
            .arg("synced")
            .query_async(&mut m)
            .await?;
        let started = Instant::now();
        while !redis_has(replica.addr(), marker).await? {
            if started.elapsed() > Duration::from_secs(20) {
                anyhow::bail!("redis 3's replica did not sync within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(replica)
    }

    fn addr(&self) -> std::net::SocketAddr {
        palisade_testkit::loopback(self.server.port())
    }
}

async fn redis_conn(addr: std::net::SocketAddr) -> Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Records what `palisade redis audit` says of the drill's five Redis nodes
/// (the drill does not depend on it).
async fn audit_note(t: &mut Trial) {
    let urls: Vec<String> = (0..super::env::REDIS_NODES)
        .map(|i| format!("redis://{}", t.redis_addr(i)))
        .collect();
    let note = match palisade_redis::audit::audit(&urls, Some(t.ttl), Duration::from_secs(2)).await
    {
        Ok(report) => {
            // One entry per kind, in the audit's order (violations first).
            let mut kinds: Vec<(&str, &str, usize)> = Vec::new();
            for f in &report.findings {
                let severity = match f.severity {
                    palisade_redis::audit::Severity::Violation => "violation",
                    palisade_redis::audit::Severity::Warning => "warning",
                };
                match kinds.iter_mut().find(|k| k.0 == f.kind) {
                    Some(k) => k.2 += 1,
                    None => kinds.push((f.kind, severity, 1)),
                }
            }
            let findings: Vec<String> = kinds
                .iter()
                .map(|(kind, severity, n)| {
                    if *n == 1 {
                        format!("{kind} ({severity})")
                    } else {
                        format!("{kind} ({severity}, ×{n})")
                    }
                })
                .collect();
            format!(
                "`palisade redis audit` of the five nodes: {}; findings: {}",
                if report.independent {
                    "independent (exit 0)"
                } else {
                    "not independent (exit 1)"
                },
                findings.join(", ")
            )
        }
        Err(e) => format!("`palisade redis audit` failed: {e}"),
    };
    t.note(note);
}

async fn replica_failover(env: &mut Env, t: &mut Trial) -> Result<()> {
    let base = WorkerOptions {
        node_timeout: Some(Duration::from_millis(50)),
        ..WorkerOptions::default()
    };
    let mut w1 = t.worker(1, base.clone()).await?;
    let mut w2 = t.worker(2, base).await?;
    let master = t.redis_addr(FAILOVER_NODE);
    let replica = if t.variant == FAILOVER {
        let marker = format!("{}/replica-synced", t.key);
        let r = Replica::start(master, &marker).await?;
        t.fault("redis 3 has an asynchronous replica, in sync");
        Some(r)
    } else {
        None
    };
    audit_note(t).await;
    if let Some(r) = &replica {
        r.stream.link().partition();
        t.fault("redis 3's replication stream to its replica held (partition)");
    }
    let l1 = w1.lock_links();
    l1[3].partition();
    l1[4].partition();
    t.fault("client 1 cut off from redis 4 and 5");
    let ok1 = w1.acquire(&t.lock, Duration::from_secs(2)).await?;
    if !ok1 {
        t.note("client 1 could not acquire redis 1-3");
    }
    if let Some(r) = &replica {
        let on_master = redis_has(master, &t.lock).await?;
        let on_replica = redis_has(r.addr(), &t.lock).await?;
        t.note(format!(
            "after client 1's grant: the key is {} redis 3 and {} its replica",
            if on_master { "on" } else { "NOT on" },
            if on_replica { "ALSO on" } else { "not on" },
        ));
    }
    tokio::task::block_in_place(|| env.redis()[FAILOVER_NODE].kill());
    t.fault("redis 3 killed (kill -9)");
    if let Some(r) = replica.as_ref() {
        // The master is dead: the stream it held can never be delivered now;
        // closing the link throws the held bytes away.
        r.stream.link().sever();
        let mut c = redis_conn(r.addr()).await?;
        let () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut c)
            .await?;
        for w in [&w1, &w2] {
            w.lock_links()[FAILOVER_NODE].redirect(r.addr());
        }
        t.fault("redis 3's replica promoted (REPLICAOF NO ONE); redis 3's address now reaches it");
        let has = redis_has(r.addr(), &t.lock).await?;
        t.note(format!(
            "the promoted replica {} the key",
            if has { "HAS" } else { "does not have" }
        ));
    } else {
        t.note("nothing replaces redis 3");
    }
    let l2 = w2.lock_links();
    l2[0].partition();
    l2[1].partition();
    t.fault("client 2 cut off from redis 1 and 2");
    let o2 = w2.try_acquire(&t.lock, Duration::from_secs(1)).await?;
    if !o2.ok {
        t.note("client 2 was not granted redis 3-5");
    }
    if ok1 {
        w1.increment(&t.key).await?;
    }
    if o2.ok {
        w2.increment(&t.key).await?;
    }
    finish_all([w1, w2]).await;
    drop(replica);
    Ok(())
}

async fn leader_failure(env: &mut Env, t: &mut Trial) -> Result<()> {
    let backend = t.backend;
    let mut w1 = t.worker(1, WorkerOptions::default()).await?;
    let mut w2 = t.worker(2, WorkerOptions::default()).await?;
    let mut w3 = t.worker(3, WorkerOptions::default()).await?;
    if !w1.acquire(&t.lock, Duration::from_secs(5)).await? {
        t.note("client 1 could not acquire the lock");
        finish_all([w1, w2, w3]).await;
        return Ok(());
    }
    w1.increment(&t.key).await?;
    w2.start_acquire(&t.lock, Duration::from_secs(30)).await?;
    w3.start_acquire(&t.lock, Duration::from_secs(30)).await?;
    let index = env.leader(backend).await?;
    let single = env.server_count(backend) == 1;
    let who = if single {
        "the server".to_owned()
    } else {
        format!("the leader (server {})", index + 1)
    };
    let pid = env.server_pid(backend, index);
    if t.variant == KILL {
        env.kill_server(backend, index);
        t.fault(format!("{who} killed (kill -9)"));
    } else if let Some(pid) = pid {
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP)?;
        t.fault(format!("{who} paused (SIGSTOP): to its peers, a partition"));
    }
    for _ in 0..3 {
        let o = w1.increment(&t.key).await?;
        if !o.ok {
            t.note(format!("client 1 during the failover: {}", o.detail));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if t.variant == PAUSE {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(pid) = pid {
            kill(Pid::from_raw(pid as i32), Signal::SIGCONT)?;
        }
        t.fault(format!("{who} resumed"));
    }
    // With no other server to fail over to, the service returns only when the
    // server does: restart it now, not after the waiters are served.
    if t.variant == KILL && single {
        env.start_server(backend, index)?;
        t.fault(format!("{who} restarted"));
    }
    w1.release().await?;
    // Clients 2 and 3 queued at about the same moment; either may be first in
    // the lock's queue, so serve whichever is granted first.
    let (first, outcome) = tokio::select! {
        o = w2.outcome() => (2, o?),
        o = w3.outcome() => (3, o?),
    };
    let order = if first == 2 {
        [(&mut w2, Some(outcome)), (&mut w3, None)]
    } else {
        [(&mut w3, Some(outcome)), (&mut w2, None)]
    };
    let mut retry = Vec::new();
    for (w, known) in order {
        let o = match known {
            Some(o) => o,
            None => w.outcome().await?,
        };
        if o.ok {
            w.increment(&t.key).await?;
            w.release().await?;
        } else {
            // A wait cut short by the failure (a connection reset, a session
            // lost with the server) is retried once the other waiter is served,
            // as an application would.
            t.note(format!(
                "client {}'s wait ended without the lock: {}",
                w.n, o.detail
            ));
            retry.push(w);
        }
    }
    for w in retry {
        let o = w.try_acquire(&t.lock, Duration::from_secs(30)).await?;
        if o.ok {
            w.increment(&t.key).await?;
            w.release().await?;
        } else {
            t.note(format!(
                "client {} was not granted the lock: {}",
                w.n, o.detail
            ));
        }
    }
    if t.variant == KILL && !single {
        env.start_server(backend, index)?;
        t.fault(format!("server {} restarted", index + 1));
    }
    finish_all([w1, w2, w3]).await;
    Ok(())
}

/// Three clients loop acquire → increment → release while faults rain down.
async fn mixed(env: &mut Env, t: &mut Trial, rng: &mut StdRng, duration: Duration) -> Result<()> {
    const CLIENTS: u32 = 3;
    let mut controls = Vec::new();
    let mut drivers = Vec::new();
    let deadline = tokio::time::Instant::now() + duration;
    for n in 1..=CLIENTS {
        let mut w = t.worker(n, WorkerOptions::default()).await?;
        controls.push((w.pid(), w.lock_links(), w.store_link()));
        let (lock, key) = (t.lock.clone(), t.key.clone());
        drivers.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < deadline {
                if w.acquire(&lock, Duration::from_secs(2)).await? {
                    w.increment(&key).await?;
                    w.release().await?;
                } else {
                    // A server that refuses at once (down, restarting) must
                    // not turn the loop into a flood of attempts.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            anyhow::Ok(w)
        }));
    }
    let backend = t.backend;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        let (pid, links, store_link) = &controls[rng.random_range(0..controls.len())];
        let client = controls
            .iter()
            .position(|c| c.0 == *pid)
            .map_or(0, |i| i + 1);
        match rng.random_range(0..5) {
            0 => {
                let hold = t.ttl.mul_f64(rng.random_range(0.5..2.5));
                kill(*pid, Signal::SIGSTOP)?;
                t.fault(format!(
                    "client {client} paused for {} ms",
                    hold.as_millis()
                ));
                tokio::time::sleep(hold).await;
                kill(*pid, Signal::SIGCONT)?;
                t.fault(format!("client {client} resumed"));
            }
            1 => {
                let i = rng.random_range(0..links.len());
                let hold = Duration::from_millis(rng.random_range(300..2000));
                links[i].partition();
                t.fault(format!("client {client} cut off from server {}", i + 1));
                tokio::time::sleep(hold).await;
                links[i].heal();
                t.fault(format!("client {client} reconnected to server {}", i + 1));
            }
            2 => {
                let hold = Duration::from_millis(rng.random_range(300..2000));
                store_link.partition();
                t.fault(format!("client {client}'s traffic to the store held"));
                tokio::time::sleep(hold).await;
                store_link.heal();
                t.fault(format!("client {client}'s held store traffic delivered"));
            }
            _ => server_fault(env, t, rng, backend).await?,
        }
    }
    let mut workers = Vec::new();
    for d in drivers {
        match d.await? {
            Ok(w) => workers.push(w),
            Err(e) => t.note(format!("a client failed: {e:#}")),
        }
    }
    finish_all(workers).await;
    Ok(())
}

/// Kills, pauses or shifts the clock of a random server of `backend`.
async fn server_fault(
    env: &mut Env,
    t: &mut Trial,
    rng: &mut StdRng,
    backend: Backend,
) -> Result<()> {
    match backend {
        Backend::Redis | Backend::Redlock => {
            let count = if backend == Backend::Redis {
                1
            } else {
                super::env::REDIS_NODES
            };
            let i = rng.random_range(0..count);
            if rng.random_bool(0.5) {
                let server = &mut env.redis()[i];
                tokio::task::block_in_place(|| {
                    server.kill();
                    server.restart()
                })?;
                t.fault(format!("redis {} killed and restarted empty", i + 1));
            } else {
                let jump = t.ttl + Duration::from_millis(500);
                if let Some(clock) = env.redis()[i].clock() {
                    clock.jump_ahead(jump)?;
                }
                t.fault(format!(
                    "redis {}'s clock jumps {} ms ahead",
                    i + 1,
                    jump.as_millis()
                ));
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..1000))).await;
                if let Some(clock) = env.redis()[i].clock() {
                    clock.set_ms(0)?;
                }
                t.fault(format!("redis {}'s clock set right", i + 1));
            }
        }
        _ => {
            let i = rng.random_range(0..env.server_count(backend));
            let id = i + 1;
            let hold = Duration::from_millis(rng.random_range(500..2500));
            let pid = env.server_pid(backend, i);
            if rng.random_bool(0.5) || pid.is_none() {
                env.kill_server(backend, i);
                t.fault(format!("server {id} killed (kill -9)"));
                tokio::time::sleep(hold).await;
                env.start_server(backend, i)?;
                t.fault(format!("server {id} restarted"));
            } else if let Some(pid) = pid {
                let pid = Pid::from_raw(pid as i32);
                kill(pid, Signal::SIGSTOP)?;
                t.fault(format!("server {id} paused (SIGSTOP)"));
                tokio::time::sleep(hold).await;
                kill(pid, Signal::SIGCONT)?;
                t.fault(format!("server {id} resumed"));
            }
        }
    }
    Ok(())
}
