//! The key layout of a leasehold deployment in etcd.
//!
//! Everything a deployment writes lives under one namespace prefix `{ns}/`, so tenants can be
//! isolated by etcd RBAC on the prefix and tests can share one etcd by each taking a namespace
//! of its own:
//!
//! | key | holds |
//! | --- | --- |
//! | `{ns}/owners/{session}` | the session's owner; exists while someone owns it |
//! | `{ns}/journals/{session}/tip` | the journal's last sequence number, epoch and nonce |
//! | `{ns}/journals/{session}/r/{seq:020}` | one journal record |
//! | `{ns}/journals/{session}/base` | the first sequence number a trimmed journal keeps |
//! | `{ns}/workspaces/{id}` | workspace-root ownership |
//! | `{ns}/hosts/{store}` | a live [`SessionHost`](crate::SessionHost), attached to its node lease |
//! | `{ns}/drains/{store}` | a request that the host of that store drain ([`Admin::drain`](crate::Admin::drain)), attached to its node lease |
//! | `{ns}/sets/{store}` | a digest of the fixed set of sessions that host hosts, attached to its node lease |
//! | `{ns}/moves/{session}` | a move of the session under way ([`Admin::move_session`](crate::Admin::move_session)), attached to the target's node lease |
//!
//! Owner keys have a prefix of their own so that one watch per node on `{ns}/owners/` sees
//! every ownership change and nothing else. Sequence numbers are zero-padded to 20 digits (the
//! width of `u64::MAX`) so that etcd's byte order of record keys is their numeric order.

use std::fmt;

use uuid::Uuid;

/// The longest namespace accepted, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

/// A validated namespace: the prefix under which a deployment keeps all its keys.
///
/// A namespace is 1 to [`MAX_NAMESPACE_LEN`] bytes of ASCII letters, digits, `-`, `_`, `.` and
/// `/`, with no empty `/`-separated segment (so no leading, trailing or doubled `/`). That keeps
/// `{ns}/` a prefix of exactly this deployment's keys: `a` and `a/b` may both exist, but the
/// keys of `a/b` would then lie under `a/`, so do not nest namespaces that are used at the same
/// time.
///
/// Cheap to clone (shared, not copied): every journal of a store keeps one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace(std::sync::Arc<str>);

/// A namespace string was refused; permanent: the same string is always refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid namespace {namespace:?}: {reason}")]
pub struct InvalidNamespaceError {
    /// The string that was refused.
    pub namespace: String,
    /// Why it was refused.
    pub reason: &'static str,
}

impl Namespace {
    /// The namespace used when none is configured.
    pub const DEFAULT: &'static str = "leasehold";

    /// Validates `namespace`.
    pub fn new(namespace: impl Into<String>) -> Result<Self, InvalidNamespaceError> {
        let namespace = namespace.into();
        let refuse = |reason| {
            Err(InvalidNamespaceError {
                namespace: namespace.clone(),
                reason,
            })
        };
        if namespace.is_empty() {
            return refuse("it is empty");
        }
        if namespace.len() > MAX_NAMESPACE_LEN {
            return refuse("it is longer than 128 bytes");
        }
        if !namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
        {
            return refuse("only ASCII letters, digits, '-', '_', '.' and '/' are allowed");
        }
        if namespace.split('/').any(str::is_empty) {
            return refuse("it has an empty '/'-separated segment");
        }
        Ok(Self(namespace.into()))
    }

    /// The namespace as a string, without the trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `{ns}/`: the prefix of every key of this namespace.
    pub fn prefix(&self) -> String {
        format!("{}/", self.0)
    }

    /// `{ns}/owners/`: the prefix of all owner keys, watched by every node.
    pub fn owners_prefix(&self) -> String {
        format!("{}/owners/", self.0)
    }

    /// `{ns}/owners/{session}`.
    pub fn owner_key(&self, session: Uuid) -> String {
        format!("{}/owners/{}", self.0, session.hyphenated())
    }

    /// `{ns}/journals/`: the prefix of all journals.
    pub fn journals_prefix(&self) -> String {
        format!("{}/journals/", self.0)
    }

    /// `{ns}/journals/{session}/`: everything of one journal (records, tip, base).
    pub fn journal_prefix(&self, session: Uuid) -> String {
        format!("{}/journals/{}/", self.0, session.hyphenated())
    }

    /// `{ns}/journals/{session}/base`: the first sequence number a trimmed journal keeps
    /// (absent: 1).
    pub fn base_key(&self, session: Uuid) -> String {
        format!("{}/journals/{}/base", self.0, session.hyphenated())
    }

    /// `{ns}/journals/{session}/tip`.
    pub fn tip_key(&self, session: Uuid) -> String {
        format!("{}/journals/{}/tip", self.0, session.hyphenated())
    }

    /// `{ns}/journals/{session}/r/`: the prefix of one journal's records.
    pub fn records_prefix(&self, session: Uuid) -> String {
        format!("{}/journals/{}/r/", self.0, session.hyphenated())
    }

    /// `{ns}/journals/{session}/r/{seq:020}`.
    pub fn record_key(&self, session: Uuid, seq: u64) -> String {
        format!("{}/journals/{}/r/{seq:020}", self.0, session.hyphenated())
    }

    /// `{ns}/workspaces/`: the prefix of all workspace roots.
    pub fn workspaces_prefix(&self) -> String {
        format!("{}/workspaces/", self.0)
    }

    /// `{ns}/workspaces/{id}`.
    pub fn workspace_key(&self, id: &str) -> String {
        format!("{}/workspaces/{id}", self.0)
    }

    /// `{ns}/hosts/`: the prefix of the keys of live session hosts.
    pub fn hosts_prefix(&self) -> String {
        format!("{}/hosts/", self.0)
    }

    /// `{ns}/hosts/{store}`: one live session host, attached to its store's node lease.
    pub fn host_key(&self, store: Uuid) -> String {
        format!("{}/hosts/{}", self.0, store.hyphenated())
    }

    /// `{ns}/sessions/`: the prefix of the shared session registry (see
    /// [`Admin::create_session`](crate::Admin::create_session)).
    pub fn sessions_prefix(&self) -> String {
        format!("{}/sessions/", self.0)
    }

    /// `{ns}/sessions/{session}`: one session of the registry, holding its metadata.
    pub fn session_key(&self, session: Uuid) -> String {
        format!("{}/sessions/{}", self.0, session.hyphenated())
    }

    /// `{ns}/joining/`: the prefix of the keys of session hosts that are settling (see
    /// `SessionHost`'s *Joining*), not yet counted as hosts by the others.
    pub fn joining_prefix(&self) -> String {
        format!("{}/joining/", self.0)
    }

    /// `{ns}/joining/{store}`: the session host of `store` while it settles, attached to its
    /// store's node lease. Not under `{ns}/hosts/`, where every key counts as a host.
    pub fn joining_key(&self, store: Uuid) -> String {
        format!("{}/joining/{}", self.0, store.hyphenated())
    }

    /// `{ns}/drains/{store}`: a request that the session host of `store` drain, attached to
    /// its store's node lease. Not under `{ns}/hosts/`, where every key counts as a host.
    pub fn drain_key(&self, store: Uuid) -> String {
        format!("{}/drains/{}", self.0, store.hyphenated())
    }

    /// `{ns}/sets/`: the prefix of the digests of the fixed sets session hosts host.
    pub fn sets_prefix(&self) -> String {
        format!("{}/sets/", self.0)
    }

    /// `{ns}/sets/{store}`: a digest of the fixed set of sessions the session host of `store`
    /// hosts, attached to its node lease.
    pub fn set_key(&self, store: Uuid) -> String {
        format!("{}/sets/{}", self.0, store.hyphenated())
    }

    /// `{ns}/loads/`: the prefix of the loads session hosts publish.
    pub fn loads_prefix(&self) -> String {
        format!("{}/loads/", self.0)
    }

    /// `{ns}/loads/{store}`: the load of the sessions the session host of `store` holds, and
    /// of its hottest sessions, attached to its node lease.
    pub fn load_key(&self, store: Uuid) -> String {
        format!("{}/loads/{}", self.0, store.hyphenated())
    }

    /// `{ns}/moves/`: the prefix of the moves under way, which session hosts watch.
    pub fn moves_prefix(&self) -> String {
        format!("{}/moves/", self.0)
    }

    /// `{ns}/moves/{session}`: a move of `session` to another host, attached to the target's
    /// node lease. While it exists, only the target's store may acquire the session.
    pub fn move_key(&self, session: Uuid) -> String {
        format!("{}/moves/{}", self.0, session.hyphenated())
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Self(Self::DEFAULT.into())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Namespace {
    type Err = InvalidNamespaceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The UUID a key names right under `prefix` (`{ns}/owners/{session}`, `{ns}/hosts/{store}`):
/// `None` for a key that is not under it or does not end in a UUID (a key leasehold did not
/// write).
pub(crate) fn id_under(prefix: &str, key: &[u8]) -> Option<Uuid> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .parse()
        .ok()
}

/// The end of the range that holds every key starting with `prefix` (etcd's `range_end` for a
/// prefix query): the prefix with its last byte incremented.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // A prefix of only 0xff bytes (never a valid namespace) ranges to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_nested_names() {
        for ok in ["leasehold", "tenant-a/prod", "a.b_c-1", &"x".repeat(128)] {
            assert_eq!(Namespace::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_what_would_break_the_prefix() {
        for (bad, reason) in [
            ("", "empty"),
            ("/leasehold", "segment"),
            ("leasehold/", "segment"),
            ("a//b", "segment"),
            ("has space", "ASCII"),
            ("ünï", "ASCII"),
            (&"x".repeat(129), "128"),
        ] {
            let err = Namespace::new(bad).unwrap_err();
            assert_eq!(err.namespace, bad);
            assert!(err.reason.contains(reason), "{bad:?}: {}", err.reason);
        }
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let ns = Namespace::new("t1").unwrap();
        let s = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(
            ns.owner_key(s),
            "t1/owners/01234567-89ab-cdef-0123-456789abcdef"
        );
        assert!(ns.owner_key(s).starts_with(&ns.owners_prefix()));
        assert_eq!(
            ns.tip_key(s),
            "t1/journals/01234567-89ab-cdef-0123-456789abcdef/tip"
        );
        assert_eq!(
            ns.record_key(s, 42),
            "t1/journals/01234567-89ab-cdef-0123-456789abcdef/r/00000000000000000042"
        );
        assert!(
            ns.record_key(s, u64::MAX)
                .ends_with("/r/18446744073709551615")
        );
        assert!(ns.record_key(s, 9) < ns.record_key(s, 10));
        assert!(ns.record_key(s, 0).starts_with(&ns.records_prefix(s)));
        assert_eq!(Namespace::default().prefix(), "leasehold/");
        assert_eq!(
            ns.joining_key(s),
            "t1/joining/01234567-89ab-cdef-0123-456789abcdef"
        );
        assert!(ns.joining_key(s).starts_with(&ns.joining_prefix()));
        assert!(!ns.joining_key(s).starts_with(&ns.hosts_prefix()));
        assert_eq!(
            ns.move_key(s),
            "t1/moves/01234567-89ab-cdef-0123-456789abcdef"
        );
        assert!(ns.move_key(s).starts_with(&ns.moves_prefix()));
        assert_eq!(
            ns.set_key(s),
            "t1/sets/01234567-89ab-cdef-0123-456789abcdef"
        );
        assert!(ns.set_key(s).starts_with(&ns.sets_prefix()));
    }

    #[test]
    fn prefix_end_bounds_exactly_the_prefix() {
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(prefix_end("ab"), b"ac".to_vec());
        let end = prefix_end("t1/owners/");
        assert!(b"t1/owners/zzz".as_slice() < end.as_slice());
        assert!(b"t1/ownersX".as_slice() >= end.as_slice());
    }
}
