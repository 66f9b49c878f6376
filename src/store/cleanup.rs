//! Guarded deletes that must eventually happen: released leases whose delete failed or was left
//! to the background (a dropped handle), and owner keys of ours that no lease adopted.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::sync::mpsc;
use tokio::time::sleep;

use super::owner_value::OwnerValue;
use super::registry::Orphan;
use super::{StoreShared, guarded_delete_txn};
use crate::lease::NodeLease;

pub(crate) enum Cleanup {
    /// Delete the owner key if it still holds this store's value with this nonce.
    Orphan(Orphan),
    /// Delete `key` if it still has this create_revision: a released owner key (at its
    /// epoch) or a workspace root.
    Guarded {
        key: String,
        create_revision: i64,
        node: Arc<NodeLease>,
    },
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
        shared.tasks.spawn(retry(shared.clone(), job));
    }
}

async fn retry(shared: Arc<StoreShared>, job: Cleanup) {
    let (key, txn, node) = match job {
        Cleanup::Orphan(orphan) => {
            let key = shared.namespace.owner_key(orphan.session);
            let value = OwnerValue {
                store: shared.id,
                nonce: orphan.nonce,
                node: shared.node.clone(),
            }
            .encode();
            let txn = Txn::new()
                .when([Compare::value(key.as_str(), CompareOp::Equal, value)])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            (key, txn, None)
        }
        Cleanup::Guarded {
            key,
            create_revision,
            node,
        } => {
            let txn = guarded_delete_txn(&key, create_revision);
            (key, txn, Some(node))
        }
    };
    let mut backoff = Duration::from_millis(200);
    loop {
        // A lost node lease takes its keys with it (it is revoked, or it expires).
        if shared.shutdown.is_cancelled() || node.as_ref().is_some_and(|n| n.is_lost()) {
            return;
        }
        let deleted = shared
            .connection
            .write("cleanup", |mut client, _| {
                let txn = txn.clone();
                async move { client.txn(txn).await.map(|r| r.succeeded()) }
            })
            .await;
        match deleted {
            Ok(deleted) => {
                tracing::debug!(%key, deleted, "guarded delete confirmed");
                return;
            }
            Err(error) => tracing::debug!(%key, %error, "guarded delete failed; retrying"),
        }
        tokio::select! {
            _ = sleep(backoff) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
