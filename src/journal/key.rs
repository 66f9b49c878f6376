//! Idempotency keys: what makes an append exactly-once across retries.
//!
//! A caller names an append with a request id of its own ([`IdempotencyKey::new`]). The
//! journal writes the id's digest into every record of the append (record format version 2,
//! see the [encoding](super#encoding)), so that the journal itself, not a process's memory,
//! says whether an append with that id is in it. The digest is the first 16 bytes of the id's
//! SHA-256: two distinct ids of one journal share a digest with odds of about `n² / 2¹²⁹` for
//! `n` ids (below one in 10²¹ for a billion ids), and a caller cannot make one collide on
//! purpose short of some 2⁶⁴ hashes.

/// The digest of a caller's request id, written into every record of the append it names
/// ([`Journal::append_with_key`](crate::Journal::append_with_key)), so that the journal itself
/// says whether such an append is in it. The digest is the first 16 bytes of the id's SHA-256:
/// two distinct ids of one journal share one with odds of about `n² / 2¹²⁹` for `n` ids (below
/// one in 10²¹ for a billion ids), and making two collide on purpose takes some 2⁶⁴ hashes.
/// Cheap to copy; two keys are equal when their ids are.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey([u8; KEY_LEN]);

/// The length of a key as records carry it.
pub(crate) const KEY_LEN: usize = 16;

impl IdempotencyKey {
    /// The key of request id `id`: the first 16 bytes of its SHA-256.
    ///
    /// ```
    /// use leasehold::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("order-7/step-3");
    /// assert_eq!(key, IdempotencyKey::new(b"order-7/step-3"));
    /// assert_ne!(key, IdempotencyKey::new("order-7/step-4"));
    /// ```
    pub fn new(id: impl AsRef<[u8]>) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, id.as_ref());
        let mut key = [0; KEY_LEN];
        key.copy_from_slice(&digest.as_ref()[..KEY_LEN]);
        Self(key)
    }

    /// The key as records carry it.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The key whose bytes records carry.
    pub(crate) fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdempotencyKey({self})")
    }
}

impl std::fmt::Display for IdempotencyKey {
    /// The key in hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_first_half_of_the_ids_sha256() {
        // SHA-256("abc") = ba7816bf8f01cfea414140de5dae2223 b00361a396177a9cb410ff61f20015ad
        assert_eq!(
            IdempotencyKey::new("abc").to_string(),
            "ba7816bf8f01cfea414140de5dae2223"
        );
        assert_eq!(IdempotencyKey::new("").as_bytes().len(), KEY_LEN);
    }
}
