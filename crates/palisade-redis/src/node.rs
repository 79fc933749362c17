//! One Redis node: its connection and the three commands the lock algorithm
//! needs, sent in batches (see `batch`).

use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use palisade_core::InputError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Value};

use crate::batch::{Item, Request};
use crate::tally::Answer;

/// A Lua script, sent by its SHA-1 (`EVALSHA`), and with its text only to a
/// node that answers `NOSCRIPT` (restarted, or its cache flushed). Hashing the
/// text on every request was ~5 % of each server's CPU in the 16-client bench.
struct Script {
    text: &'static str,
    hash: LazyLock<String>,
}

impl Script {
    fn hash(&self) -> &str {
        &self.hash
    }
}

/// Deletes the key only if it still holds our value, so a holder whose lease ran
/// out can never delete the next holder's lock.
static RELEASE: Script = Script {
    text: RELEASE_TEXT,
    hash: LazyLock::new(|| redis::Script::new(RELEASE_TEXT).get_hash().to_owned()),
};
const RELEASE_TEXT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("del", KEYS[1])
else
  return 0
end"#;

/// Resets the expiry only if the key still holds our value: an expired lock that
/// someone else took is never extended on their behalf.
static EXTEND: Script = Script {
    text: EXTEND_TEXT,
    hash: LazyLock::new(|| redis::Script::new(EXTEND_TEXT).get_hash().to_owned()),
};
const EXTEND_TEXT: &str = r#"if redis.call("get", KEYS[1]) == ARGV[1] then
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

    /// Sends a batch of requests as one pipeline, bounded by the per-node
    /// timeout, and classifies each answer (one per item, in order). A node
    /// younger than the minimum uptime is not sent the requests that need it:
    /// the check comes after connecting, so a node is never asked before its
    /// uptime is known.
    pub async fn send_batch(&self, timeout: Duration, batch: &Batch) -> Vec<Answer> {
        let items = &batch.items;
        let attempt = async {
            let mut conn = self.connection(timeout).await?;
            let eligible = self
                .min_uptime
                .is_none_or(|min| self.uptime().is_some_and(|u| u >= min));
            let sent: Vec<bool> = items
                .iter()
                .map(|i| eligible || !i.request.needs_uptime())
                .collect();
            let filtered;
            let pipe = if sent.iter().all(|s| *s) {
                &batch.pipeline
            } else {
                filtered = pipeline(items.iter().zip(&sent).filter(|(_, s)| **s).map(|(i, _)| i));
                &filtered
            };
            let mut replies: Vec<Value> = if pipe.is_empty() {
                Vec::new()
            } else {
                pipe.query_async(&mut conn).await?
            };
            // A node that lost its script cache (restarted, SCRIPT FLUSH) answers
            // NOSCRIPT: the same requests again with the script's text, which
            // also caches it for the next batches.
            let retry: Vec<usize> = replies
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Value::ServerError(e) if e.code() == "NOSCRIPT"))
                .map(|(i, _)| i)
                .collect();
            if !retry.is_empty() {
                let sent_items: Vec<&Item> = items
                    .iter()
                    .zip(&sent)
                    .filter(|(_, s)| **s)
                    .map(|(i, _)| i)
                    .collect();
                let mut again = redis::pipe();
                again.ignore_errors();
                for &i in &retry {
                    again.add_command(command(sent_items[i], true));
                }
                let answers: Vec<Value> = again.query_async(&mut conn).await?;
                for (i, answer) in retry.into_iter().zip(answers) {
                    replies[i] = answer;
                }
            }
            Ok::<_, redis::RedisError>((sent, replies))
        };
        let timed_out = || format!("no answer within {timeout:?}");
        let (answers, failure) = match tokio::time::timeout(timeout, attempt).await {
            Err(_) => (vec![Answer::TimedOut; items.len()], Some(timed_out())),
            Ok(Ok((sent, replies))) => {
                let mut replies = replies.into_iter();
                let mut failure = None;
                let answers = sent
                    .into_iter()
                    .map(|sent| {
                        if !sent {
                            return Answer::Ineligible;
                        }
                        match replies.next() {
                            Some(Value::Okay | Value::Int(1)) => Answer::Granted,
                            Some(Value::Nil | Value::Int(0)) => Answer::Refused,
                            other => {
                                let why = match other {
                                    Some(Value::ServerError(e)) => e.to_string(),
                                    other => format!("unexpected reply {other:?}"),
                                };
                                failure = Some(why);
                                Answer::Failed
                            }
                        }
                    })
                    .collect();
                (answers, failure)
            }
            // The client library's own connect timeout is the per-node timeout too.
            Ok(Err(e)) if e.is_timeout() => {
                (vec![Answer::TimedOut; items.len()], Some(timed_out()))
            }
            Ok(Err(e)) => {
                tracing::debug!(node = %self.display, error = %e, "redis request failed");
                self.forget_connection_after(&e);
                let why = if e.is_connection_refusal() {
                    "connection refused".to_owned()
                } else {
                    e.to_string()
                };
                (vec![Answer::Failed; items.len()], Some(why))
            }
        };
        *self.last_failure.lock().expect("poisoned") = failure;
        answers
    }

    /// `URL: why` for a node whose last request got no answer.
    pub fn last_failure(&self) -> Option<String> {
        let why = self.last_failure.lock().expect("poisoned").clone()?;
        Some(format!("{}: {why}", self.display))
    }
}

/// A batch of requests and the pipeline that asks a node all of them.
pub(crate) struct Batch {
    pub items: Vec<Item>,
    pipeline: redis::Pipeline,
}

impl Batch {
    pub fn new(items: Vec<Item>) -> Batch {
        let pipeline = pipeline(items.iter());
        Batch { items, pipeline }
    }
}

/// One pipeline of the items' commands; an error reply of one command is that
/// command's answer, not the whole pipeline's.
fn pipeline<'a>(items: impl Iterator<Item = &'a Item>) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for item in items {
        pipe.add_command(command(item, false));
    }
    pipe
}

/// The command of one request; scripts by their hash unless `with_text`.
fn command(item: &Item, with_text: bool) -> redis::Cmd {
    let (key, value) = (&item.key, &item.value);
    let script = |c: &mut redis::Cmd, s: &Script| {
        if with_text {
            c.arg("EVAL").arg(s.text);
        } else {
            c.arg("EVALSHA").arg(s.hash());
        }
        c.arg(1).arg(key).arg(value);
    };
    let mut c = redis::Cmd::new();
    match item.request {
        Request::Set { ttl_ms } => {
            c.arg("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
        }
        Request::Release => script(&mut c, &RELEASE),
        Request::Extend { ttl_ms } => {
            script(&mut c, &EXTEND);
            c.arg(ttl_ms);
        }
    }
    c
}

/// The value of `field` in the text of an `INFO` reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim())
    })
}
