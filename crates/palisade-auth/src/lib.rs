//! Who a Palisade caller is and what it may do, shared by everything that
//! authenticates callers: the lock server's client listener and the fenced
//! resources (`palisade fence-store`), so that one policy file and one
//! certificate authority serve both.
//!
//! - [`policy`]: the policy file — roles granting rights by name prefix, users
//!   named by certificate or bearer token (stored as a digest).
//! - [`principal`]: the name a verified certificate gives its holder.

pub mod policy;
pub mod principal;

pub use policy::{Grants, Policy, token_digest};
pub use principal::{CLIENT_URI_PREFIX, NODE_URI_PREFIX, Principal, principal_of};
