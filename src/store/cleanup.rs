//! Guarded deletes that must eventually happen: released leases whose delete failed or was left
//! to the background (a dropped handle), workspace roots before their session's owner key, and
//! owner keys of ours that no lease adopted.
//!
//! Every job is bounded: it ends when its deletes are confirmed, when the node lease its keys
//! are attached to is lost (its end deletes them), when the store shuts down, or at a
//! permanent failure. A job is queued at most once at a time (see
//! `StoreShared::delete_in_background`).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::StoreShared;
use crate::etcd::Delete;
use crate::etcd::write::{self, Written};
use crate::lease::NodeLease;

/// Guarded deletes, in order (the next only once the one before is confirmed), of keys
/// attached to `node`. `name` claims the job while it is queued or running: a job of the same
/// name is not queued again.
pub(crate) struct Cleanup {
    pub(crate) name: String,
    pub(crate) deletes: Vec<Delete>,
    pub(crate) node: Arc<NodeLease>,
}

impl Cleanup {
    /// The name of a job that ends with deleting the owner key written with `nonce`: a
    /// release, or an orphan's delete. While one runs, no other is queued for that key.
    pub(crate) fn owner_key_name(nonce: uuid::Uuid) -> String {
        format!("owner key {nonce}")
    }

    /// The name of a job that deletes exactly these keys.
    pub(crate) fn deletes_name(deletes: &[Delete]) -> String {
        deletes.first().map(Delete::name).unwrap_or_default()
    }
}

/// The names of the cleanup jobs queued or running.
#[derive(Default)]
pub(crate) struct Claims(std::sync::Mutex<std::collections::HashSet<String>>);

impl Claims {
    /// Claims `name`; false if a job of that name is queued or running.
    pub(crate) fn claim(&self, name: String) -> bool {
        self.lock().insert(name)
    }

    /// Ends the claim of a finished job.
    pub(crate) fn end(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs each job on a task of its own (a slow one must not hold up the others) until the store
/// shuts down; the node lease's revocation on shutdown deletes whatever is left.
pub(super) async fn run(shared: Arc<StoreShared>, mut jobs: mpsc::UnboundedReceiver<Cleanup>) {
    loop {
        let job = tokio::select! {
            job = jobs.recv() => job,
            _ = shared.shutdown.cancelled() => return,
        };
        let Some(job) = job else { return };
        shared.tasks.spawn(perform(shared.clone(), job));
    }
}

async fn perform(shared: Arc<StoreShared>, job: Cleanup) {
    let alive = || !job.node.is_lost();
    for delete in &job.deletes {
        let written = write::send(
            &shared.connection,
            &shared.write,
            "cleanup",
            &delete.txn(),
            None,
            alive,
            &shared.shutdown,
        )
        .await;
        let key = &delete.key;
        match written {
            Written::Replied(response) => {
                tracing::debug!(%key, deleted = response.succeeded(), "guarded delete confirmed");
            }
            Written::Failed(error)
            | Written::Unknown(error)
            | Written::Resolved { unknown: error, .. } => {
                if shared.shutdown.is_cancelled() || !alive() {
                    tracing::debug!(%key, "guarded delete ends with its node lease");
                } else {
                    tracing::error!(%key, %error, "guarded delete failed for good; the deletes after it in this job are not sent");
                }
                break;
            }
        }
    }
    shared.end_cleanup(&job.name);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_queued_once_until_it_ends() {
        let claims = Claims::default();
        let nonce = uuid::Uuid::new_v4();
        // A release and an orphan delete of the same owner key share one name: a watch
        // restart that finds the key again does not queue a second job (nor jump the order).
        assert!(claims.claim(Cleanup::owner_key_name(nonce)));
        assert!(!claims.claim(Cleanup::owner_key_name(nonce)));
        let root = [Delete::created_at("ns/workspaces/w", 7)];
        assert!(claims.claim(Cleanup::deletes_name(&root)));
        assert!(!claims.claim(Cleanup::deletes_name(&root)));
        claims.end(&Cleanup::owner_key_name(nonce));
        assert!(claims.claim(Cleanup::owner_key_name(nonce)));
        assert!(claims.claim(Cleanup::deletes_name(&[Delete::created_at(
            "ns/workspaces/w",
            8
        )])));
    }
}
