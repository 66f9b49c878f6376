//! The owner's handle of a session lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use uuid::Uuid;

use super::{Epoch, LeaseState, LossReason, Lost, Ownership, ReleaseError};
use crate::etcd::Delete;

/// What a lease needs of the store that handed it out: its identity and span, and the two ways
/// to delete the owner key. The store implements it; a lease knows nothing else of it.
pub(crate) trait Releaser: Send + Sync {
    /// The store's instance id (one per process), as written into its owner values.
    fn id(&self) -> Uuid;
    /// The store's span, the parent of a release's.
    fn span(&self) -> &tracing::Span;
    /// Deletes the owner key of `state` (already marked released), guarded by its epoch; if
    /// that cannot be confirmed, the delete goes on in the background.
    fn release<'a>(
        &'a self,
        state: &'a Arc<LeaseState>,
    ) -> Pin<Box<dyn Future<Output = Result<(), ReleaseError>> + Send + 'a>>;
    /// Deletes `before` and then the owner key of `state` (already marked released), in the
    /// background, each confirmed before the next.
    fn release_in_background(&self, state: &Arc<LeaseState>, before: Vec<Delete>);
}

/// Ownership of one session, held by the node that acquired it.
///
/// Dropping the handle without [`release`](Self::release) releases the lease in the
/// background, so a forgotten session does not stay owned until its node dies.
pub struct Lease {
    state: Arc<LeaseState>,
    store: Arc<dyn Releaser>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("session", &self.state.session)
            .field("epoch", &self.state.epoch)
            .field("valid", &self.is_valid())
            .field("lost", &self.state.loss_reason())
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(state: Arc<LeaseState>, store: Arc<dyn Releaser>) -> Self {
        Self { state, store }
    }

    /// The session this lease owns.
    pub fn session_id(&self) -> Uuid {
        self.state.session
    }

    /// The lease's epoch: the owner key's `create_revision`.
    pub fn epoch(&self) -> Epoch {
        self.state.epoch
    }

    /// Whether the lease is held and inside its local validity deadline. No I/O, no lock: at
    /// most three atomic loads (the lease's lost flag, its node lease's lost flag and deadline)
    /// and a clock read.
    pub fn is_valid(&self) -> bool {
        self.state.is_valid()
    }

    /// Resolves when the lease is lost, with the reason; see [`Lost`].
    pub fn lost(&self) -> Lost {
        self.state.lost()
    }

    /// The reason the lease was lost, if it was.
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.state.loss_reason()
    }

    /// The owner key, `{ns}/owners/{session}`.
    pub fn owner_key(&self) -> &str {
        &self.state.owner_key
    }

    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    pub(crate) fn is_released(&self) -> bool {
        self.state.released()
    }

    /// The id of the store that handed it out.
    pub(crate) fn store_id(&self) -> Uuid {
        self.store.id()
    }

    /// A read-only view of this ownership that cannot release it: what the journal and object
    /// GC receive.
    pub fn ownership(&self) -> Ownership {
        Ownership::new(self.state.clone())
    }

    /// Releases the lease. Idempotent.
    ///
    /// The first call marks the lease lost ([`LossReason::Released`]) and resolves
    /// [`lost`](Self::lost) *before* deleting the owner key, so there is no instant at which
    /// a successor owns the session while this handle still says it is valid. The delete is
    /// guarded by `create_revision == epoch`, so it can never remove a successor's key. If the
    /// delete fails, it is retried in the background until confirmed or the node lease is gone
    /// (which deletes the key too), and this call returns [`ReleaseError::Deferred`]; later
    /// calls return `Ok(())`.
    #[tracing::instrument(
        name = "release",
        skip_all,
        parent = self.store.span(),
        fields(session = %self.session_id(), epoch = %self.epoch())
    )]
    pub async fn release(&self) -> Result<(), ReleaseError> {
        if !self.state.release() {
            return Ok(());
        }
        self.store.release(&self.state).await
    }
}

impl Lease {
    /// Releases the lease in the background, after the guarded deletes of `before` (each
    /// confirmed before the next is sent, the owner key last). False if
    /// it was released already.
    pub(crate) fn release_after(&self, before: Vec<Delete>) -> bool {
        if !self.state.release() {
            return false;
        }
        self.store.release_in_background(&self.state, before);
        true
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release_after(Vec::new());
    }
}
