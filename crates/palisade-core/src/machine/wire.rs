//! Serde glue for vocabulary types defined elsewhere in the crate that do not
//! derive serde themselves.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::InputError;

/// A [`crate::FencingToken`] on the wire: its raw `u64`. Decoding refuses `0`,
/// which no grant ever carries, so a corrupt entry cannot smuggle one in.
pub mod token {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::FencingToken;

    pub fn serialize<S: Serializer>(token: &FencingToken, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(token.get())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FencingToken, D::Error> {
        let raw = u64::deserialize(d)?;
        FencingToken::new(raw).ok_or_else(|| D::Error::custom("fencing token 0 is never issued"))
    }
}

/// An optional [`crate::FencingToken`] on the wire: `null` or its raw `u64`.
pub mod opt_token {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::FencingToken;

    pub fn serialize<S: Serializer>(token: &Option<FencingToken>, s: S) -> Result<S::Ok, S::Error> {
        match token {
            Some(t) => s.serialize_some(&t.get()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FencingToken>, D::Error> {
        match Option::<u64>::deserialize(d)? {
            None => Ok(None),
            Some(raw) => FencingToken::new(raw)
                .map(Some)
                .ok_or_else(|| D::Error::custom("fencing token 0 is never issued")),
        }
    }
}

/// Mirror of [`InputError`] so a refused command's reason survives the trip from
/// the leader's state machine to the client intact, variant and all.
#[derive(Serialize, Deserialize)]
#[serde(remote = "InputError", rename_all = "snake_case")]
pub enum InputErrorDef {
    EmptyName,
    NameTooLong { len: usize },
    NameHasControlChar { at: usize },
    TtlOutOfRange { ttl: Duration },
    Invalid(String),
}
