//! The lock manager: one node (single instance) or Redlock over N nodes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::InputError;
use palisade_core::limits::{validate_name, validate_ttl};

use crate::batch::{self, BatchStats, Batcher, Item, Request};
use crate::budget::{default_drift, validity};
use crate::error::RedisLockError;
use crate::guard::RedisGuard;
use crate::node::Node;
use crate::tally::Tally;

/// How many nodes a set may have. Redlock's examples use 5; more than a few dozen
/// is a configuration mistake, not a deployment.
pub const MAX_NODES: usize = 64;

/// Settings of a [`Redlock`] that hold for every lock it takes.
#[derive(Debug, Clone)]
pub struct RedlockConfig {
    /// The time allowed to each node for each request. It must be much smaller than
    /// the TTL so a dead node cannot eat the lease. `None`: derived from the TTL of
    /// each acquisition (TTL/50, clamped to 5 ms‥500 ms and to at most TTL/2).
    pub node_timeout: Option<Duration>,
    /// The clock-drift allowance subtracted from every validity. `None`: 1 % of the
    /// TTL plus 2 ms.
    pub drift: Option<Duration>,
    /// Attempts after the first failed one. Retries are also bounded by
    /// [`AcquireOptions::wait`].
    pub retry_count: u32,
    /// Base delay between attempts.
    pub retry_delay: Duration,
    /// A random delay in `0..retry_jitter` added to each retry, so that clients that
    /// failed together do not retry together.
    pub retry_jitter: Duration,
    /// The delayed-restart rule: a node whose uptime is below this is not asked and
    /// does not count towards the majority, because a node restarted without
    /// fsync-on-every-write persistence may have forgotten locks it granted. Set it
    /// to the longest TTL in use. `None`: every node counts.
    pub min_uptime: Option<Duration>,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            node_timeout: None,
            drift: None,
            retry_count: 3,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            min_uptime: None,
        }
    }
}

/// Settings of one acquisition.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    /// The lease length written to the nodes.
    pub ttl: Duration,
    /// How long the work needs. An acquisition that leaves less validity than this
    /// is a failure: the lock is released and never handed out.
    pub work: Duration,
    /// A bound on the whole acquisition, retries included. `None`: only the retry
    /// count bounds it.
    pub wait: Option<Duration>,
}

impl AcquireOptions {
    /// A lease of `ttl`, any positive validity accepted, retries bounded by count.
    pub fn new(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            work: Duration::ZERO,
            wait: None,
        }
    }
}

/// The timings one lease works with, after defaults are filled in and checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub ttl: Duration,
    pub drift: Duration,
    pub node_timeout: Duration,
}

pub(crate) struct Inner {
    pub nodes: Arc<[Node]>,
    pub quorum: usize,
    pub config: RedlockConfig,
    /// Concurrent requests of this manager's users share pipelines.
    batcher: Arc<Batcher>,
}

impl Inner {
    pub fn timings(&self, ttl: Duration) -> Result<Timings, InputError> {
        validate_ttl(ttl)?;
        let drift = self.config.drift.unwrap_or_else(|| default_drift(ttl));
        if drift >= ttl {
            return Err(InputError::Invalid(format!(
                "drift {drift:?} must be smaller than the ttl {ttl:?}"
            )));
        }
        let node_timeout = self.config.node_timeout.unwrap_or_else(|| {
            (ttl / 50)
                .clamp(Duration::from_millis(5), Duration::from_millis(500))
                .min(ttl / 2)
        });
        if node_timeout.is_zero() || node_timeout >= ttl {
            return Err(InputError::Invalid(format!(
                "per-node timeout {node_timeout:?} must be positive and much smaller than the ttl {ttl:?}"
            )));
        }
        Ok(Timings {
            ttl,
            drift,
            node_timeout,
        })
    }

    /// Sends `request` for `key`/`value` to every node (in a batch with the
    /// other requests made meanwhile) and tallies the answers: until a majority
    /// settles the outcome, or with `wait_all` until every node answered or ran
    /// out of the per-node timeout.
    pub async fn ask(
        &self,
        request: Request,
        key: &str,
        value: &str,
        t: Timings,
        wait_all: bool,
    ) -> Tally {
        let item = Item {
            request,
            key: key.to_owned(),
            value: value.to_owned(),
        };
        batch::ask_all(
            &self.nodes,
            &self.batcher,
            item,
            t.node_timeout,
            self.quorum,
            wait_all,
        )
        .await
    }

    /// Compare-and-delete on every node, awaiting every answer (each bounded by the
    /// per-node timeout).
    pub async fn release_everywhere(
        &self,
        key: &str,
        value: &str,
        t: Timings,
    ) -> crate::NodeCounts {
        self.ask(Request::Release, key, value, t, true).await.counts
    }
}

/// A lock manager over one Redis node (single instance) or N independent masters
/// (Redlock). Cheap to clone; clones share connections.
///
/// With one node this is the classic single-instance lock: `SET key value NX PX ttl`,
/// release by compare-and-delete, extend by compare-and-pexpire. With N nodes the
/// same commands go to every node concurrently and a majority (⌊N/2⌋+1) must grant
/// within the validity. Either way the guard is an **efficiency** guard: it carries
/// no fencing token, and its safety assumes bounded pauses, bounded network delay
/// and clocks that do not jump (see the crate docs).
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

impl Redlock {
    /// A manager over the given node URLs (`redis://HOST:PORT[/DB]`). Connects
    /// lazily; see [`Redlock::connect`] to fail fast on unreachable nodes.
    ///
    /// # Errors
    /// [`RedisLockError::InvalidInput`] for no nodes, too many, a malformed URL or
    /// the same URL twice.
    pub fn new<S: AsRef<str>>(urls: &[S], config: RedlockConfig) -> Result<Self, RedisLockError> {
        if urls.is_empty() {
            return Err(InputError::Invalid("no redis nodes given".into()).into());
        }
        if urls.len() > MAX_NODES {
            return Err(InputError::Invalid(format!(
                "{} redis nodes given; the limit is {MAX_NODES}",
                urls.len()
            ))
            .into());
        }
        for (i, u) in urls.iter().enumerate() {
            if urls[..i].iter().any(|v| v.as_ref() == u.as_ref()) {
                return Err(InputError::Invalid(format!(
                    "redis node {:?} is listed twice",
                    u.as_ref()
                ))
                .into());
            }
        }
        let nodes = urls
            .iter()
            .map(|u| Node::new(u.as_ref(), config.min_uptime))
            .collect::<Result<Arc<[Node]>, _>>()?;
        let quorum = nodes.len() / 2 + 1;
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                quorum,
                config,
                batcher: Arc::default(),
            }),
        })
    }

    /// Like [`Redlock::new`], then connects to every node concurrently and fails
    /// unless a majority is reachable. Nodes that are down are retried on every
    /// later request.
    ///
    /// # Errors
    /// As [`Redlock::new`], and [`RedisLockError::Unreachable`].
    pub async fn connect<S: AsRef<str>>(
        urls: &[S],
        config: RedlockConfig,
        connect_timeout: Duration,
    ) -> Result<Self, RedisLockError> {
        let lock = Self::new(urls, config)?;
        let attempts = lock
            .inner
            .nodes
            .iter()
            .map(|n| async move { (n, n.connection(connect_timeout).await) });
        let results = futures_util::future::join_all(attempts).await;
        let errors: Vec<String> = results
            .iter()
            .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("{}: {e}", n.display)))
            .collect();
        let reachable = results.len() - errors.len();
        if reachable < lock.inner.quorum {
            return Err(RedisLockError::Unreachable {
                reachable,
                needed: lock.inner.quorum,
                errors,
            });
        }
        Ok(lock)
    }

    /// Nodes in the set.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Nodes that must grant: ⌊N/2⌋+1.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// How the requests of this manager and its clones were batched so far:
    /// concurrent requests share one pipeline per node, so with many tasks
    /// sharing a manager the mean batch (`requests / batches`) approaches the
    /// number of tasks.
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.batcher.stats()
    }

    /// Acquires `name`, retrying after jittered delays as configured.
    ///
    /// Succeeds only when a majority granted AND the validity left after the
    /// elapsed time and the drift allowance is positive and at least
    /// `options.work`. Every failed attempt is released on every node, including
    /// the nodes that did not answer.
    ///
    /// # Errors
    /// [`RedisLockError::InvalidInput`] (nothing sent),
    /// [`RedisLockError::NoQuorum`] or [`RedisLockError::ValidityExhausted`] for the
    /// last attempt.
    pub async fn acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<RedisGuard, RedisLockError> {
        validate_name(name)?;
        let t = self.inner.timings(options.ttl)?;
        if options.work >= t.ttl {
            return Err(InputError::Invalid(format!(
                "work {:?} can never fit in a ttl of {:?}",
                options.work, t.ttl
            ))
            .into());
        }
        let give_up_at = options.wait.map(|w| Instant::now() + w);
        let value = random_value()?;
        let mut attempt = 0;
        loop {
            let err = match self.attempt(name, &value, t, options.work).await {
                Ok(guard) => return Ok(guard),
                Err(e) => e,
            };
            if attempt >= self.inner.config.retry_count {
                return Err(err);
            }
            attempt += 1;
            let delay = self.inner.config.retry_delay + jitter(self.inner.config.retry_jitter);
            if give_up_at.is_some_and(|g| Instant::now() + delay >= g) {
                return Err(err);
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One round of the algorithm.
    async fn attempt(
        &self,
        name: &str,
        value: &str,
        t: Timings,
        work: Duration,
    ) -> Result<RedisGuard, RedisLockError> {
        // The start time is taken before the first request leaves, on the monotonic
        // clock: wall-clock jumps on this host cannot shorten or lengthen it.
        let start = Instant::now();
        let set = Request::Set {
            ttl_ms: t.ttl.as_millis() as u64,
        };
        let tally = self.inner.ask(set, name, value, t, false).await;
        let elapsed = start.elapsed();
        let failure = if !tally.reached() {
            RedisLockError::NoQuorum {
                needed: self.inner.quorum,
                nodes: self.inner.nodes.len(),
                counts: tally.counts,
                failures: self
                    .inner
                    .nodes
                    .iter()
                    .filter_map(|n| n.last_failure())
                    .collect(),
            }
        } else {
            match validity(t.ttl, elapsed, t.drift).filter(|v| *v >= work) {
                Some(_) => {
                    return Ok(RedisGuard::new(
                        self.clone(),
                        name.to_owned(),
                        value.to_owned(),
                        t,
                        start + (t.ttl - t.drift),
                    ));
                }
                None => RedisLockError::ValidityExhausted {
                    ttl: t.ttl,
                    elapsed,
                    drift: t.drift,
                    remaining: validity(t.ttl, elapsed, t.drift).unwrap_or_default(),
                    required: work,
                },
            }
        };
        self.inner.release_everywhere(name, value, t).await;
        Err(failure)
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field(
                "nodes",
                &self
                    .inner
                    .nodes
                    .iter()
                    .map(|n| &n.display)
                    .collect::<Vec<_>>(),
            )
            .field("quorum", &self.inner.quorum)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// 128 random bits from the operating system, hex-encoded: unique per acquisition,
/// so release and extend can tell our lock from the next holder's.
fn random_value() -> Result<String, RedisLockError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| InputError::Invalid(format!("the OS random generator failed: {e}")))?;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(32);
    for b in bytes {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    Ok(hex)
}

fn jitter(max: Duration) -> Duration {
    let max_us = max.as_micros() as u64;
    if max_us == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(getrandom::u64().unwrap_or(0) % max_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_values_are_distinct_and_128_bits() {
        let a = random_value().unwrap();
        let b = random_value().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    #[test]
    fn default_node_timeout_is_much_smaller_than_the_ttl() {
        let r = Redlock::new(&["redis://127.0.0.1:1"], RedlockConfig::default()).unwrap();
        let t = r.inner.timings(Duration::from_secs(10)).unwrap();
        assert_eq!(t.node_timeout, Duration::from_millis(200));
        assert_eq!(t.drift, Duration::from_millis(102));
        let t = r.inner.timings(Duration::from_millis(10)).unwrap();
        assert!(t.node_timeout <= Duration::from_millis(5));
    }
}
