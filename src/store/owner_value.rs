//! The value of an owner key: who wrote it, for which attempt.
//!
//! ```text
//! leasehold-owner/1 {store id} {nonce} {node name}
//! ```
//!
//! The store id names the [`Store`](crate::store::Store) instance (a fresh UUID per process), so a
//! store recognizes its own keys even when two processes share a node name. The nonce names the
//! acquisition attempt: an acquisition whose outcome is unknown is resolved by reading it
//! back. It is a version 7 UUID, so it also tells when the acquisition was made (by the
//! acquiring node's clock; for people, never for decisions). The node name is for people.

use uuid::Uuid;

const TAG: &str = "leasehold-owner/1";

/// A decoded owner value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnerValue {
    pub(crate) store: Uuid,
    pub(crate) nonce: Uuid,
    pub(crate) node: String,
}

impl OwnerValue {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{TAG} {} {} {}",
            self.store.hyphenated(),
            self.nonce.hyphenated(),
            self.node
        )
        .into_bytes()
    }

    /// `None` for a value leasehold did not write (never an error: foreign values are held
    /// by someone else, that is all).
    pub(crate) fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let rest = text.strip_prefix(TAG)?.strip_prefix(' ')?;
        let mut parts = rest.splitn(3, ' ');
        let store = parts.next()?.parse().ok()?;
        let nonce = parts.next()?.parse().ok()?;
        let node = parts.next()?.to_owned();
        Some(Self { store, nonce, node })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_foreign_values() {
        let value = OwnerValue {
            store: Uuid::new_v4(),
            nonce: Uuid::new_v4(),
            node: "node a".into(),
        };
        assert_eq!(OwnerValue::decode(&value.encode()), Some(value));
        for foreign in [
            &b""[..],
            b"leasehold-owner/1",
            b"x y z",
            b"leasehold-owner/1 a b c",
            b"\xff",
        ] {
            assert_eq!(OwnerValue::decode(foreign), None);
        }
    }
}
