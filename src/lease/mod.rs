//! Session leases: one live owner per session, fenced by a revision epoch.
//!
//! A [`Lease`] is held by the node that acquired a session through
//! [`Store::acquire_lease`](crate::Store::acquire_lease). Its [`Epoch`] is the owner key's
//! `create_revision`: every acquisition creates the key anew, at a higher revision, so epochs
//! strictly increase across handovers and fence stale owners wherever a write compares them.
//!
//! A lease is valid while its node lease is valid: attaching a key to the node lease renews
//! nothing, so [`Lease::is_valid`] is the node lease's local deadline (see `Validity`), checked
//! without I/O, and false for good once the lease is lost. [`Lease::lost`] resolves with the
//! first [`LossReason`] that applies:
//!
//! | reason | what told |
//! | --- | --- |
//! | [`Released`](LossReason::Released) | [`Lease::release`], or the handle was dropped |
//! | [`Revoked`](LossReason::Revoked) | the watch saw the owner key deleted by someone else (or the node lease revoked, which deletes it) |
//! | [`Overtaken`](LossReason::Overtaken) | the watch saw the owner key created anew: another owner, a newer epoch |
//! | [`Expired`](LossReason::Expired) | the local validity deadline passed without a renewal |
//! | [`KeepaliveFailed`](LossReason::KeepaliveFailed) | etcd answered a keepalive saying the node lease is gone |
//! | [`StoreClosed`](LossReason::StoreClosed) | the [`Store`](crate::Store) was closed or dropped |
//! | [`PermissionDenied`](LossReason::PermissionDenied) | etcd refused the owner watch the namespace's owner keys: the store's user lacks the permission |
//!
//! The journal and object GC receive only an [`Ownership`]: the same session, epoch, validity
//! and loss signal, and a [`guard`](Ownership::guard) that makes an etcd transaction
//! conditional on still owning, but no way to release the lease.

pub(crate) mod error;
mod handle;
mod ownership;
mod state;
pub(crate) mod validity;

use std::fmt;

pub use error::{LeaseLostError, ReleaseError};
pub use handle::Lease;
pub(crate) use handle::Releaser;
pub use ownership::Ownership;
pub use state::Lost;
pub(crate) use state::{LeaseState, NodeLease};
pub use validity::MarginError;

/// A lease's epoch: the etcd revision at which its owner key was created. Strictly increasing
/// across the owners of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch as a number.
    pub fn get(self) -> u64 {
        self.0
    }

    pub(crate) fn revision(self) -> i64 {
        self.0 as i64
    }

    /// The epoch of an owner key created at `revision` (etcd revisions are never negative).
    pub(crate) fn from_revision(revision: i64) -> Self {
        Self(revision.max(0) as u64)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a lease was lost. The first reason that applies wins; it never changes afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// Released by its holder ([`Lease::release`] or dropping the handle).
    Released,
    /// The owner key was deleted by someone else, or the node lease was revoked.
    Revoked,
    /// Another owner created the owner key anew (a newer epoch).
    Overtaken,
    /// The local validity deadline passed without a renewal.
    Expired,
    /// etcd said the node lease is gone when it was renewed.
    KeepaliveFailed,
    /// The store that held the lease was closed.
    StoreClosed,
    /// etcd denies the store's user the namespace's owner keys (its roles do not cover the
    /// namespace), so the store can no longer learn who owns its sessions: every lease of the
    /// store is lost, and its acquisitions fail with the permission error.
    PermissionDenied,
}

impl LossReason {
    /// Every reason, in the order they are declared.
    pub const ALL: [LossReason; 7] = [
        LossReason::Released,
        LossReason::Revoked,
        LossReason::Overtaken,
        LossReason::Expired,
        LossReason::KeepaliveFailed,
        LossReason::StoreClosed,
        LossReason::PermissionDenied,
    ];

    /// The reason's one name, in snake case: the `reason` label of `leasehold_losses_total`,
    /// the sidecar's `Lost.reason` and `loss` metadata; its [`Display`](fmt::Display) is the
    /// same words, spaced.
    pub fn label(self) -> &'static str {
        match self {
            LossReason::Released => "released",
            LossReason::Revoked => "revoked",
            LossReason::Overtaken => "overtaken",
            LossReason::Expired => "expired",
            LossReason::KeepaliveFailed => "keepalive_failed",
            LossReason::StoreClosed => "store_closed",
            LossReason::PermissionDenied => "permission_denied",
        }
    }
}

impl fmt::Display for LossReason {
    /// The [`label`](LossReason::label)'s words, spaced: `keepalive failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, word) in self.label().split('_').enumerate() {
            if at > 0 {
                f.write_str(" ")?;
            }
            f.write_str(word)?;
        }
        Ok(())
    }
}
