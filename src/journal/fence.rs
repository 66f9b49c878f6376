//! Opening a journal: the fence.
//!
//! 1. Read the owner key and the tip in one linearizable transaction. An acquisition reads the
//!    tip in the very transaction that creates the owner key ([`SeenTip`]); an open under a
//!    lease acquired that way fences at that tip and skips this read.
//! 2. The owner key must still have the lease's epoch; otherwise the open fails as fenced.
//! 3. Append `Fence { epoch, previous tip }` at `tip.seq + 1` with the append transaction of
//!    [`cas`](super::cas), expecting the tip's `mod_revision` as read (0 for a new journal).
//!    The fence goes through the store's append queue as the journal's first append, so the
//!    fences of journals opened together share transactions (each with its own compares, as
//!    appends do: see [`batch`](super::batch)).
//!
//! The journal is ready only once the fence has committed. From then on a writer of an older
//! epoch can no longer append: the tip it expects is gone, and so is its owner key.
//!
//! A tip seen at acquisition can only have moved since under this same lease (every other
//! writer's owner compare fails once the key is ours), e.g. by
//! [`Store::delete_journal`](crate::Store::delete_journal). A fence at a moved tip fails its
//! compare, which no later send can change; the open then reads owner and tip as in step 1 and
//! fences once more, so a stale seen tip costs a round trip, never a false fence.

use std::sync::Arc;

use etcd_client::{KeyValue, KvClient, Txn, TxnOp};

use super::record::decode_tip;
use super::{DecodeError, Journal, JournalContext, JournalWriteError, Tip, Writer};
use crate::etcd::{Connection, EtcdError, gets};
use crate::journal::{AppendError, JournalLeaseLostError, OpenJournalError};
use crate::keys::Namespace;
use crate::lease::Ownership;

/// The journal's tip as one linearizable read saw it, together with the owner key at the
/// lease's epoch: the acquisition's own transaction, or the open's read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeenTip {
    /// The tip, or `None` for a journal with no records.
    pub(crate) tip: Option<Tip>,
    /// The tip's `mod_revision` (0 when there is none): what the fence compares.
    pub(crate) mod_revision: i64,
}

impl SeenTip {
    /// The tip key-value as read (`None`: absent); a tip that does not decode is an error.
    pub(crate) fn of(kv: Option<&KeyValue>) -> Result<Self, DecodeError> {
        Ok(match kv {
            Some(kv) => Self {
                tip: Some(decode_tip(kv.key(), kv.value())?),
                mod_revision: kv.mod_revision(),
            },
            None => Self {
                tip: None,
                mod_revision: 0,
            },
        })
    }
}

/// Appends the fence under `ownership` and returns the journal, open after it. `seen` is the
/// tip the acquisition read, if it did (see the module docs).
pub(crate) async fn open(
    context: Arc<JournalContext>,
    ownership: Ownership,
    seen: Option<SeenTip>,
) -> Result<Journal, OpenJournalError> {
    let lost = |source| OpenJournalError::LeaseLost(JournalLeaseLostError { source });
    ownership.check().map_err(lost)?;
    if let Some(seen) = seen {
        match fence_at(&context, &ownership, seen).await {
            // Fenced at a tip seen earlier: it may have moved under this lease; read it anew.
            Err(OpenJournalError::Fenced(_)) => {
                tracing::debug!(session = %ownership.session_id(), "the tip seen at acquisition moved; reading it");
            }
            opened => return opened,
        }
    }
    let seen = read_tip(&context, &ownership).await?;
    fence_at(&context, &ownership, seen).await
}

/// Reads the owner key and the tip; fenced unless the owner key still has the lease's epoch.
async fn read_tip(
    context: &JournalContext,
    ownership: &Ownership,
) -> Result<SeenTip, OpenJournalError> {
    let (connection, namespace) = (&context.connection, &context.namespace);
    let (owner, tip) = owner_and_tip(connection, namespace, ownership, "open journal")
        .await
        .map_err(OpenJournalError::Etcd)?;
    if owner.as_ref().map(|kv| kv.create_revision()) != Some(ownership.epoch().revision()) {
        return Err(fenced(ownership));
    }
    SeenTip::of(tip.as_ref()).map_err(OpenJournalError::Decode)
}

fn fenced(ownership: &Ownership) -> OpenJournalError {
    OpenJournalError::Fenced(AppendError {
        session_id: ownership.session_id(),
        epoch: ownership.epoch(),
    })
}

/// Appends the fence after `seen` through the store's append queue (the fences of journals
/// being opened together share transactions, as appends do); the journal is open after it.
async fn fence_at(
    context: &Arc<JournalContext>,
    ownership: &Ownership,
    seen: SeenTip,
) -> Result<Journal, OpenJournalError> {
    let (session, epoch) = (ownership.session_id(), ownership.epoch());
    let seq = fence_seq(seen.tip)?;
    let writer = Writer::new(
        ownership.clone(),
        context.namespace.clone(),
        seq,
        seen.mod_revision,
        &context.keys,
    );
    let answer = context.batcher.fence(&writer, seen.tip).await;
    match answer.result {
        Ok(_) => {
            tracing::info!(%session, %epoch, seq, "journal fenced and open");
            Ok(Journal::with_writer(
                context.clone(),
                ownership.clone(),
                writer,
            ))
        }
        Err(JournalWriteError::Fenced(_)) => Err(fenced(ownership)),
        Err(JournalWriteError::LeaseLost(lost)) => Err(OpenJournalError::LeaseLost(lost)),
        Err(JournalWriteError::OutcomeUnknown(error)) => {
            Err(OpenJournalError::OutcomeUnknown(error))
        }
        Err(JournalWriteError::Etcd(error)) => Err(OpenJournalError::Etcd(error)),
        Err(JournalWriteError::SequenceExhausted { seq }) => {
            Err(OpenJournalError::SequenceExhausted { seq })
        }
        // Its transaction went away unsettled: the store is shutting down under it.
        Err(JournalWriteError::Indeterminate | JournalWriteError::Closed) => Err(
            OpenJournalError::OutcomeUnknown(EtcdError::stopped("open journal")),
        ),
        // A fence is one record, far within every limit, and has no idempotency key.
        Err(
            error @ (JournalWriteError::Empty
            | JournalWriteError::TooManyRecords { .. }
            | JournalWriteError::TooLarge { .. }
            | JournalWriteError::KeyReused
            | JournalWriteError::Trimmed { .. }
            | JournalWriteError::Undecodable(_)
            | JournalWriteError::KeysExhausted { .. }),
        ) => unreachable!("a fence is refused as no fence can be: {error}"),
    }
}

/// The fence's sequence number after `previous`: the fence and at least one record after it
/// must fit in a u64.
fn fence_seq(previous: Option<Tip>) -> Result<u64, OpenJournalError> {
    match previous {
        None => Ok(1),
        Some(tip) => tip
            .seq
            .checked_add(1)
            .filter(|seq| seq.checked_add(1).is_some())
            .ok_or(OpenJournalError::SequenceExhausted { seq: tip.seq }),
    }
}

/// The owner key and the tip (each `None` when absent), read in one linearizable transaction.
pub(super) async fn owner_and_tip(
    connection: &Connection,
    namespace: &Namespace,
    ownership: &Ownership,
    operation: &'static str,
) -> Result<(Option<KeyValue>, Option<KeyValue>), EtcdError> {
    let tip_key = namespace.tip_key(ownership.session_id());
    let read = Txn::new().and_then([
        TxnOp::get(ownership.owner_key(), None),
        TxnOp::get(tip_key.as_str(), None),
    ]);
    let response = connection
        .read(operation, |mut client: KvClient, _| {
            let read = read.clone();
            async move { client.txn(read).await }
        })
        .await?;
    let mut read = gets(&response);
    Ok((read.next().flatten(), read.next().flatten()))
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::journal::record::{encode_fence, fence_len};
    use crate::lease::Epoch;

    proptest::proptest! {
        /// Any tip bytes: a typed error or a fence sequence number, never a panic.
        #[test]
        fn any_tip_yields_a_fence_or_a_typed_error(
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            seq in proptest::prelude::any::<u64>(),
        ) {
            if let Ok(tip) = decode_tip(b"tip", &value) {
                let _ = fence_seq(Some(tip));
            }
            let tip = Tip { seq, epoch: Epoch(seq), nonce: Uuid::nil() };
            match fence_seq(Some(tip)) {
                Ok(fence) => proptest::prop_assert_eq!(fence, seq + 1),
                Err(error) => {
                    let exhausted = matches!(error, OpenJournalError::SequenceExhausted { .. });
                    proptest::prop_assert!(exhausted && seq >= u64::MAX - 1);
                }
            }
        }
    }

    #[test]
    fn a_tip_at_the_end_of_the_sequence_is_a_typed_error() {
        let tip = |seq| {
            Some(Tip {
                seq,
                epoch: Epoch(1),
                nonce: Uuid::nil(),
            })
        };
        assert_eq!(fence_seq(None).unwrap(), 1);
        assert_eq!(fence_seq(tip(u64::MAX - 2)).unwrap(), u64::MAX - 1);
        assert!(matches!(
            fence_seq(tip(u64::MAX)),
            Err(OpenJournalError::SequenceExhausted { seq: u64::MAX })
        ));
    }

    #[test]
    fn a_fence_is_as_long_as_the_queue_counts_it() {
        let tip = Tip {
            seq: 7,
            epoch: Epoch(3),
            nonce: Uuid::new_v4(),
        };
        for previous in [None, Some(tip)] {
            let fence = encode_fence(8, Epoch(9), Uuid::new_v4(), previous);
            assert_eq!(fence.len(), fence_len(previous.as_ref()));
        }
    }
}
