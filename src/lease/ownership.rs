//! The narrow, read-only view of a lease.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp};
use uuid::Uuid;

use super::{Epoch, LeaseState, LossReason, Lost};
use crate::lease::LeaseLostError;

/// A read-only view of a session's ownership: session, epoch, validity, the loss signal, and a
/// guard for etcd transactions. It has no way to release the lease; that stays with the
/// [`Lease`](super::Lease) handle's holder.
///
/// ```compile_fail
/// # async fn f(ownership: leasehold::Ownership) {
/// ownership.release().await; // an ownership view cannot release the lease
/// # }
/// ```
#[derive(Clone)]
pub struct Ownership {
    state: Arc<LeaseState>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("session", &self.state.session)
            .field("epoch", &self.state.epoch)
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Ownership {
    pub(crate) fn new(state: Arc<LeaseState>) -> Self {
        Self { state }
    }

    /// The session owned.
    pub fn session_id(&self) -> Uuid {
        self.state.session
    }

    /// The epoch of the ownership.
    pub fn epoch(&self) -> Epoch {
        self.state.epoch
    }

    /// Whether the ownership is held and inside its local validity deadline (no I/O).
    pub fn is_valid(&self) -> bool {
        self.state.is_valid()
    }

    /// Resolves when the ownership is lost.
    pub fn lost(&self) -> Lost {
        self.state.lost()
    }

    /// Why the ownership was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.state.loss_reason()
    }

    /// `Ok` while valid; else the typed error a refused operation reports.
    pub fn check(&self) -> Result<(), LeaseLostError> {
        if self.is_valid() {
            Ok(())
        } else {
            Err(LeaseLostError {
                session_id: self.state.session,
                epoch: self.state.epoch,
                reason: self.state.loss_reason(),
            })
        }
    }

    /// The owner key, `{ns}/owners/{session}`.
    pub fn owner_key(&self) -> &str {
        &self.state.owner_key
    }

    /// An etcd compare that holds exactly while this ownership's owner key exists at this
    /// epoch: `create_revision(owner key) == epoch`. Put it in a transaction's `when` to make
    /// the transaction's writes conditional on still owning the session.
    pub fn guard(&self) -> Compare {
        Compare::create_revision(
            self.state.owner_key.as_str(),
            CompareOp::Equal,
            self.state.epoch.revision(),
        )
    }
}
