//! Joining: which of the listed hosts count in the shares once this host has settled (see the
//! [module docs](super#joining)).

use std::collections::BTreeSet;

/// The hosts that count in the shares, as this host sees them once it has settled: every
/// settled host (under `{ns}/hosts/`), and the hosts that were still settling (under
/// `{ns}/joining/`) when this one settled, until they settle or go. So hosts started together
/// count each other from the first share any of them takes, and a host that starts settling
/// later counts only once it has settled: one that joins and leaves within its settle period
/// moves nothing.
#[derive(Debug, Default)]
pub(super) struct Members {
    /// The settling hosts seen when this host settled, by the host key each will have; `None`
    /// before the first count.
    expected: Option<BTreeSet<Vec<u8>>>,
}

/// A host's key (under `{ns}/hosts/`, the form a settling host's is given too) and what it
/// says of its share.
pub(super) type Listed<Q> = (Vec<u8>, Q);

impl Members {
    /// The hosts counted in the shares, sorted by host key: `hosts` (settled), and those of
    /// `joining` (settling) that were settling at the first count. Called only once this host
    /// has settled.
    pub(super) fn count<Q>(
        &mut self,
        hosts: Vec<Listed<Q>>,
        joining: Vec<Listed<Q>>,
    ) -> Vec<Listed<Q>> {
        let expected = self
            .expected
            .get_or_insert_with(|| joining.iter().map(|(key, _)| key.clone()).collect());
        expected.retain(|key| joining.iter().any(|(settling, _)| settling == key));
        let mut counted = hosts;
        counted.extend(
            joining
                .into_iter()
                .filter(|(key, _)| expected.contains(key)),
        );
        counted.sort_by(|a, b| a.0.cmp(&b.0));
        counted.dedup_by(|a, b| a.0 == b.0);
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::{Listed, Members};

    fn listed(keys: &[&str]) -> Vec<Listed<()>> {
        keys.iter()
            .map(|key| (key.as_bytes().to_vec(), ()))
            .collect()
    }

    fn keys(counted: &[Listed<()>]) -> Vec<&str> {
        counted
            .iter()
            .map(|(key, _)| std::str::from_utf8(key).unwrap())
            .collect()
    }

    #[test]
    fn hosts_settling_at_the_first_count_count_until_they_settle_or_go() {
        let mut members = Members::default();
        // Started together: b and c still settle when a has settled.
        let first = members.count(listed(&["a"]), listed(&["c", "b"]));
        assert_eq!(keys(&first), ["a", "b", "c"]);
        // b settles; c is still expected.
        let later = members.count(listed(&["a", "b"]), listed(&["c"]));
        assert_eq!(keys(&later), ["a", "b", "c"]);
        // c goes before it settles, then comes back: it counts only once settled.
        assert_eq!(
            keys(&members.count(listed(&["a", "b"]), vec![])),
            ["a", "b"]
        );
        assert_eq!(
            keys(&members.count(listed(&["a", "b"]), listed(&["c"]))),
            ["a", "b"]
        );
        assert_eq!(
            keys(&members.count(listed(&["a", "b", "c"]), vec![])),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn a_host_joining_after_the_first_count_counts_only_once_settled() {
        let mut members = Members::default();
        assert_eq!(
            keys(&members.count(listed(&["a", "b"]), vec![])),
            ["a", "b"]
        );
        // A flapping host: seen settling, gone, seen settling again.
        for _ in 0..3 {
            assert_eq!(
                keys(&members.count(listed(&["a", "b"]), listed(&["0"]))),
                ["a", "b"]
            );
            assert_eq!(
                keys(&members.count(listed(&["a", "b"]), vec![])),
                ["a", "b"]
            );
        }
        // A settled host counts at once, in key order.
        assert_eq!(
            keys(&members.count(listed(&["0", "a", "b"]), vec![])),
            ["0", "a", "b"]
        );
    }
}
