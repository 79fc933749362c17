//! The resource side of fencing: the part that makes a fencing token protect
//! anything.
//!
//! A lock's fencing token only helps if the resource checks it. A holder can be
//! paused (GC, page faults, a stopped VM) past its lease; meanwhile the lock passes
//! to someone else with a higher token, and the paused holder then wakes up and
//! writes as if it still held the lock. No lock service can stop that write — it is
//! already in flight. Only the resource can: it must take an active part, remember
//! the highest token it has accepted, and reject any write whose token has gone
//! backwards (the essay's client 1 writing with token 33 after client 2 wrote with
//! 34). An *equal* token is accepted: it is the same holder writing again under the
//! same grant, since a correctness lock never hands one token to two grants.
//!
//! The check and the write must be one atomic step. Checking first and writing
//! later reopens the race (34 checked, 35 checked, 35 writes, 34 writes last), so
//! every variant here offers a form that runs the protected write inside the same
//! critical section or transaction as the check.
//!
//! | variant | check + write are atomic by | survives a crash | limits |
//! |---|---|---|---|
//! | [`Fence`] | a per-resource mutex ([`Fence::admit_with`]) | no | memory grows with distinct resources (entries are never forgotten: forgetting one would let a stale holder in) |
//! | [`DurableFence`] | one redb write transaction, fsynced ([`DurableFence::admit_with`]) | yes | one writer at a time per database file; the file is locked by one process |
//! | [`ObjectStore`] / [`http`] | a [`DurableFence`] per database, a resource per key | yes | see below |
//! | [`postgres`] | one PostgreSQL transaction holding the resource's row lock | as PostgreSQL | tokens ≤ `i64::MAX`; only writes made through the helper are fenced |
//! | [`redis`] | one Lua script (`EVAL`) | only as Redis persists | tokens can go backwards on Redis data loss or asynchronous failover |
//!
//! Every variant gives the same answer: [`Admitted`] (with the previous highest
//! token), or a stale-token error carrying the presented and the highest token.
//! Resource names are 1..=[`MAX_RESOURCE_LEN`] bytes without control characters.
//!
//! # The fenced object store
//!
//! [`http::serve`] is an HTTP service for objects, each fenced by its own token
//! (`PUT`/`DELETE` carry a `Fencing-Token` header; `GET` returns the token of the
//! write that produced the body). A `2xx` to a write is sent only after the object
//! and its token are committed together and synced to disk. Limits:
//!
//! - keys: 1..=[`MAX_KEY_LEN`] (256) bytes of `A-Z a-z 0-9 . _ / -`, with no empty,
//!   `.` or `..` segment between slashes; otherwise `400 bad_key`;
//! - bodies: at most [`http::MAX_BODY_BYTES`] (1 MiB); otherwise `413 body_too_large`;
//! - tokens: a positive decimal integer up to `u64::MAX`; a missing token is
//!   `428 missing_token`, a malformed one `400 malformed_token`, a stale one
//!   `409 stale_token` with `presented` and `highest`;
//! - one write transaction (and one fsync) at a time for the whole store;
//! - a deleted object keeps its highest token, so a stale holder cannot recreate it;
//! - a `GET` that presents a token is a **fenced read**: the token is admitted
//!   (raising the fence, or `409` if stale) before the object is read. A
//!   read-modify-write needs it: otherwise a stale holder's write can land between
//!   the new holder's read and write and be lost, although no token went backwards.
//!
//! [`Fencing::Off`] turns the check off (every write accepted, each still recording
//! its token): the unfenced twin, to show the lost update fencing prevents.

pub mod access;
pub mod client;
pub mod durable;
pub mod fence;
pub mod http;
pub mod journal;
pub mod postgres;
pub mod redis;
pub mod resource;
pub mod store;
pub mod verify;

pub use durable::{DurableFence, StoreError};
pub use fence::{Admitted, Fence, FenceError, Fencing, TokenFence};
pub use journal::{Journal, JournalEntry};
pub use resource::{
    KeyError, MAX_KEY_LEN, MAX_RESOURCE_LEN, ObjectKey, ResourceError, validate_resource,
};
pub use store::{ObjectStore, StoredObject};
