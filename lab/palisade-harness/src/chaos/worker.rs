//! One client of a drill, in its own process so the harness can stop it with
//! SIGSTOP like a long GC pause. It takes [`Command`]s as JSON lines on stdin and
//! reports [`Report`]s as JSON lines on stdout, each event stamped with
//! `CLOCK_MONOTONIC` (shared by every process on the machine, so the harness can
//! merge them with its own stamps and the store's journal).
//!
//! The protected resource is a counter in the fenced object store: an increment
//! reads it (a fenced read when fencing is on) and writes `read + 1` with the
//! lock's token. The write's body names the client, the lock and the values, so
//! the store's journal alone tells the harness every write it decided on.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use palisade_chaos::{EventKind, Holding};
use palisade_client::TlsOptions;
use palisade_core::lock::BoxFuture;
use palisade_core::machine::Claim;
use palisade_core::{FencedLease, FencedLocks, LeaseState, LockError, LockOptions};
use palisade_fence::client::{StoreAddr, request};
use palisade_fence::journal::monotonic_us;
use palisade_redis::{RedisGuard, Redlock, RedlockConfig};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::backends::{self, BackendUrl, SessionSpec};

/// The lock services a drill can test: which servers the drill starts. A
/// worker reaches a correctness lock only through the backend registry
/// ([`crate::backends`]) and the [`FencedLocks`] trait; the drill starts and
/// breaks its servers only through its testkit launcher
/// ([`palisade_testkit::servers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// One Redis instance (`SET NX PX`): an efficiency lock, no token.
    Redis,
    /// Redlock over five Redis instances: an efficiency lock, no token.
    Redlock,
    /// A correctness backend of the registry (by its place in it): every
    /// grant has a fencing token.
    Fenced(usize),
}

/// Every backend, in report order: the efficiency locks, then the registry's.
static ALL: std::sync::LazyLock<Vec<Backend>> = std::sync::LazyLock::new(|| {
    [Backend::Redis, Backend::Redlock]
        .into_iter()
        .chain((0..backends::REGISTRY.len()).map(Backend::Fenced))
        .collect()
});

impl Backend {
    /// Every backend, in report order.
    pub fn all() -> &'static [Backend] {
        &ALL
    }

    /// The correctness-lock backends (tokens, leaders).
    pub fn fenced() -> &'static [Backend] {
        &ALL[2..]
    }

    /// The Palisade server.
    pub fn palisade() -> Backend {
        Self::by_name(palisade_client::DESCRIPTOR.name).expect("registered")
    }

    /// The backend called `name` (`redis`, `zookeeper`, …).
    pub fn by_name(name: &str) -> Option<Backend> {
        ALL.iter().copied().find(|b| b.name() == name)
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Redlock => "redlock",
            Backend::Fenced(i) => backends::REGISTRY[i].name,
        }
    }

    /// Whether grants carry a fencing token the store can check.
    pub fn has_tokens(self) -> bool {
        matches!(self, Backend::Fenced(_))
    }
}

impl ValueEnum for Backend {
    fn value_variants<'a>() -> &'a [Self] {
        &ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl Serialize for Backend {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// `palisade chaos-worker` (started by `palisade chaos`).
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This client's number in the drill (1, 2, …).
    #[arg(long)]
    pub client: u32,
    /// The lock service.
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// Redis and Redlock: the servers' URLs, as this client reaches them.
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Correctness locks: the backend's URL (`palisade://…`, `zk://…`, …), as
    /// this client reaches it.
    #[arg(long)]
    pub url: Option<String>,
    /// Palisade: `ADVERTISED=DIALLED` pairs, so a leader named by a follower is
    /// reached through this client's proxy too.
    #[arg(long, value_delimiter = ',')]
    pub address_map: Vec<String>,
    /// The fenced object store, `HOST:PORT`, as this client reaches it.
    #[arg(long)]
    pub store: String,
    /// Present the token on reads and writes (the store checks it).
    #[arg(long)]
    pub fenced: bool,
    /// Lease: the Redis key's TTL, or the correctness lock's session TTL.
    #[arg(long)]
    pub ttl_ms: u64,
    /// Redlock's per-node timeout (default: derived from the TTL).
    #[arg(long)]
    pub node_timeout_ms: Option<u64>,
    /// Redlock's delayed-restart rule: ignore nodes younger than this.
    #[arg(long)]
    pub min_uptime_ms: Option<u64>,
    /// TLS: the drill's CA. The store is reached over HTTPS, and with
    /// `--cert/--key` the Palisade cluster over TLS too.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Palisade with TLS: this client's certificate.
    #[arg(long, requires_all = ["ca", "key"])]
    pub cert: Option<PathBuf>,
    /// Palisade with TLS: the key of `--cert`.
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
}

/// What the harness asks a worker to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Acquire `lock`, waiting up to `wait_ms`.
    Acquire {
        /// The lock.
        lock: String,
        /// How long to wait for it.
        wait_ms: u64,
        /// What to claim on it (a recipe; the Palisade server only).
        #[serde(default)]
        claim: Claim,
    },
    /// Increment the counter at `key` under the held lock.
    Increment {
        /// The store key.
        key: String,
        /// What to do between the read and the write.
        #[serde(default)]
        between: Between,
    },
    /// Release the held lock.
    Release,
    /// Exit.
    Exit,
}

/// What a worker does between reading the counter and writing it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Between {
    /// Nothing.
    #[default]
    Nothing,
    /// Report [`Report::Pausing`] and stop itself (SIGSTOP) until SIGCONT: the
    /// essay's GC pause, after the lease check and before the write.
    Stop,
    /// Report [`Report::Ready`] and wait for a `go` line on stdin, so the harness
    /// can put a fault on the network before the write is sent.
    Hold,
}

/// What a worker tells the harness.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Report {
    /// Something for the history, at `at_us` on `CLOCK_MONOTONIC`.
    Event {
        /// When.
        at_us: u64,
        /// What.
        kind: EventKind,
    },
    /// About to stop itself.
    Pausing,
    /// Read the counter; waiting for `go` before writing.
    Ready,
    /// The command finished; `ok` says whether it did what was asked.
    Done {
        /// Success.
        ok: bool,
        /// In words.
        detail: String,
    },
}

/// The body of a counter write: enough for the store's journal to tell the story.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CounterWrite {
    /// The writing client.
    pub client: u32,
    /// The lock it believed it held.
    pub lock: String,
    /// The value it read.
    pub read: i64,
    /// The value it wrote.
    pub wrote: i64,
}

fn say(report: &Report) {
    // One line per report; stdout is line-buffered, and the harness reads lines.
    if let Ok(line) = serde_json::to_string(report) {
        println!("{line}");
    }
}

fn event(kind: EventKind) {
    say(&Report::Event {
        at_us: monotonic_us(),
        kind,
    });
}

fn done(ok: bool, detail: impl Into<String>) {
    say(&Report::Done {
        ok,
        detail: detail.into(),
    });
}

/// Microseconds on `CLOCK_MONOTONIC` of an `Instant` (std's `Instant` is that
/// clock on Linux, but offers no absolute value).
fn instant_us(at: Instant) -> u64 {
    let now = Instant::now();
    let now_us = monotonic_us();
    if at >= now {
        now_us + (at - now).as_micros() as u64
    } else {
        now_us.saturating_sub((now - at).as_micros() as u64)
    }
}

enum Locker {
    Redis(Redlock),
    /// A correctness lock: the URL, the session settings, and the session once
    /// opened (`None` again after it was found dead).
    Fenced {
        url: BackendUrl,
        spec: Box<SessionSpec>,
        session: Option<Box<dyn FencedLocks>>,
    },
}

impl Locker {
    /// Drops a session known to be dead, so the next acquire opens a new one.
    fn forget_session_if(&mut self, gone: bool) {
        if let Locker::Fenced { session, .. } = self
            && gone
        {
            *session = None;
        }
    }
}

/// A granted correctness lease, shared with the task that watches its guarantee.
type SharedLease = Arc<Mutex<Option<Box<dyn FencedLease>>>>;

enum Held {
    Redis(RedisGuard),
    Fenced {
        lease: SharedLease,
        token: u64,
        /// A semaphore permit's slot: each slot guards a resource of its own.
        slot: Option<u32>,
        watcher: tokio::task::JoinHandle<()>,
    },
}

impl Held {
    fn token(&self) -> Option<u64> {
        match self {
            Held::Redis(_) => None,
            Held::Fenced { token, .. } => Some(*token),
        }
    }

    /// The store key this hold writes under `key`: the key itself, or for a
    /// permit its slot's own (`KEY/slot-N`).
    fn resource(&self, key: &str) -> String {
        match self {
            Held::Fenced {
                slot: Some(slot), ..
            } => format!("{key}/slot-{slot}"),
            _ => key.to_owned(),
        }
    }

    fn remaining(&self) -> Duration {
        match self {
            Held::Redis(g) => g.remaining(),
            Held::Fenced { lease, .. } => lease
                .lock()
                .expect("poisoned")
                .as_ref()
                .map_or(Duration::ZERO, |l| l.remaining()),
        }
    }
}

/// Runs the worker until `exit` or the end of stdin.
pub async fn run(a: WorkerArgs) -> Result<i32> {
    let ttl = Duration::from_millis(a.ttl_ms);
    let mut locker = match a.backend {
        Backend::Redis | Backend::Redlock => {
            let config = RedlockConfig {
                node_timeout: a.node_timeout_ms.map(Duration::from_millis),
                min_uptime: a.min_uptime_ms.map(Duration::from_millis),
                retry_count: u32::MAX,
                retry_delay: Duration::from_millis(50),
                retry_jitter: Duration::from_millis(50),
                ..RedlockConfig::default()
            };
            Locker::Redis(Redlock::new(&a.servers, config)?)
        }
        Backend::Fenced(_) => {
            let url: BackendUrl = a
                .url
                .as_deref()
                .context("--url is needed for a correctness-lock backend")?
                .parse()?;
            let mut spec = SessionSpec {
                ttl,
                request_timeout: Some(Duration::from_millis(500)),
                label: Some(format!("drill client {}", a.client)),
                ..SessionSpec::default()
            };
            if let (Some(ca), Some(cert), Some(key)) = (&a.ca, &a.cert, &a.key) {
                spec.tls = Some(TlsOptions::from_files(ca, Some((cert, key)))?.into());
            }
            for pair in &a.address_map {
                let (from, to) = pair
                    .split_once('=')
                    .with_context(|| format!("--address-map {pair:?}: expected A=B"))?;
                spec.address_map.insert(from.to_owned(), to.to_owned());
            }
            Locker::Fenced {
                url,
                spec: Box::new(spec),
                session: None,
            }
        }
    };
    let mut held: Option<(String, Held)> = None;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let command: Command = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                done(false, format!("bad command {line:?}: {e}"));
                continue;
            }
        };
        match command {
            Command::Acquire {
                lock,
                wait_ms,
                claim,
            } => {
                if let Some((name, h)) = held.take() {
                    let (_, gone) = release(&name, h).await;
                    locker.forget_session_if(gone);
                }
                let wait = Duration::from_millis(wait_ms);
                match acquire(&mut locker, &lock, &claim, ttl, wait).await {
                    Ok(h) => {
                        held = Some(h);
                        done(true, "held");
                    }
                    Err(why) => done(false, why),
                }
            }
            Command::Increment { key, between } => match &held {
                Some((lock, h)) => {
                    let (ok, detail) = increment(&a, lock, h, &key, between, &mut lines).await?;
                    done(ok, detail);
                }
                None => done(false, "not holding a lock"),
            },
            Command::Release => match held.take() {
                Some((name, h)) => {
                    let (ok, gone) = release(&name, h).await;
                    locker.forget_session_if(gone);
                    done(ok, if ok { "released" } else { "release refused" });
                }
                None => done(false, "not holding a lock"),
            },
            Command::Exit => break,
        }
    }
    // Leave without releasing: a drill's client may be a superseded holder, and a
    // clean exit must not change what the servers decide.
    if let Some((_, Held::Fenced { lease, watcher, .. })) = held {
        watcher.abort();
        std::mem::forget(lease.lock().expect("poisoned").take());
    }
    if let Locker::Fenced { session, .. } = locker {
        std::mem::forget(session);
    }
    Ok(0)
}

async fn acquire(
    locker: &mut Locker,
    lock: &str,
    claim: &Claim,
    ttl: Duration,
    wait: Duration,
) -> Result<(String, Held), String> {
    event(EventKind::AcquireInvoke { lock: lock.into() });
    match locker {
        Locker::Redis(_) if *claim != Claim::Lock => {
            event(EventKind::AcquireFail { lock: lock.into() });
            Err(format!("Redis has no {} recipe", claim.shape()))
        }
        Locker::Redis(redlock) => {
            let mut options = palisade_redis::AcquireOptions::new(ttl);
            options.wait = Some(wait);
            match redlock.acquire(lock, &options).await {
                Ok(guard) => {
                    let valid_until = instant_us(Instant::now() + guard.remaining());
                    event(EventKind::AcquireOk {
                        lock: lock.into(),
                        token: None,
                        valid_until_us: Some(valid_until),
                        holding: Holding::Lock,
                    });
                    Ok((lock.to_owned(), Held::Redis(guard)))
                }
                Err(e) => {
                    event(EventKind::AcquireFail { lock: lock.into() });
                    Err(e.to_string())
                }
            }
        }
        Locker::Fenced { url, spec, session } => {
            // A session that died (paused past its TTL, cut off) cannot be revived:
            // open a new one, as an application would.
            if session.is_none() {
                match backends::connect(url, spec).await {
                    Ok(s) => *session = Some(s),
                    Err(e) => {
                        event(EventKind::AcquireFail { lock: lock.into() });
                        return Err(format!("cannot open a session: {e}"));
                    }
                }
            }
            let Some(s) = session.as_ref() else {
                return Err("no session".into());
            };
            let options = LockOptions {
                wait,
                claim: claim.clone(),
                ..LockOptions::default()
            };
            match s.acquire(lock, &options).await {
                // The backends refuse a grant that arrives after its guarantee
                // (`GrantTooLate`); this catches one whose guarantee ran out
                // between that check and here, so the history never shows a
                // hold its client could know it did not have.
                Ok(lease) if lease.remaining().is_zero() => {
                    event(EventKind::AcquireFail { lock: lock.into() });
                    let _ = lease.release().await;
                    Err("granted after the guarantee ran out".into())
                }
                Ok(lease) => {
                    let token = lease.token().get();
                    let slot = matches!(claim, Claim::Permit { .. }).then(|| lease.slot());
                    event(EventKind::AcquireOk {
                        lock: lock.into(),
                        token: Some(token),
                        valid_until_us: None,
                        holding: Holding::of(claim, lease.slot()),
                    });
                    let lost = lease.lost();
                    let lease: SharedLease = Arc::new(Mutex::new(Some(lease)));
                    let watcher =
                        tokio::spawn(watch_guarantee(lock.to_owned(), lost, lease.clone()));
                    Ok((
                        lock.to_owned(),
                        Held::Fenced {
                            lease,
                            token,
                            slot,
                            watcher,
                        },
                    ))
                }
                Err(e) => {
                    let why = e.to_string();
                    let kind = match e {
                        // The outcome of the request is not known.
                        LockError::Unavailable { .. } => {
                            EventKind::AcquireUnknown { lock: lock.into() }
                        }
                        _ => EventKind::AcquireFail { lock: lock.into() },
                    };
                    if matches!(e, LockError::Unavailable { .. } | LockError::SessionExpired) {
                        *session = None;
                    }
                    event(kind);
                    Err(why)
                }
            }
        }
    }
}

/// Reports `LeaseLost` when the guarantee runs out, stamped when it ran out — not
/// when this process noticed, which after a pause is much later: the history
/// records what a careful client could have known.
async fn watch_guarantee(lock: String, lost: BoxFuture<'static, ()>, lease: SharedLease) {
    let until = || {
        lease
            .lock()
            .expect("poisoned")
            .as_ref()
            .map(|l| l.guaranteed_until())
    };
    let mut last_good = until().unwrap_or_else(Instant::now);
    let mut lost = std::pin::pin!(lost);
    loop {
        tokio::select! {
            () = &mut lost => break,
            () = tokio::time::sleep(Duration::from_millis(5)) => {
                if let Some(u) = until()
                    && u > Instant::now()
                {
                    last_good = u;
                }
            }
        }
    }
    let ended = last_good.min(Instant::now());
    say(&Report::Event {
        at_us: instant_us(ended),
        kind: EventKind::LeaseLost { lock },
    });
}

/// Releases `h`; reports whether the backend confirmed it, and whether the
/// session that held it is gone (a lost lease: the next acquire opens a new one).
async fn release(lock: &str, h: Held) -> (bool, bool) {
    event(EventKind::ReleaseInvoke { lock: lock.into() });
    let (ok, session_gone) = match h {
        Held::Redis(g) => (g.release().await.is_ok(), false),
        Held::Fenced { lease, watcher, .. } => {
            watcher.abort();
            let taken = lease.lock().expect("poisoned").take();
            match taken {
                Some(l) => {
                    let gone = l.state() == LeaseState::Lost;
                    (l.release().await.is_ok(), gone)
                }
                None => (false, true),
            }
        }
    };
    if ok {
        event(EventKind::ReleaseOk { lock: lock.into() });
    }
    (ok, session_gone)
}

async fn increment(
    a: &WorkerArgs,
    lock: &str,
    h: &Held,
    key: &str,
    between: Between,
    lines: &mut Lines<BufReader<Stdin>>,
) -> Result<(bool, String)> {
    // The lease check an application makes before touching the resource.
    if h.remaining().is_zero() {
        return Ok((false, "the lease ran out before the write".into()));
    }
    let token = if a.fenced { h.token() } else { None };
    let store = match &a.ca {
        Some(ca) => StoreAddr::tls(&a.store, ca)?,
        None => StoreAddr::plain(&a.store),
    };
    let key = &h.resource(key);
    let read = request("GET", &store, key, token, "").await?;
    let value = match read.status {
        200 => {
            serde_json::from_str::<CounterWrite>(&read.body)
                .with_context(|| format!("counter body {:?}", read.body))?
                .wrote
        }
        404 => 0,
        409 => return Ok((false, "fenced read refused: stale token".into())),
        s => bail!("store answered {s} to a read: {}", read.body),
    };
    match between {
        Between::Nothing => {}
        Between::Stop => {
            say(&Report::Pausing);
            kill(Pid::this(), Signal::SIGSTOP)?;
        }
        Between::Hold => {
            say(&Report::Ready);
            lines.next_line().await?;
        }
    }
    let body = serde_json::to_string(&CounterWrite {
        client: a.client,
        lock: lock.to_owned(),
        read: value,
        wrote: value + 1,
    })?;
    // An unfenced store ignores the token but the API requires one; efficiency
    // locks have none, so they present 1.
    let presented = h.token().unwrap_or(1);
    let reply = request("PUT", &store, key, Some(presented), &body).await?;
    Ok(match reply.status {
        200 => (true, "accepted".into()),
        409 => (false, "rejected: stale token".into()),
        s => bail!("store answered {s} to a write: {}", reply.body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend in the registry without a launcher could not be drilled
    /// or benchmarked; a launcher without a backend would start servers
    /// nothing can lock on.
    #[test]
    fn every_registered_backend_has_a_launcher_and_no_launcher_is_stray() {
        for d in backends::REGISTRY {
            assert!(
                palisade_testkit::servers::launcher(d.name).is_some(),
                "{} has no testkit launcher",
                d.name
            );
        }
        for l in palisade_testkit::servers::LAUNCHERS {
            assert!(
                backends::by_name(l.backend).is_some(),
                "launcher {} names no registered backend",
                l.backend
            );
        }
        let names: Vec<_> = Backend::all().iter().map(|b| b.name()).collect();
        assert_eq!(
            names,
            [
                "redis",
                "redlock",
                "palisade",
                "zookeeper",
                "etcd",
                "postgres"
            ]
        );
        assert_eq!(Backend::palisade().name(), "palisade");
        assert_eq!(Backend::by_name("zookeeper"), Some(Backend::Fenced(1)));
    }
}
