//! Fixed sets that differ: a host given a fixed set of sessions writes a digest of it under
//! `{ns}/sets/{store}` (attached to its node lease, deleted when it leaves), and at every
//! balance tick reads the others'. A host whose set differs from this one's is reported once
//! per change (a WARN line and [`HostEvent::SetDiffers`](super::HostEvent::SetDiffers)): the
//! balance counts every host in the shares of every set, so sessions that only some hosts
//! host may go unowned while those hosts hold their share of others. Hosts that follow the
//! registry write no digest (they agree on the set by construction), nor do hosts of earlier
//! releases; neither is compared.
//!
//! The value is `leasehold-set/1 {digest, 16 hex digits} {sessions} {host nonce}`. The digest
//! is the wrapping sum of a 64-bit mix of each session id, so it is kept as sessions are added
//! and removed, in O(1), and does not depend on their order.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use etcd_client::KeyValue;
use uuid::Uuid;

use super::{HostEvent, Inner, lock};
use crate::keys::id_under;

const V1: &str = "leasehold-set/1";

/// One session's part of a set's digest (splitmix64's finalizer over both halves of its id).
pub(super) fn digest_of(session: Uuid) -> u64 {
    let (high, low) = session.as_u64_pair();
    mix(mix(high) ^ low)
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A set's digest and size, as a set key holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Digest {
    pub(super) digest: u64,
    pub(super) sessions: usize,
}

impl Digest {
    fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut fields = text.split(' ');
        if fields.next()? != V1 {
            return None;
        }
        let digest = u64::from_str_radix(fields.next()?, 16).ok()?;
        let sessions = fields.next()?.parse().ok()?;
        Some(Self { digest, sessions })
    }
}

impl Inner {
    /// What this host's set key should hold now; `None` when it follows the registry.
    pub(super) fn set_value(&self) -> Option<String> {
        if self.options.registry {
            return None;
        }
        let sessions = lock(&self.wanted).len();
        let digest = self.set_digest.load(Ordering::Acquire);
        Some(format!(
            "{V1} {digest:016x} {sessions} {}",
            self.host_value.nonce
        ))
    }

    /// Compares the other hosts' sets (the keys under `{ns}/sets/`) with this host's and
    /// reports each that differs, once per digest; `reported` remembers what was.
    pub(super) fn compare_sets(&self, listed: &[KeyValue], reported: &mut HashMap<Uuid, u64>) {
        if self.options.registry {
            return;
        }
        let prefix = self.store.namespace().sets_prefix();
        let me = self.store.id();
        let ours = self.set_digest.load(Ordering::Acquire);
        let mut differ = HashMap::new();
        for kv in listed {
            let (Some(store), Some(theirs)) =
                (id_under(&prefix, kv.key()), Digest::decode(kv.value()))
            else {
                continue;
            };
            if store == me || theirs.digest == ours {
                continue;
            }
            differ.insert(store, theirs.digest);
            if reported.get(&store) != Some(&theirs.digest) {
                tracing::warn!(
                    node = self.store.node(),
                    other = %store,
                    ours = lock(&self.wanted).len(),
                    theirs = theirs.sessions,
                    "another session host hosts a different set of sessions: the balance counts \
                     every host for every set, so sessions only some hosts host may go unowned \
                     (give every host the same set, or use the registry)"
                );
                self.emit(HostEvent::SetDiffers {
                    store,
                    sessions: theirs.sessions,
                });
            }
        }
        *reported = differ;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_independent_of_order_and_kept_by_adding_and_removing() {
        let sessions: Vec<Uuid> = (0..100u128).map(Uuid::from_u128).collect();
        let forward = sessions
            .iter()
            .fold(0u64, |d, s| d.wrapping_add(digest_of(*s)));
        let backward = sessions
            .iter()
            .rev()
            .fold(0u64, |d, s| d.wrapping_add(digest_of(*s)));
        assert_eq!(forward, backward);
        let one_less = forward.wrapping_sub(digest_of(sessions[7]));
        let without: u64 = sessions
            .iter()
            .filter(|s| **s != sessions[7])
            .fold(0u64, |d, s| d.wrapping_add(digest_of(*s)));
        assert_eq!(one_less, without);
        // Same size, another session: another digest.
        let swapped = one_less.wrapping_add(digest_of(Uuid::from_u128(1000)));
        assert_ne!(swapped, forward);
    }

    #[test]
    fn decodes_what_it_writes_and_refuses_the_rest() {
        let value = format!("{V1} {:016x} 30 {}", u64::MAX, Uuid::now_v7());
        assert_eq!(
            Digest::decode(value.as_bytes()),
            Some(Digest {
                digest: u64::MAX,
                sessions: 30
            })
        );
        for bad in [
            &b""[..],
            b"leasehold-set/2 00 1 x",
            b"leasehold-set/1 zz 1",
            b"\xff",
        ] {
            assert_eq!(Digest::decode(bad), None);
        }
    }
}
