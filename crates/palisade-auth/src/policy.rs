//! Who may do what: the policy file (`palisade serve --auth FILE`, and
//! `palisade fence-store --auth FILE` for the fenced object store), read at
//! start and again on SIGHUP.
//!
//! ```toml
//! # Roles grant rights on lock-name prefixes ("" is every name).
//! [roles.jobs]
//! lock = ["jobs/"]      # acquire, release, keep-alive, close
//! read = ["jobs/"]      # get, list, check-token
//!
//! [roles.ops]
//! read = [""]
//! admin = true          # membership changes
//!
//! # Optional bounds per identity (the largest among its roles applies; a
//! # role that sets none leaves the node's --max-*-per-identity default).
//! [roles.batch]
//! lock = ["batch/"]
//! max_sessions = 50     # sessions open at once
//! max_calls = 200       # calls in flight, waiting acquires included
//!
//! # A user is a client certificate's name, or a bearer token (stored as its
//! # SHA-256, lower-case hex: `palisade certs token NAME` prints both).
//! [[users]]
//! name = "nightly"
//! roles = ["jobs"]
//!
//! [[users]]
//! name = "ci"
//! token_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
//! roles = ["jobs", "ops"]
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The most users, roles, prefixes or tokens one policy may hold: a policy is
/// written by hand; anything larger is a mistake.
pub const MAX_ENTRIES: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    roles: BTreeMap<String, RoleSpec>,
    #[serde(default)]
    users: Vec<UserSpec>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct RoleSpec {
    #[serde(default)]
    lock: Vec<String>,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    max_sessions: Option<usize>,
    #[serde(default)]
    max_calls: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserSpec {
    name: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    token_sha256: Vec<String>,
}

/// What one identity may do: the union of its roles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Prefixes of the names it may lock.
    pub lock: Vec<String>,
    /// Prefixes of the names it may read.
    pub read: Vec<String>,
    /// Whether it may change membership.
    pub admin: bool,
    /// Sessions it may hold open at once, if a role bounds them (else the
    /// node's default applies).
    pub max_sessions: Option<usize>,
    /// Calls it may have in flight, if a role bounds them (else the node's
    /// default applies).
    pub max_calls: Option<usize>,
}

impl Grants {
    /// Everything (a cluster without a policy file).
    pub fn all() -> Self {
        Grants {
            lock: vec![String::new()],
            read: vec![String::new()],
            admin: true,
            max_sessions: None,
            max_calls: None,
        }
    }

    /// Whether it may lock `name`.
    pub fn may_lock(&self, name: &str) -> bool {
        self.lock.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// Whether it may read `name`.
    pub fn may_read(&self, name: &str) -> bool {
        self.read.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// A parsed policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    users: HashMap<String, Grants>,
    /// SHA-256 of a bearer token → the user it authenticates.
    tokens: HashMap<[u8; 32], String>,
}

/// Digest of a bearer token, as the policy stores it.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Policy {
    /// Reads and checks a policy file.
    ///
    /// # Errors
    /// A message naming the file and what is wrong in it.
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("policy file {}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("policy file {}: {e}", path.display()))
    }

    /// Parses a policy from TOML text.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.roles.len() > MAX_ENTRIES || file.users.len() > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} roles or users"));
        }
        let mut policy = Policy::default();
        for user in &file.users {
            if user.name.is_empty() {
                return Err("a user has an empty name".into());
            }
            let mut grants = Grants::default();
            for role in &user.roles {
                let spec = file
                    .roles
                    .get(role)
                    .ok_or_else(|| format!("user {:?}: no role named {role:?}", user.name))?;
                grants.lock.extend(spec.lock.iter().cloned());
                grants.read.extend(spec.read.iter().cloned());
                grants.admin |= spec.admin;
                for (limit, of_role, what) in [
                    (&mut grants.max_sessions, spec.max_sessions, "max_sessions"),
                    (&mut grants.max_calls, spec.max_calls, "max_calls"),
                ] {
                    if of_role == Some(0) {
                        return Err(format!("role {role:?}: {what} must be at least 1"));
                    }
                    // Roles add rights, so the most generous bound wins.
                    *limit = (*limit).max(of_role);
                }
            }
            if grants.lock.len() > MAX_ENTRIES || grants.read.len() > MAX_ENTRIES {
                return Err(format!("user {:?}: too many prefixes", user.name));
            }
            if policy.users.insert(user.name.clone(), grants).is_some() {
                return Err(format!("user {:?} is listed twice", user.name));
            }
            for hex_digest in &user.token_sha256 {
                let digest: [u8; 32] = hex::decode(hex_digest)
                    .ok()
                    .and_then(|d| d.try_into().ok())
                    .ok_or_else(|| {
                        format!(
                            "user {:?}: token_sha256 {hex_digest:?} is not 64 hex digits",
                            user.name
                        )
                    })?;
                if let Some(other) = policy.tokens.insert(digest, user.name.clone()) {
                    return Err(format!(
                        "one token is given to both {other:?} and {:?}",
                        user.name
                    ));
                }
            }
        }
        Ok(policy)
    }

    /// The user a bearer token authenticates, if any.
    pub fn user_of_token(&self, token: &str) -> Option<&str> {
        self.tokens.get(&token_digest(token)).map(String::as_str)
    }

    /// What `user` may do (`None`: not in the policy, so nothing).
    pub fn grants(&self, user: &str) -> Option<&Grants> {
        self.users.get(user)
    }

    /// How many users it names.
    pub fn user_count(&self) -> usize {
        self.users.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
        [roles.jobs]
        lock = ["jobs/"]
        read = ["jobs/"]
        [roles.ops]
        read = [""]
        admin = true
        [[users]]
        name = "nightly"
        roles = ["jobs"]
        [[users]]
        name = "ci"
        token_sha256 = ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
        roles = ["ops"]
    "#;

    #[test]
    fn roles_grant_by_prefix() {
        let p = Policy::parse(EXAMPLE).unwrap();
        let nightly = p.grants("nightly").unwrap();
        assert!(nightly.may_lock("jobs/nightly"));
        assert!(!nightly.may_lock("billing/ledger"));
        assert!(!nightly.may_read("billing/ledger"));
        assert!(!nightly.admin);
        let ci = p.grants("ci").unwrap();
        assert!(ci.may_read("billing/ledger") && ci.admin && !ci.may_lock("jobs/x"));
        assert!(p.grants("stranger").is_none());
    }

    #[test]
    fn the_most_generous_role_bounds_an_identity() {
        let p = Policy::parse(
            r#"
            [roles.few]
            lock = ["a/"]
            max_sessions = 2
            [roles.more]
            lock = ["b/"]
            max_sessions = 5
            max_calls = 7
            [roles.free]
            read = [""]
            [[users]]
            name = "both"
            roles = ["few", "more", "free"]
            [[users]]
            name = "few"
            roles = ["few"]
            [[users]]
            name = "unbounded"
            roles = ["free"]
        "#,
        )
        .unwrap();
        let both = p.grants("both").unwrap();
        assert_eq!((both.max_sessions, both.max_calls), (Some(5), Some(7)));
        let few = p.grants("few").unwrap();
        assert_eq!((few.max_sessions, few.max_calls), (Some(2), None));
        let free = p.grants("unbounded").unwrap();
        assert_eq!((free.max_sessions, free.max_calls), (None, None));
    }

    #[test]
    fn tokens_are_matched_by_digest() {
        let p = Policy::parse(EXAMPLE).unwrap();
        assert_eq!(p.user_of_token("test"), Some("ci")); // sha256("test")
        assert_eq!(p.user_of_token("Test"), None);
        assert_eq!(p.user_of_token(""), None);
    }

    #[test]
    fn mistakes_are_refused_with_a_reason() {
        for (bad, why) in [
            ("[[users]]\nname = \"\"", "empty name"),
            (
                "[[users]]\nname = \"a\"\nroles = [\"nope\"]",
                "no role named",
            ),
            (
                "[[users]]\nname = \"a\"\n[[users]]\nname = \"a\"",
                "listed twice",
            ),
            (
                "[[users]]\nname = \"a\"\ntoken_sha256 = [\"xyz\"]",
                "not 64 hex digits",
            ),
            ("[roles.r]\nlokc = [\"x\"]", "unknown field"),
            (
                "[roles.r]\nmax_sessions = 0\n[[users]]\nname = \"a\"\nroles = [\"r\"]",
                "at least 1",
            ),
        ] {
            let err = Policy::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
