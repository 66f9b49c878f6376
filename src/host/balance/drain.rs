//! A drain asked through etcd that outlives the node lease it was written on.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::super::Inner;
use super::Balance;
use crate::etcd::write::Written;

impl Balance {
    /// Whether a drain of this host is asked for, from its drain key's node lease as read
    /// (`drain`). The key is attached to the node lease this host had when the drain was asked
    /// for: when that lease ends (lost, and replaced by a new one) the key goes with it, though
    /// nobody withdrew the drain. So a drain key gone while the node lease it was on is gone too
    /// is written again, under the current node lease (if no drain key exists and this host's
    /// key is on that lease); one deleted while its lease lives on was withdrawn
    /// ([`Admin::undrain`](crate::Admin::undrain)).
    pub(super) async fn follow_drain(&mut self, drain: Option<i64>) -> bool {
        if drain.is_some() {
            self.drain_lease = drain;
            return true;
        }
        let Some(was) = self.drain_lease else {
            return false;
        };
        let inner = &self.inner;
        match inner.store.node_lease_id() {
            // Withdrawn: its lease still lives.
            Some(now) if now == was => {
                self.drain_lease = None;
                false
            }
            // Lost with the node lease: asked for still.
            Some(now) => {
                if inner.redrain(now).await {
                    tracing::info!(
                        node = inner.store.node(),
                        "the drain asked for this host is written again under its new node lease"
                    );
                    self.drain_lease = Some(now);
                }
                true
            }
            None => true,
        }
    }
}

impl Inner {
    /// Writes this host's drain key again under node lease `node`, if none exists and the host
    /// key is on that lease. Whether a reply confirmed it (within three write attempts).
    pub(super) async fn redrain(&self, node: i64) -> bool {
        let drain_key = self.store.namespace().drain_key(self.store.id());
        let txn = Txn::new()
            .when([
                Compare::create_revision(drain_key.as_str(), CompareOp::Equal, 0),
                Compare::lease(self.host_key.as_str(), CompareOp::Equal, node),
            ])
            .and_then([TxnOp::put(
                drain_key.as_str(),
                "drain",
                Some(PutOptions::new().with_lease(node)),
            )]);
        let written = self.write_bounded("drain again", &txn).await;
        matches!(written, Written::Replied(reply) if reply.succeeded())
    }
}
