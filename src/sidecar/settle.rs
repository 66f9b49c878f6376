//! Settling an append whose outcome stayed unknown, and reading a session's owner.

use etcd_client::{KvClient, Txn, TxnOp};
use uuid::Uuid;

use super::Sidecar;
use super::proto::AppendResponse;
use super::refusal::Refusal;
use super::requests::Outcome;
use crate::journal::Record;
use crate::lease::Epoch;
use crate::store::OwnerValue;

impl Sidecar {
    /// What an unknown outcome of `session`'s append under `epoch` at `first_seq..=last_seq`
    /// came to, from one linearizable read of the record at `first_seq`, the owner key and
    /// the tip. The transaction compared the tip (then at `first_seq - 1`, written by this
    /// epoch's journal), the owner key's epoch and the absence of `first_seq`; and only it,
    /// of this epoch's one journal, took `first_seq` while it could apply. So:
    ///
    /// - an event of `epoch` at `first_seq` is the append: committed;
    /// - the next owner's fence at `first_seq`, fencing the tip at `first_seq - 1` of
    ///   `epoch`, was appended where the append would have been: never applied;
    /// - no record there, the owner key no longer at `epoch` (the transaction can never apply:
    ///   a create_revision never comes back) and the tip still at `first_seq - 1` of `epoch`:
    ///   never applied;
    /// - anything else is still unknown: the transaction may still apply (the owner key still
    ///   has `epoch`), or trims or a deleted and remade journal took the evidence away.
    pub(super) async fn settle(
        &self,
        session: Uuid,
        epoch: Epoch,
        (first_seq, last_seq): (u64, u64),
    ) -> (Outcome, bool) {
        let namespace = self.inner.store.namespace();
        let keys = [
            namespace.record_key(session, first_seq),
            namespace.owner_key(session),
            namespace.tip_key(session),
        ];
        let read = self
            .inner
            .store
            .connection()
            .read("settle append", |mut client: KvClient, _| {
                let txn = Txn::new().and_then(keys.clone().map(|key| TxnOp::get(key, None)));
                async move { client.txn(txn).await }
            })
            .await;
        let unknown = |why: String| {
            let refusal = Refusal::outcome_unknown(session, epoch, why);
            (Outcome::Refused(refusal), false)
        };
        let response = match read {
            Ok(response) => response,
            Err(error) => return unknown(crate::etcd::chain(&error)),
        };
        let mut gets = crate::etcd::gets(&response);
        let (record, owner, tip) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        let previous = first_seq.checked_sub(1);
        let left_by_us = |seq: u64, by: Epoch| Some(seq) == previous && by == epoch;
        if let Some(kv) = record {
            return match crate::journal::decode_record(kv.key(), Some(first_seq), kv.value()) {
                Ok(Record::Event(event)) if event.epoch == epoch => (
                    Outcome::Appended(AppendResponse {
                        first_seq,
                        last_seq,
                        revision: kv.mod_revision(),
                    }),
                    true,
                ),
                Ok(Record::Fence(fence))
                    if fence
                        .previous
                        .as_ref()
                        .is_some_and(|tip| left_by_us(tip.seq, tip.epoch)) =>
                {
                    (
                        Outcome::Refused(Refusal::fenced(session, epoch, Some(fence.epoch))),
                        true,
                    )
                }
                Ok(_) => unknown(format!(
                    "another journal's record is at {first_seq} (the journal was deleted and made anew)"
                )),
                Err(error) => unknown(error.to_string()),
            };
        }
        let owner_epoch = owner.map(|kv| Epoch::from_revision(kv.create_revision()));
        if owner_epoch == Some(epoch) {
            return unknown(
                "the owner key still has this epoch, and the record is not there (yet)".into(),
            );
        }
        let tip = tip.and_then(|kv| crate::journal::decode_tip(kv.key(), kv.value()).ok());
        if tip.is_some_and(|tip| left_by_us(tip.seq, tip.epoch)) {
            let lost = Refusal::lease_lost(session, epoch, "outcome_settled_not_applied");
            return (Outcome::Refused(lost), true);
        }
        unknown(format!(
            "no record at {first_seq}, and the tip moved on: trimmed or deleted since"
        ))
    }

    /// The owner of `session` from a linearizable read: its epoch and node name.
    pub(super) async fn owner(&self, session: Uuid) -> Result<Option<(Epoch, String)>, Refusal> {
        let key = self.inner.store.namespace().owner_key(session);
        let response = self
            .inner
            .store
            .connection()
            .read("owner", |mut client: KvClient, _| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .await
            .map_err(|error| Refusal::etcd(&error))?;
        Ok(response.kvs().first().map(|kv| {
            let node = OwnerValue::decode(kv.value()).map_or_else(String::new, |value| value.node);
            (Epoch::from_revision(kv.create_revision()), node)
        }))
    }
}
