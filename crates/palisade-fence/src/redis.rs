//! Fencing for a value in Redis: one Lua script compares the token and writes.
//!
//! For a resource `R`, the value lives at key `R` and the highest accepted token
//! at [`token_key`]`(R)` = `R:fence-token`. [`fenced_set`] sends one `EVAL` (not
//! `EVALSHA`: a server restarted without persistence has lost its script cache, and
//! one round trip is all it costs). Redis runs a script atomically, so the
//! comparison, the token advance and the write cannot interleave with another
//! client's.
//!
//! Limits: the guarantee is only as durable as Redis. Without `appendfsync always`
//! a crash can lose the latest token and let a stale holder in; after an
//! asynchronous failover a replica may hold an older token (the way Redisson's
//! `RFencedLock` tokens can go backwards). In Redis Cluster, give the resource a
//! hash tag (`{acct:7}`) so both keys land in the same slot. Writes that bypass the
//! script are not fenced.

use ::redis::aio::ConnectionLike;
use palisade_core::FencingToken;

use crate::fence::Admitted;
use crate::resource::{ResourceError, validate_resource};
use crate::verify::{TokenVerifier, VerifyError};

/// Compares ARGV[1] with the token at KEYS[1]; if not lower, stores it and writes
/// ARGV[2] at KEYS[2]. Returns `{1, previous-or-false}` or `{0, highest}`.
///
/// Tokens travel as decimal strings and are compared by length, then digit by
/// digit: Lua numbers are doubles, which would round tokens above 2^53.
const SCRIPT: &str = r"
local function lower(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local token = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current then
  if not string.match(current, '^[1-9][0-9]*$') then
    return redis.error_reply('palisade: ' .. KEYS[1] .. ' does not hold a fencing token')
  end
  if lower(token, current) then
    return {0, current}
  end
end
redis.call('SET', KEYS[1], token)
redis.call('SET', KEYS[2], ARGV[2])
return {1, current}
";

/// Why a fenced Redis write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RedisFenceError {
    /// The token is lower than the one stored for the resource; nothing written.
    #[error("stale fencing token {presented}: the resource has already accepted token {highest}")]
    StaleToken {
        /// The token the write presented.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },
    /// The resource name breaks the naming rules; nothing was sent.
    #[error(transparent)]
    InvalidResource(#[from] ResourceError),
    /// Redis reported an error (connection, or a token key holding a non-token).
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Redis answered something the script never returns.
    #[error("unexpected reply from redis: {0}")]
    UnexpectedReply(String),
    /// The token is above the resource's highest and the lock service did not
    /// vouch for it ([`fenced_set_verified`]); nothing was written.
    #[error(transparent)]
    NotBelieved(#[from] VerifyError),
}

/// The key holding the highest accepted token of `resource`.
pub fn token_key(resource: &str) -> String {
    format!("{resource}:fence-token")
}

fn parse_token(raw: &str) -> Result<FencingToken, RedisFenceError> {
    raw.parse()
        .map_err(|_| RedisFenceError::UnexpectedReply(format!("{raw:?} is not a fencing token")))
}

/// Sets the value of `resource` to `value` if `token` is not lower than the highest
/// token accepted for it, advancing that token — atomically, in one round trip.
///
/// # Errors
/// [`RedisFenceError::StaleToken`] (nothing written),
/// [`RedisFenceError::InvalidResource`], [`RedisFenceError::Redis`].
pub async fn fenced_set<C: ConnectionLike>(
    conn: &mut C,
    resource: &str,
    token: FencingToken,
    value: &[u8],
) -> Result<Admitted, RedisFenceError> {
    validate_resource(resource)?;
    let (accepted, other): (i64, Option<String>) = ::redis::cmd("EVAL")
        .arg(SCRIPT)
        .arg(2)
        .arg(token_key(resource))
        .arg(resource)
        .arg(token.to_string())
        .arg(value)
        .query_async(conn)
        .await?;
    let other = other.as_deref().map(parse_token).transpose()?;
    match (accepted, other) {
        (1, previous) => Ok(Admitted { token, previous }),
        (0, Some(highest)) => Err(RedisFenceError::StaleToken {
            presented: token,
            highest,
        }),
        (n, o) => Err(RedisFenceError::UnexpectedReply(format!("[{n}, {o:?}]"))),
    }
}

/// [`fenced_set`], believing a token above the resource's highest only once
/// `verifier` has it from the lock service as a grant of `lock`
/// ([`crate::verify`]: one question per new token). The question comes before
/// the script, which still makes the decisive check.
///
/// # Errors
/// As [`fenced_set`], plus [`RedisFenceError::NotBelieved`].
pub async fn fenced_set_verified<C: ConnectionLike>(
    conn: &mut C,
    verifier: &TokenVerifier,
    lock: &str,
    resource: &str,
    token: FencingToken,
    value: &[u8],
) -> Result<Admitted, RedisFenceError> {
    let highest = highest_token(conn, resource).await?;
    if highest.is_none_or(|h| token > h) {
        verifier.verify(lock, token).await?;
    }
    fenced_set(conn, resource, token, value).await
}

/// The highest token accepted for `resource`, `None` if none yet.
///
/// # Errors
/// [`RedisFenceError::InvalidResource`], [`RedisFenceError::Redis`], and
/// [`RedisFenceError::UnexpectedReply`] if the token key holds a non-token.
pub async fn highest_token<C: ConnectionLike>(
    conn: &mut C,
    resource: &str,
) -> Result<Option<FencingToken>, RedisFenceError> {
    validate_resource(resource)?;
    let raw: Option<String> = ::redis::cmd("GET")
        .arg(token_key(resource))
        .query_async(conn)
        .await?;
    raw.as_deref().map(parse_token).transpose()
}
