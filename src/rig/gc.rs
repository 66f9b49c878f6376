//! The ownership view object GC receives.

use std::sync::Arc;

use etcd_client::{Txn, TxnOp};
use uuid::Uuid;

use crate::etcd::EtcdError;
use crate::etcd::write::{self, Written};
use crate::lease::{Epoch, LeaseLostError, Lost, Ownership};
use crate::store::StoreShared;

/// A guarded delete of object GC failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    /// The lease is lost or invalid: refused locally, nothing sent. Permanent for this view.
    #[error("GC refused: the lease is not valid")]
    LeaseLost(#[source] LeaseLostError),
    /// etcd's compare failed: the session is no longer owned at this epoch. Nothing was
    /// deleted. Permanent for this view.
    #[error("GC delete of {key} refused: session {session_id} is no longer owned at epoch {epoch}")]
    NotOwner {
        /// The key that was not deleted.
        key: String,
        /// The session.
        session_id: Uuid,
        /// The epoch of the view.
        epoch: Epoch,
    },
    /// etcd failed the request (re-sent while the lease was valid); see its class. A delete
    /// is idempotent: retrying is safe.
    #[error("GC delete failed")]
    Etcd(#[source] EtcdError),
}

/// What object GC gets of a live session: session, epoch, validity, and deletes made
/// conditional on still owning the session. It cannot release the lease.
///
/// ```compile_fail
/// # async fn f(gc: leasehold::rig::GcView) {
/// gc.release().await; // a GC view has no way to release the lease
/// # }
/// ```
#[derive(Clone)]
pub struct GcView {
    ownership: Ownership,
    store: Arc<StoreShared>,
}

impl std::fmt::Debug for GcView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcView")
            .field("ownership", &self.ownership)
            .finish_non_exhaustive()
    }
}

impl GcView {
    pub(crate) fn new(ownership: Ownership, store: Arc<StoreShared>) -> Self {
        Self { ownership, store }
    }

    /// The session.
    pub fn session_id(&self) -> Uuid {
        self.ownership.session_id()
    }

    /// The epoch.
    pub fn epoch(&self) -> Epoch {
        self.ownership.epoch()
    }

    /// Whether the session is still owned (local check, no I/O).
    pub fn is_valid(&self) -> bool {
        self.ownership.is_valid()
    }

    /// Resolves when ownership is lost.
    pub fn lost(&self) -> Lost {
        self.ownership.lost()
    }

    /// Deletes `key` only while the session is owned at this epoch: one transaction guarded
    /// by the owner key's `create_revision`, sent through the crate's one write path (re-sent
    /// while the lease is valid).
    pub async fn delete(&self, key: impl Into<String>) -> Result<(), GcError> {
        let key = key.into();
        self.ownership.check().map_err(GcError::LeaseLost)?;
        let txn = Txn::new()
            .when([self.ownership.guard()])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let store = &self.store;
        let written = write::send(
            &store.connection,
            &store.write,
            "gc delete",
            &txn,
            None,
            || self.ownership.is_valid(),
            &store.shutdown,
        )
        .await;
        let deleted = match written {
            Written::Replied(response) => response.succeeded(),
            Written::Unknown(error)
            | Written::Failed(error)
            | Written::Refused { error, .. }
            | Written::Resolved { unknown: error, .. } => return Err(GcError::Etcd(error)),
        };
        if deleted {
            Ok(())
        } else {
            Err(GcError::NotOwner {
                key,
                session_id: self.session_id(),
                epoch: self.epoch(),
            })
        }
    }
}
