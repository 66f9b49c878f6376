//! The composition root of a live session: lease, workspace root, journal, in that order.
//!
//! [`Rig::open`] acquires the session lease, then workspace-root ownership
//! (`{ns}/workspaces/{id}`: created only if absent, attached to the node lease, and guarded by
//! the owner compare, so only the session's current owner can take it), then opens the journal
//! (which appends the fence). The rig holds the lease: it is released when the rig shuts down
//! or is dropped, and the workspace root is released too when the session is lost.
//!
//! [`Rig::shutdown`] keeps the order that makes a handover clean: the last durable append
//! completes (the journal is closed, waiting for an append in flight), then the workspace root
//! is released, then the session lease. A successor that sees the owner key go therefore finds
//! the workspace free and the journal's tip final.
//!
//! Object GC gets only a [`GcView`]: session, epoch, validity, and deletes guarded by the
//! owner compare.

mod gc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error::{AcquireError, EtcdError, FailureClass, OpenJournalError, ReleaseError};
use crate::journal::Journal;
use crate::lease::{Epoch, Lease, Lost, Ownership};
use crate::store::Store;

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
    /// The workspace id is empty or has characters other than ASCII letters, digits, `-`,
    /// `_` and `.`. Permanent.
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
    /// Taking or releasing the workspace root failed at etcd; see its class.
    #[error("workspace root request failed")]
    Workspace(#[source] EtcdError),
    /// The journal could not be opened.
    #[error("cannot open the journal")]
    Journal(#[source] OpenJournalError),
    /// The session lease's delete was deferred to the background.
    #[error("releasing the session")]
    Release(#[source] ReleaseError),
}

/// A live session: its lease, its workspace root and its journal.
pub struct Rig {
    journal: Journal,
    workspace_key: String,
    workspace_revision: i64,
    // Declared last: the lease outlives the rest while fields drop.
    lease: Lease,
    /// Releases the workspace root when the session is lost.
    on_loss: JoinHandle<()>,
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

fn valid_workspace(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Rig {
    /// Acquires `session`, then `workspace`'s root, then opens the journal.
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
    /// acquisition).
    pub async fn with_lease(
        store: &Store,
        lease: Lease,
        workspace: &str,
    ) -> Result<Self, RigError> {
        if !valid_workspace(workspace) {
            return Err(RigError::InvalidWorkspace(workspace.to_owned()));
        }
        let session = lease.session_id();
        let shared = lease.store().clone();
        let key = store.namespace().workspace_key(workspace);
        let value = format!("{session} {}", lease.epoch());
        let node = lease.state().node.clone();
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                lease.ownership().guard(),
            ])
            .and_then([TxnOp::put(
                key.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(node.id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        // An unknown outcome is resolved by reading the key: our session and epoch mean ours.
        let mut attempts = 0;
        let response = loop {
            match store
                .connection()
                .write("workspace root", |mut client, _| {
                    let txn = txn.clone();
                    async move { client.txn(txn).await }
                })
                .await
            {
                Ok(response) => break response,
                Err(error) if error.class() == FailureClass::OutcomeUnknown && attempts < 3 => {
                    attempts += 1;
                }
                Err(error) => return Err(RigError::Workspace(error)),
            }
        };
        let revision = if response.succeeded() {
            response.header().map_or(0, |h| h.revision())
        } else {
            let holder = response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                _ => None,
            });
            match holder {
                Some(kv) if kv.value() == value.as_bytes() => kv.create_revision(),
                Some(kv) => {
                    return Err(RigError::WorkspaceHeld(WorkspaceHeldError {
                        workspace: workspace.to_owned(),
                        holder: String::from_utf8_lossy(kv.value()).into_owned(),
                    }));
                }
                // The workspace is free: the owner compare failed.
                None => return Err(RigError::Lost),
            }
        };
        let release_workspace = {
            let (shared, key, node) = (shared.clone(), key.clone(), node.clone());
            move || shared.delete_guarded_in_background(key, revision, node)
        };
        let journal = match store.open_journal(session, Some(&lease)).await {
            Ok(journal) => journal,
            Err(error) => {
                release_workspace();
                return Err(RigError::Journal(error));
            }
        };
        let on_loss = {
            let lost = lease.lost();
            tokio::spawn(async move {
                lost.await;
                release_workspace();
            })
        };
        tracing::info!(%session, epoch = %lease.epoch(), %key, "session rig open");
        Ok(Self {
            journal,
            workspace_key: key,
            workspace_revision: revision,
            lease,
            on_loss,
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
        GcView::new(
            self.lease.ownership(),
            self.lease.store().connection.clone(),
        )
    }

    /// The workspace root's key.
    pub fn workspace_key(&self) -> &str {
        &self.workspace_key
    }

    /// Shuts the session down in order: the last durable append completes, then the workspace
    /// root is released, then the session lease.
    pub async fn shutdown(self) -> Result<(), RigError> {
        self.journal.close().await;
        self.on_loss.abort();
        let released = self
            .lease
            .store()
            .guarded_delete(&self.workspace_key, self.workspace_revision)
            .await;
        if let Err(error) = released {
            // The lease is not released before the workspace: leave both to the background
            // (dropping the rig), where the workspace delete is retried.
            return Err(RigError::Workspace(error));
        }
        self.lease.release().await.map_err(RigError::Release)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.on_loss.abort();
        if !self.lease.is_released() {
            self.lease.store().delete_guarded_in_background(
                self.workspace_key.clone(),
                self.workspace_revision,
                self.lease.state().node.clone(),
            );
        }
    }
}
