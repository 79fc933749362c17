//! One Redis node: its connection and the three commands the lock algorithm needs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use palisade_core::InputError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};

use crate::tally::Answer;

/// Deletes the key only if it still holds our value, so a holder whose lease ran
/// out can never delete the next holder's lock.
///
/// Sent with `EVAL`, not `EVALSHA`: a node restarted without persistence has lost
/// its script cache, and the `NOSCRIPT` fallback would cost two more round trips
/// exactly when a release must be quick. The script is ~100 bytes.
const RELEASE: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("del", KEYS[1])
else
  return 0
end"#;

/// Resets the expiry only if the key still holds our value: an expired lock that
/// someone else took is never extended on their behalf.
const EXTEND: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("pexpire", KEYS[1], ARGV[2])
else
  return 0
end"#;

/// What we learnt of a node's uptime, and when, on our monotonic clock.
#[derive(Debug, Clone)]
struct UptimeSample {
    uptime: Duration,
    sampled_at: Instant,
}

/// A Redis node as the lock algorithm sees it.
///
/// The connection is made lazily and re-made after a connection error, so a node
/// that was down when the manager started is used as soon as it is back. A server
/// restart always breaks the TCP connection, so a fresh connection is also the
/// moment to re-read the node's uptime for the delayed-restart rule.
pub(crate) struct Node {
    /// The URL with any password removed, for messages.
    pub display: String,
    client: redis::Client,
    /// Cloning a multiplexed connection is cheap; the lock is held only to clone.
    conn: Mutex<Option<MultiplexedConnection>>,
    uptime: Mutex<Option<UptimeSample>>,
    /// The delayed-restart rule: a node up for less than this is not asked to
    /// grant or extend. Its `INFO server` is read on every new connection.
    min_uptime: Option<Duration>,
    /// Why the last request to this node did not get an answer (refused
    /// connection, timeout, an error reply); `None` after one that did. Named in
    /// a failed round's error, so a person sees which node failed and why.
    last_failure: Mutex<Option<String>>,
}

impl Node {
    pub fn new(url: &str, min_uptime: Option<Duration>) -> Result<Node, InputError> {
        let parsed = url::Url::parse(url).map_err(|e| {
            InputError::Invalid(format!(
                "redis node URL {url:?}: {e}; expected redis://HOST:PORT"
            ))
        })?;
        if !matches!(parsed.scheme(), "redis" | "rediss") || parsed.host_str().is_none() {
            return Err(InputError::Invalid(format!(
                "redis node URL {url:?}: expected redis://HOST:PORT"
            )));
        }
        let client = redis::Client::open(url)
            .map_err(|e| InputError::Invalid(format!("redis node URL {url:?}: {e}")))?;
        let mut display = parsed.clone();
        if display.password().is_some() {
            let _ = display.set_password(Some("***"));
        }
        Ok(Node {
            display: display.to_string(),
            client,
            conn: Mutex::new(None),
            uptime: Mutex::new(None),
            min_uptime,
            last_failure: Mutex::new(None),
        })
    }

    /// The cached connection, or a new one.
    pub async fn connection(
        &self,
        connect_timeout: Duration,
    ) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self.conn.lock().expect("poisoned").as_ref() {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            // Our callers bound every request themselves (the per-node timeout).
            .set_response_timeout(None);
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        if self.min_uptime.is_some() {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            // Redis reports whole seconds, the difference of two truncated
            // wall-clock seconds: it can overstate the real uptime by up to one
            // second. The rule must never count a node too early, so a second
            // is taken off.
            let uptime = info_field(&info, "uptime_in_seconds")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|s| Duration::from_secs(s.saturating_sub(1)))
                .unwrap_or(Duration::ZERO);
            *self.uptime.lock().expect("poisoned") = Some(UptimeSample {
                uptime,
                sampled_at: Instant::now(),
            });
        }
        *self.conn.lock().expect("poisoned") = Some(conn.clone());
        Ok(conn)
    }

    /// The node's uptime now, extrapolated on our monotonic clock from the last
    /// sample; `None` if never sampled (never connected).
    pub fn uptime(&self) -> Option<Duration> {
        let sample = self.uptime.lock().expect("poisoned").clone()?;
        Some(sample.uptime + sample.sampled_at.elapsed())
    }

    fn forget_connection_after(&self, err: &redis::RedisError) {
        if err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error() {
            self.conn.lock().expect("poisoned").take();
        }
    }

    /// Runs one request with the per-node timeout and classifies the answer.
    /// With `check_uptime`, a node younger than the minimum uptime is not sent
    /// the request: the check comes after connecting, so a node is never asked
    /// before its uptime is known.
    async fn ask<F, Fut>(&self, timeout: Duration, check_uptime: bool, request: F) -> Answer
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<bool>>,
    {
        let attempt = async {
            let conn = self.connection(timeout).await?;
            if check_uptime
                && let Some(min) = self.min_uptime
                && self.uptime().is_none_or(|u| u < min)
            {
                return Ok(None);
            }
            request(conn).await.map(Some)
        };
        let timed_out = || format!("no answer within {timeout:?}");
        let (answer, failure) = match tokio::time::timeout(timeout, attempt).await {
            Err(_) => (Answer::TimedOut, Some(timed_out())),
            Ok(Ok(None)) => (Answer::Ineligible, None),
            Ok(Ok(Some(true))) => (Answer::Granted, None),
            Ok(Ok(Some(false))) => (Answer::Refused, None),
            // The client library's own connect timeout is the per-node timeout too.
            Ok(Err(e)) if e.is_timeout() => (Answer::TimedOut, Some(timed_out())),
            Ok(Err(e)) => {
                tracing::debug!(node = %self.display, error = %e, "redis request failed");
                self.forget_connection_after(&e);
                let why = if e.is_connection_refusal() {
                    "connection refused".to_owned()
                } else {
                    e.to_string()
                };
                (Answer::Failed, Some(why))
            }
        };
        *self.last_failure.lock().expect("poisoned") = failure;
        answer
    }

    /// `URL: why` for a node whose last request got no answer.
    pub fn last_failure(&self) -> Option<String> {
        let why = self.last_failure.lock().expect("poisoned").clone()?;
        Some(format!("{}: {why}", self.display))
    }

    /// `SET key value NX PX ttl`: granted when the key was free.
    pub async fn try_set(
        &self,
        timeout: Duration,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Answer {
        self.ask(timeout, true, |mut c| async move {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl.as_millis() as u64)
                .query_async(&mut c)
                .await?;
            Ok(set.is_some())
        })
        .await
    }

    /// Compare-and-delete: granted when our value was there and is now gone.
    pub async fn release(&self, timeout: Duration, key: &str, value: &str) -> Answer {
        self.ask(timeout, false, |mut c| async move {
            let n: i64 = redis::cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(key)
                .arg(value)
                .query_async(&mut c)
                .await?;
            Ok(n == 1)
        })
        .await
    }

    /// Compare-and-pexpire: granted when our value was there and now expires
    /// `ttl` from the node's receipt of the request.
    pub async fn extend(&self, timeout: Duration, key: &str, value: &str, ttl: Duration) -> Answer {
        self.ask(timeout, true, |mut c| async move {
            let n: i64 = redis::cmd("EVAL")
                .arg(EXTEND)
                .arg(1)
                .arg(key)
                .arg(value)
                .arg(ttl.as_millis() as u64)
                .query_async(&mut c)
                .await?;
            Ok(n == 1)
        })
        .await
    }
}

/// The value of `field` in the text of an `INFO` reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim())
    })
}
