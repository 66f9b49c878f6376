//! What a lease's operations return: [`LeaseLostError`] (no longer valid) and
//! [`ReleaseError`] (a release that could not be confirmed).

use uuid::Uuid;

use super::{Epoch, LossReason};
use crate::etcd::EtcdError;

/// The lease is no longer valid: lost, or past its local deadline. Permanent for this lease.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the lease on session {session_id} at epoch {epoch} is no longer valid")]
pub struct LeaseLostError {
    /// The session.
    pub session_id: Uuid,
    /// The lease's epoch.
    pub epoch: Epoch,
    /// Why it was lost; `None` when its deadline passed and the loss is not yet recorded.
    pub reason: Option<LossReason>,
}

/// How a lease that is no longer valid reads in a message: its loss reason, or that its
/// deadline passed before a loss was recorded.
pub(crate) fn lease_state(reason: Option<LossReason>) -> String {
    match reason {
        Some(reason) => format!("lost ({reason})"),
        None => "past its validity deadline".to_owned(),
    }
}

/// [`Lease::release`](crate::Lease::release) could not confirm the delete of the owner key.
/// The lease is released locally all the same; the delete is retried in the background.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The guarded delete failed; it is retried in the background until confirmed or the node
    /// lease is gone. Transient.
    #[error("the owner key's delete is deferred to the background")]
    Deferred(#[source] EtcdError),
}
