//! Guarded deletes that must eventually happen: released leases whose delete failed or was left
//! to the background (a dropped handle), workspace roots before their session's owner key, and
//! owner keys of ours that no lease adopted.
//!
//! Every job is bounded: it ends when its deletes are confirmed, when the node lease its keys
//! are attached to is lost (its end deletes them), when the store shuts down, or at a
//! permanent failure. Any other failure (an outage longer than the write's deadline, a
//! NOSPACE refusal, an unknown outcome) sends the same guarded delete again after a pause. A
//! job is queued at most once at a time (see `StoreShared::delete_in_background`). The deletes
//! share etcd transactions with the store's other lifecycle writes (`etcd::shared`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use uuid::Uuid;

use super::StoreShared;
use super::registry::Orphan;
use crate::backoff::Backoff;
use crate::deadline::deadline;
use crate::etcd::write::Written;
use crate::etcd::{Delete, EtcdError, FailureClass};
use crate::lease::{LeaseState, NodeLease, ReleaseError, Releaser};

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
        crate::sync::lock(&self.0)
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

/// The pauses before a cleanup job sends a delete again after a failure that is not
/// permanent: 1 s, doubling to 30 s, jittered.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

async fn perform(shared: Arc<StoreShared>, job: Cleanup) {
    let alive = || !job.node.is_lost();
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX).with_jitter();
    let mut deletes = job.deletes.iter().peekable();
    while let Some(delete) = deletes.peek() {
        let node = job.node.clone();
        let written = shared
            .shared_writes
            .send(
                "cleanup",
                delete.key.as_str(),
                delete.txn(),
                None,
                move || !node.is_lost(),
            )
            .await;
        let key = &delete.key;
        let (error, retry) = match written {
            Written::Replied(response) => {
                tracing::debug!(%key, deleted = response.succeeded(), "guarded delete confirmed");
                backoff.reset();
                deletes.next();
                continue;
            }
            // Space may be freed (and etcd applies deletes under its NOSPACE alarm).
            Written::Refused { error, .. } => (error, true),
            Written::Failed(error)
            | Written::Unknown(error)
            | Written::Resolved { unknown: error, .. } => {
                let retry = error.class() != FailureClass::Permanent;
                (error, retry)
            }
        };
        if shared.shutdown.is_cancelled() || !alive() {
            tracing::debug!(%key, "guarded delete ends with its node lease");
            break;
        }
        if !retry {
            tracing::error!(%key, %error, "guarded delete failed for good; the deletes after it in this job are not sent");
            break;
        }
        // Refused for space, cut off past the write's deadline, or left unknown: the delete
        // is guarded, so sending it again is safe, and the key must not outlive the
        // session's end while the node lease lives.
        let pause = backoff.next();
        tracing::warn!(%key, %error, ?pause, "guarded delete not confirmed; it is sent again");
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shared.shutdown.cancelled() => break,
        }
    }
    shared.end_cleanup(&job.name);
}

/// The store's deletes: guarded, in the foreground or as background jobs.
impl StoreShared {
    /// Deletes `key` if it still has `create_revision` (an owner key at its epoch, a workspace
    /// root), in the foreground: re-sent while `node` lives, for at most the request timeout.
    /// `Ok(true)` if it deleted the key, `Ok(false)` if the key was already gone or replaced.
    pub(crate) async fn guarded_delete(
        &self,
        key: &str,
        create_revision: i64,
        node: &Arc<NodeLease>,
    ) -> Result<bool, EtcdError> {
        let txn = Delete::created_at(key, create_revision).txn();
        let until = deadline(Instant::now(), self.request_timeout);
        let node = node.clone();
        let go_on = move || !node.is_lost() && Instant::now() < until;
        let sent = self
            .shared_writes
            .send("guarded delete", key, txn, None, go_on);
        // A transaction shared with writes whose condition holds longer is re-sent longer: this
        // caller waits no longer than it would alone, and leaves the rest to the background.
        let bound = deadline(until, self.write.attempt_timeout);
        let written = tokio::time::timeout_at(bound, sent)
            .await
            .unwrap_or_else(|_| {
                let waited = self.request_timeout;
                Written::Unknown(EtcdError::timed_out("guarded delete", "(shared)", waited))
            });
        match written {
            Written::Replied(response) => Ok(response.succeeded()),
            Written::Unknown(error) | Written::Failed(error) | Written::Refused { error, .. } => {
                Err(error)
            }
            Written::Resolved { unknown, .. } => Err(unknown),
        }
    }

    /// Releases a lease whose state is already marked released.
    async fn release(&self, state: &Arc<LeaseState>) -> Result<(), ReleaseError> {
        self.registry().forget(state);
        if state.node.is_lost() {
            // The owner key goes with its node lease: revoked, or expiring by itself.
            return Ok(());
        }
        match self
            .guarded_delete(&state.owner_key, state.epoch.revision(), &state.node)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => {
                tracing::warn!(session = %state.session, %error, "release deferred to the background");
                self.queue_cleanup(Cleanup {
                    name: Cleanup::owner_key_name(state.nonce),
                    deletes: vec![Delete::created_at(&state.owner_key, state.epoch.revision())],
                    node: state.node.clone(),
                });
                Err(ReleaseError::Deferred(error))
            }
        }
    }

    /// Releases a lease (already marked released) in the background, after the deletes
    /// `before` (e.g. its workspace root): each is confirmed before the next is sent.
    fn release_in_background(&self, state: &Arc<LeaseState>, before: Vec<Delete>) {
        self.registry().forget(state);
        let mut deletes = before;
        deletes.push(Delete::created_at(&state.owner_key, state.epoch.revision()));
        // Named after the owner key: no orphan delete of the same key (after a watch restart
        // that no longer finds the lease) jumps the order.
        self.queue_cleanup(Cleanup {
            name: Cleanup::owner_key_name(state.nonce),
            deletes,
            node: state.node.clone(),
        });
    }

    /// Guarded deletes in order, in the background: each is re-sent until confirmed, and the
    /// next is sent only then. They stop when `node` (which the keys are attached to, so its
    /// end deletes them) is lost, when the store shuts down, or at a permanent error (the later
    /// ones are then not sent: the order is never broken); any other failure is retried. A job whose first delete is already
    /// queued or running is not queued twice.
    pub(crate) fn delete_in_background(&self, deletes: Vec<Delete>, node: Arc<NodeLease>) {
        if !deletes.is_empty() {
            self.queue_cleanup(Cleanup {
                name: Cleanup::deletes_name(&deletes),
                deletes,
                node,
            });
        }
    }

    /// Deletes an owner key of ours that no lease adopted, guarded by its value (our store id
    /// and that acquisition's nonce).
    pub(crate) fn delete_orphan(&self, orphan: Orphan) {
        // It is attached to one of this store's node leases: the current one, or an older one
        // that is revoked or expires by itself.
        let Some(node) = self.current_node() else {
            return;
        };
        let value = self.owner_value(orphan.nonce);
        let key = self.namespace.owner_key(orphan.session);
        let queued = self.queue_cleanup(Cleanup {
            name: Cleanup::owner_key_name(orphan.nonce),
            deletes: vec![Delete::holding(key, value)],
            node,
        });
        if queued {
            tracing::info!(session = %orphan.session, "deleting an owner key of ours that no lease adopted");
        }
    }

    /// Queues a cleanup job unless one of its name is queued or running; true if queued.
    fn queue_cleanup(&self, job: Cleanup) -> bool {
        // If the store is closing, its node lease's revocation deletes what is left.
        self.cleanups.claim(job.name.clone()) && self.cleanup.send(job).is_ok()
    }

    /// Ends the claim of a finished cleanup job.
    pub(crate) fn end_cleanup(&self, name: &str) {
        self.cleanups.end(name);
    }
}

impl Releaser for StoreShared {
    fn id(&self) -> Uuid {
        self.id
    }

    fn span(&self) -> &tracing::Span {
        &self.span
    }

    fn release<'a>(
        &'a self,
        state: &'a Arc<LeaseState>,
    ) -> Pin<Box<dyn Future<Output = Result<(), ReleaseError>> + Send + 'a>> {
        Box::pin(StoreShared::release(self, state))
    }

    fn release_in_background(&self, state: &Arc<LeaseState>, before: Vec<Delete>) {
        StoreShared::release_in_background(self, state, before);
    }
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
