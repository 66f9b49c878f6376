//! The composition root of a live session: lease, workspace root, journal, in that order.
//!
//! [`Rig::open`] acquires the session lease, then workspace-root ownership
//! (`{ns}/workspaces/{id}`: created only if absent, attached to the node lease, and guarded by
//! the owner compare, so only the session's current owner can take it), then opens the journal
//! (which appends the fence). The rig holds the lease: it is released when the rig shuts down
//! or is dropped, and the workspace root is released too when the session is lost.
//!
//! Taking the workspace root is one transaction through the crate's one write path:
//! `if create_revision(root) == 0 and create_revision(owner key) == epoch then put(root,
//! "{session} {epoch}", lease = node lease) else get(root)`, re-sent while the lease is valid.
//! A failed compare whose `else` read shows our session and epoch means an earlier send
//! committed. If the outcome stays unknown, the root is deleted in the background, guarded by
//! that value, before the lease is released: a root that committed unseen never blocks the
//! session's next owner.
//!
//! [`Rig::shutdown`] keeps the order that makes a handover clean: the last durable append
//! completes (the journal is closed, waiting for an append in flight), then the workspace root
//! is released, then the session lease. A successor that sees the owner key go therefore finds
//! the workspace free and the journal's tip final. When a step cannot be confirmed, and when a
//! rig is dropped, the rest happens in the background in the same order (each delete confirmed
//! before the next is sent).
//!
//! Object GC gets only a [`GcView`]: session, epoch, validity, and deletes guarded by the
//! owner compare.

mod gc;

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use uuid::Uuid;

use crate::etcd::write::Written;
use crate::etcd::{Delete, EtcdError, gets};
use crate::journal::{Journal, OpenJournalError};
use crate::lease::{Epoch, Lease, LossReason, Lost, Ownership, ReleaseError};
use crate::store::{AcquireError, Store, StoreShared};

pub use gc::{GcError, GcView};

/// Another session owns the workspace root. Transient: it is released when that session is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("workspace {workspace} is owned by another session ({holder})")]
pub struct WorkspaceHeldError {
    /// The workspace.
    pub workspace: String,
    /// What the holder wrote: its session and epoch.
    pub holder: String,
}

/// Opening or shutting down a [`Rig`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RigError {
    /// The workspace id is empty, longer than [`MAX_WORKSPACE_LEN`] (128) bytes, or has
    /// characters other than ASCII letters, digits, `-`, `_` and `.`. Permanent.
    #[error("invalid workspace id {0:?}")]
    InvalidWorkspace(String),
    /// The session lease could not be acquired.
    #[error("cannot acquire the session")]
    Acquire(#[source] AcquireError),
    /// The workspace root is owned by another session. Transient.
    #[error(transparent)]
    WorkspaceHeld(#[from] WorkspaceHeldError),
    /// The session was lost before the workspace root was taken. Permanent for this lease.
    #[error("the session was lost while opening")]
    Lost,
    /// Taking or releasing the workspace root failed at etcd; see its class. Whatever may
    /// have been written is deleted in the background, before the lease is released.
    #[error("workspace root request failed")]
    Workspace(#[source] EtcdError),
    /// The journal could not be opened.
    #[error("cannot open the journal")]
    Journal(#[source] OpenJournalError),
    /// The session lease's delete was deferred to the background.
    #[error("releasing the session")]
    Release(#[source] ReleaseError),
}

/// No load reported: a NaN's bits, which `set_load` never stores.
const NO_LOAD: u64 = u64::MAX;

/// A live session: its lease, its workspace root and its journal.
///
/// # Examples
///
/// ```no_run
/// use leasehold::{Rig, Store, StoreOptions, Uuid};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
/// let session = Uuid::new_v4();
/// // The session's lease, then the workspace root of `ws-1`, then the journal's fence.
/// let rig = Rig::open(&store, session, "ws-1").await?;
/// rig.journal().append(b"started").await?;
/// // The last append, then the workspace root, then the lease.
/// rig.shutdown().await?;
/// store.close().await;
/// # Ok(())
/// # }
/// ```
pub struct Rig {
    journal: Journal,
    /// Shared with the hook that deletes it on loss.
    workspace_key: Arc<str>,
    workspace_revision: i64,
    /// The store the session lives in: its workspace root's deletes go through it.
    store: Arc<StoreShared>,
    /// The load the work reported ([`set_load`](Self::set_load)), as `f64` bits; `NO_LOAD`
    /// until it reports one.
    load: std::sync::atomic::AtomicU64,
    // Declared last: the lease outlives the rest while fields drop.
    lease: Lease,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("session", &self.lease.session_id())
            .field("epoch", &self.lease.epoch())
            .field("workspace", &self.workspace_key)
            .finish()
    }
}

/// The longest workspace id, in bytes: 1 to 128 ASCII letters, digits, `-`, `_` and `.`.
pub const MAX_WORKSPACE_LEN: usize = 128;

fn valid_workspace(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_WORKSPACE_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Rig {
    /// Acquires `session`, then `workspace`'s root, then opens the journal.
    ///
    /// `workspace` is 1 to [`MAX_WORKSPACE_LEN`] (128) bytes of ASCII letters, digits, `-`,
    /// `_` and `.`; any other id fails with [`RigError::InvalidWorkspace`] before anything is
    /// sent.
    pub async fn open(store: &Store, session: Uuid, workspace: &str) -> Result<Self, RigError> {
        if !valid_workspace(workspace) {
            return Err(RigError::InvalidWorkspace(workspace.to_owned()));
        }
        let lease = store
            .acquire_lease(session)
            .await
            .map_err(RigError::Acquire)?;
        Self::with_lease(store, lease, workspace).await
    }

    /// Like [`open`](Self::open), with a lease already held (e.g. from a standby
    /// acquisition). On failure the lease is released (after whatever workspace root may have
    /// been taken). The workspace id is checked as for [`open`](Self::open): at most
    /// [`MAX_WORKSPACE_LEN`] (128) bytes.
    pub async fn with_lease(
        store: &Store,
        lease: Lease,
        workspace: &str,
    ) -> Result<Self, RigError> {
        if !valid_workspace(workspace) {
            return Err(RigError::InvalidWorkspace(workspace.to_owned()));
        }
        let session = lease.session_id();
        let key: Arc<str> = store.namespace().workspace_key(workspace).into();
        let value = format!("{session} {}", lease.epoch());
        let revision = match take_workspace(store, &lease, &key, &value).await {
            Ok(revision) => revision,
            Err(error) => {
                if matches!(error, RigError::Workspace(_)) {
                    // It may have committed unseen: delete it (guarded by our value) first.
                    lease.release_after(vec![Delete::holding(&*key, value)]);
                }
                return Err(error);
            }
        };
        let journal = match store.open_journal(session, Some(&lease)).await {
            Ok(journal) => journal,
            Err(error) => {
                lease.release_after(vec![Delete::created_at(&*key, revision)]);
                return Err(RigError::Journal(error));
            }
        };
        // Lost: the root is deleted in the background. Released: the rig's shutdown (or its
        // drop) deletes it before the release.
        let (shared, node, root) = (
            store.shared().clone(),
            lease.state().node.clone(),
            key.clone(),
        );
        lease.state().on_loss(move |reason| {
            if reason != LossReason::Released {
                shared.delete_in_background(vec![Delete::created_at(&*root, revision)], node);
            }
        });
        tracing::info!(%session, epoch = %lease.epoch(), %key, "session rig open");
        Ok(Self {
            journal,
            workspace_key: key,
            workspace_revision: revision,
            store: store.shared().clone(),
            load: std::sync::atomic::AtomicU64::new(NO_LOAD),
            lease,
        })
    }

    /// The session.
    pub fn session_id(&self) -> Uuid {
        self.lease.session_id()
    }

    /// The session's epoch.
    pub fn epoch(&self) -> Epoch {
        self.lease.epoch()
    }

    /// Whether the session is still owned (local check).
    pub fn is_valid(&self) -> bool {
        self.lease.is_valid()
    }

    /// Resolves when the session is lost.
    pub fn lost(&self) -> Lost {
        self.lease.lost()
    }

    /// Runs `hook` once, when the session is lost (see `LeaseState::on_loss`).
    pub(crate) fn on_loss(&self, hook: impl FnOnce(LossReason) + Send + 'static) {
        self.lease.state().on_loss(hook);
    }

    /// Reports what this session costs now, in units of the application's choosing (requests
    /// per second, tokens per minute, CPU share): a [`SessionHost`](crate::SessionHost)
    /// balances its sessions by it (see its [load docs](crate::host#load)), smoothed. Until the
    /// work reports a load, the session's load is its appends per second. A value that is not
    /// finite or below 0 counts as 0. Report the same units from every session of a namespace.
    pub fn set_load(&self, units: f64) {
        let units = if units.is_finite() && units > 0.0 {
            units
        } else {
            0.0
        };
        self.load
            .store(units.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The load the work last reported ([`set_load`](Self::set_load)), if it reported one.
    pub fn reported_load(&self) -> Option<f64> {
        let bits = self.load.load(std::sync::atomic::Ordering::Relaxed);
        (bits != NO_LOAD).then(|| f64::from_bits(bits))
    }

    /// The session's journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The read-only ownership view.
    pub fn ownership(&self) -> Ownership {
        self.lease.ownership()
    }

    /// The view object GC gets.
    pub fn gc_view(&self) -> GcView {
        GcView::new(self.lease.ownership(), self.store.clone())
    }

    /// The workspace root's key.
    pub fn workspace_key(&self) -> &str {
        &self.workspace_key
    }

    fn workspace_root(&self) -> Delete {
        Delete::created_at(&*self.workspace_key, self.workspace_revision)
    }

    /// Shuts the session down in order: the last durable append completes, then the workspace
    /// root is released, then the session lease. Idempotent.
    ///
    /// If the workspace root's delete cannot be confirmed within the store's request timeout,
    /// both deletes go on in the background, in the same order, and this returns
    /// [`RigError::Workspace`]; if the lease's, [`RigError::Release`].
    pub async fn shutdown(&self) -> Result<(), RigError> {
        self.journal.close().await;
        if self.lease.is_released() {
            return Ok(());
        }
        let node = &self.lease.state().node;
        let released = self
            .store
            .guarded_delete(&self.workspace_key, self.workspace_revision, node)
            .await;
        if let Err(error) = released {
            self.lease.release_after(vec![self.workspace_root()]);
            return Err(RigError::Workspace(error));
        }
        self.lease.release().await.map_err(RigError::Release)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.lease.release_after(vec![self.workspace_root()]);
    }
}

/// Takes the workspace root under `lease` (see the module docs); its create_revision.
async fn take_workspace(
    store: &Store,
    lease: &Lease,
    key: &str,
    value: &str,
) -> Result<i64, RigError> {
    let txn = Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, 0),
            lease.ownership().guard(),
        ])
        .and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(lease.state().node.id)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let resolve = Txn::new().and_then([TxnOp::get(key, None)]);
    // Shared with the store's other lifecycle writes ready at once (see `etcd::shared`).
    let ownership = lease.ownership();
    let written = store
        .shared()
        .shared_writes
        .send("workspace root", key, txn, Some(resolve), move || {
            ownership.is_valid()
        })
        .await;
    let held = |holder: KeyValue| {
        if holder.value() == value.as_bytes() {
            Ok(holder.create_revision())
        } else {
            Err(RigError::WorkspaceHeld(WorkspaceHeldError {
                workspace: key.rsplit('/').next().unwrap_or(key).to_owned(),
                holder: String::from_utf8_lossy(holder.value()).into_owned(),
            }))
        }
    };
    match written {
        Written::Replied(response) if response.succeeded() => {
            Ok(response.header().map_or(0, |h| h.revision()))
        }
        Written::Replied(response) => match gets(&response).next().flatten() {
            Some(holder) => held(holder),
            // The workspace is free: the owner compare failed.
            None => Err(RigError::Lost),
        },
        // Refused for space: final, and the read after it shows whether it applied.
        Written::Resolved {
            read,
            unknown: error,
        }
        | Written::Refused {
            error,
            read: Some(read),
        } => match gets(&read).next().flatten() {
            Some(holder) => held(holder),
            None => Err(RigError::Workspace(error)),
        },
        Written::Unknown(error)
        | Written::Failed(error)
        | Written::Refused { error, read: None } => Err(RigError::Workspace(error)),
    }
}
