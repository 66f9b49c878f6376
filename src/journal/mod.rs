//! Fenced, append-only session journals.
//!
//! A journal lives under `{ns}/journals/{session}/`: records at `r/{seq:020}` (numbered from
//! 1, gapless) and a `tip` holding the last sequence number, its writer's epoch and the nonce of
//! the append that wrote it (see [`record`](self#encoding) for the encoding).
//!
//! # Opening: the fence
//!
//! [`Store::open_journal`](crate::Store::open_journal) reads the owner key and the tip in one
//! linearizable transaction, checks that the owner key still has the lease's epoch, and appends
//! a [`Fence`] carrying that epoch and the previous tip. The journal is ready only once the
//! fence has committed. From then on, a writer of an older epoch can no longer append: its
//! compares no longer hold.
//!
//! # Appending: one transaction per call
//!
//! ```text
//! if   mod_revision(tip)             == the tip's mod_revision this writer last saw (0: none)
//! and  create_revision(owner key)    == epoch
//! and  create_revision(r/{first})    == 0
//! then put(r/{first}) … put(r/{last}), put(tip)
//! else get(r/{first})
//! ```
//!
//! Each transaction carries a fresh nonce, written into its records and the tip. A failed
//! compare is the hard fence ([`AppendError`]): the journal does not re-read the tip or recover
//! in place; it stays fenced. A journal whose lease is lost or past its deadline refuses to
//! append locally ([`JournalLeaseLostError`]), without sending anything.
//!
//! # Outcome unknown
//!
//! A write that fails with a timeout, a lost connection, "request timed out" or "leader
//! changed" may still commit. The journal resolves it by re-sending the byte-identical
//! transaction (same nonce, same compares): at most one of the two can ever commit. If the
//! re-send's compare fails, its `else` branch has read `r/{first}` in the same linearizable
//! transaction: our nonce means the earlier send committed; anything else means fenced. Reading
//! the old tip would prove nothing (the first send may still be in the raft log). Only when the
//! re-sends stay unknown too does the append return
//! [`OutcomeUnknown`](JournalWriteError::OutcomeUnknown); the journal is then unusable, since it
//! no longer knows its tip. A committed append is never reported as failed, and never applied
//! twice.
//!
//! # Limits
//!
//! etcd allows 128 operations per transaction branch and about 1.5 MiB per request. An append
//! holds at most `max_txn_ops − 1` records (the tip is one more put), and its encoded size
//! (a conservative estimate of etcd's internal request) must not exceed `max_request_bytes −
//! headroom`. Both are checked before sending, with typed errors; set [`JournalLimits`] to
//! match your server's `--max-txn-ops` and `--max-request-bytes`.
//!
//! # Replay
//!
//! [`Store::replay`](crate::Store::replay) yields events;
//! [`Store::replay_records`](crate::Store::replay_records) yields fences too. Both need no
//! lease, read pages of records at one fixed revision (a consistent snapshot: nothing after it,
//! nothing missing before it), bound each page by count and by bytes, and stream with bounded
//! memory. If the snapshot revision is compacted mid-replay, the replay fails with
//! [`ReplayError::Compacted`](crate::ReplayError::Compacted).
//!
//! # Encoding
//!
//! See the `record` module: a versioned binary envelope; decoding garbage yields a
//! [`DecodeError`] naming the key, never a panic.

mod record;
mod replay;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::connection::Connection;
use crate::error::{
    AppendError, EtcdError, FailureClass, JournalLeaseLostError, JournalWriteError,
};
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};

pub use record::{DecodeError, Event, Fence, Record, Tip};
pub(crate) use record::{decode_record, decode_tip, encode_fence, encode_tip};
pub use replay::Replay;

/// etcd's limits, as the journal checks them before sending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalLimits {
    /// etcd's `--max-txn-ops` (default 128): operations per transaction branch.
    pub max_txn_ops: usize,
    /// etcd's `--max-request-bytes` (default 1.5 MiB).
    pub max_request_bytes: usize,
    /// Kept free below `max_request_bytes` for etcd's own wrapping (at least 1 KiB).
    pub headroom: usize,
}

impl Default for JournalLimits {
    fn default() -> Self {
        Self {
            max_txn_ops: 128,
            max_request_bytes: 1_572_864,
            headroom: 1024,
        }
    }
}

impl JournalLimits {
    /// The most records one append takes: the tip is one more put.
    pub fn max_records(&self) -> usize {
        self.max_txn_ops.saturating_sub(1)
    }

    /// The largest encoded append accepted.
    pub fn max_bytes(&self) -> usize {
        self.max_request_bytes
            .saturating_sub(self.headroom.max(1024))
    }
}

/// How replays page through a journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// The most records one page holds.
    pub page_records: usize,
    /// The most bytes one page should hold (etcd-client decodes at most 4 MiB per reply).
    pub page_bytes: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            page_records: 1000,
            page_bytes: 2 * 1024 * 1024,
        }
    }
}

/// Where an append landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The first record's sequence number.
    pub first_seq: u64,
    /// The last record's sequence number.
    pub last_seq: u64,
    /// The etcd revision at which the append committed.
    pub revision: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Open,
    Fenced,
    Indeterminate,
    Closed,
}

struct Writer {
    next_seq: u64,
    tip_mod_revision: i64,
    condition: Condition,
}

/// A session's journal, open for appending under one lease. Appends are serialized.
pub struct Journal {
    ownership: Ownership,
    connection: Connection,
    namespace: Namespace,
    limits: JournalLimits,
    writer: Mutex<Writer>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("session", &self.ownership.session_id())
            .field("epoch", &self.ownership.epoch())
            .finish()
    }
}

/// What a sent transaction came to.
pub(crate) enum Sent {
    Committed { revision: i64 },
    Fenced,
    Unknown(EtcdError),
    Failed(EtcdError),
}

/// How many times a transaction with an unknown outcome is re-sent.
const RESENDS: u32 = 3;

/// A conservative estimate of the size etcd sees for a transaction: the protobuf encoding of
/// every compare and operation with generous per-field overhead, plus etcd's own wrapping.
pub(crate) fn estimate_size(
    compare_keys: impl IntoIterator<Item = usize>,
    puts: impl IntoIterator<Item = (usize, usize)>,
    gets: impl IntoIterator<Item = usize>,
) -> usize {
    const TXN: usize = 64;
    const COMPARE: usize = 24;
    const PUT: usize = 32;
    const GET: usize = 24;
    TXN + compare_keys.into_iter().map(|k| k + COMPARE).sum::<usize>()
        + puts.into_iter().map(|(k, v)| k + v + PUT).sum::<usize>()
        + gets.into_iter().map(|k| k + GET).sum::<usize>()
}

/// The append transaction described in the module docs.
pub(crate) struct AppendTxn {
    pub(crate) txn: Txn,
    pub(crate) size: usize,
}

impl AppendTxn {
    pub(crate) fn build(
        namespace: &Namespace,
        ownership: &Ownership,
        first_seq: u64,
        values: Vec<Vec<u8>>,
        tip_value: Vec<u8>,
        expected_tip_mod_revision: i64,
    ) -> Self {
        let session = ownership.session_id();
        let tip_key = namespace.tip_key(session);
        let first_key = namespace.record_key(session, first_seq);
        let size = estimate_size(
            [tip_key.len(), ownership.owner_key().len(), first_key.len()],
            values
                .iter()
                .map(|v| (first_key.len(), v.len()))
                .chain([(tip_key.len(), tip_value.len())]),
            [first_key.len()],
        );
        let mut puts: Vec<TxnOp> = values
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                TxnOp::put(
                    namespace.record_key(session, first_seq + i as u64),
                    value,
                    None,
                )
            })
            .collect();
        puts.push(TxnOp::put(tip_key.as_str(), tip_value, None));
        let txn = Txn::new()
            .when([
                Compare::mod_revision(
                    tip_key.as_str(),
                    CompareOp::Equal,
                    expected_tip_mod_revision,
                ),
                ownership.guard(),
                Compare::create_revision(first_key.as_str(), CompareOp::Equal, 0),
            ])
            .and_then(puts)
            .or_else([TxnOp::get(first_key.as_str(), None)]);
        Self { txn, size }
    }
}

/// Sends `txn`, re-sending it byte-identical while its outcome is unknown; a failed compare is
/// resolved by the `else` read of the first record: our nonce means committed.
pub(crate) async fn send_resolving(
    connection: &Connection,
    txn: &Txn,
    first_key: &str,
    nonce: Uuid,
) -> Sent {
    let mut unknown: Option<EtcdError> = None;
    let mut attempt = 0;
    loop {
        let sent = connection
            .write("append", |mut client, _| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await;
        match sent {
            Ok(response) if response.succeeded() => {
                return Sent::Committed {
                    revision: response.header().map_or(0, |h| h.revision()),
                };
            }
            Ok(response) => {
                let first = response.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().first().cloned(),
                    _ => None,
                });
                return match first {
                    Some(kv)
                        if decode_record(kv.key(), None, kv.value())
                            .is_ok_and(|record| record.nonce() == nonce) =>
                    {
                        tracing::debug!(key = first_key, "an earlier send committed");
                        Sent::Committed {
                            revision: kv.mod_revision(),
                        }
                    }
                    _ => Sent::Fenced,
                };
            }
            Err(error) if error.class() == FailureClass::OutcomeUnknown => {
                attempt += 1;
                if attempt > RESENDS {
                    return Sent::Unknown(unknown.unwrap_or(error));
                }
                tracing::debug!(key = first_key, %error, attempt, "outcome unknown; re-sending the same transaction");
                // Keep the first unknown failure: it is the one that may have committed.
                unknown.get_or_insert(error);
                connection.rotate();
                tokio::time::sleep(std::time::Duration::from_millis(100 * u64::from(attempt)))
                    .await;
            }
            // This send was not applied; but an earlier one with an unknown outcome may have been.
            Err(error) => {
                return match unknown {
                    Some(first) => Sent::Unknown(first),
                    None => Sent::Failed(error),
                };
            }
        }
    }
}

impl Journal {
    pub(crate) fn new(
        ownership: Ownership,
        connection: Connection,
        namespace: Namespace,
        limits: JournalLimits,
        next_seq: u64,
        tip_mod_revision: i64,
    ) -> Self {
        Self {
            ownership,
            connection,
            namespace,
            limits,
            writer: Mutex::new(Writer {
                next_seq,
                tip_mod_revision,
                condition: Condition::Open,
            }),
        }
    }

    /// The session.
    pub fn session_id(&self) -> Uuid {
        self.ownership.session_id()
    }

    /// The epoch this journal writes under.
    pub fn epoch(&self) -> Epoch {
        self.ownership.epoch()
    }

    /// The ownership view the journal writes under (it cannot release the lease).
    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    /// The limits checked before sending.
    pub fn limits(&self) -> &JournalLimits {
        &self.limits
    }

    /// The encoded size the limits are checked against, for a batch of these payloads.
    pub fn encoded_size<P: AsRef<[u8]>>(&self, payloads: &[P]) -> usize {
        let session = self.session_id();
        let key = self.namespace.record_key(session, 0).len();
        let tip = self.namespace.tip_key(session).len();
        estimate_size(
            [tip, self.ownership.owner_key().len(), key],
            payloads
                .iter()
                .map(|p| (key, record::RECORD_HEADER + p.as_ref().len()))
                .chain([(tip, record::TIP_LEN)]),
            [key],
        )
    }

    /// Appends one event.
    pub async fn append(&self, payload: impl AsRef<[u8]>) -> Result<Appended, JournalWriteError> {
        self.append_batch(&[payload.as_ref()]).await
    }

    /// Appends events in one transaction: all of them or none.
    pub async fn append_batch<P: AsRef<[u8]>>(
        &self,
        payloads: &[P],
    ) -> Result<Appended, JournalWriteError> {
        let mut writer = self.writer.lock().await;
        match writer.condition {
            Condition::Open => {}
            Condition::Fenced => return Err(JournalWriteError::Fenced(self.fenced())),
            Condition::Indeterminate => return Err(JournalWriteError::Indeterminate),
            Condition::Closed => return Err(JournalWriteError::Closed),
        }
        self.ownership
            .check()
            .map_err(|source| JournalWriteError::LeaseLost(JournalLeaseLostError { source }))?;
        if payloads.is_empty() {
            return Err(JournalWriteError::Empty);
        }
        if payloads.len() > self.limits.max_records() {
            return Err(JournalWriteError::TooManyRecords {
                count: payloads.len(),
                max: self.limits.max_records(),
            });
        }
        let size = self.encoded_size(payloads);
        if size > self.limits.max_bytes() {
            return Err(JournalWriteError::TooLarge {
                bytes: size,
                max: self.limits.max_bytes(),
            });
        }

        let (epoch, nonce, first_seq) = (self.epoch(), Uuid::new_v4(), writer.next_seq);
        let last_seq = first_seq + payloads.len() as u64 - 1;
        let values = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| record::encode_event(first_seq + i as u64, epoch, nonce, p.as_ref()))
            .collect();
        let tip = encode_tip(&Tip {
            seq: last_seq,
            epoch,
            nonce,
        });
        let append = AppendTxn::build(
            &self.namespace,
            &self.ownership,
            first_seq,
            values,
            tip,
            writer.tip_mod_revision,
        );
        debug_assert_eq!(append.size, size);
        let first_key = self.namespace.record_key(self.session_id(), first_seq);
        // Until the send resolves, the tip is unknown: if this future is dropped mid-send, the
        // journal must not go on as if nothing had been sent.
        writer.condition = Condition::Indeterminate;
        let sent = send_resolving(&self.connection, &append.txn, &first_key, nonce).await;
        writer.condition = Condition::Open;
        match sent {
            Sent::Committed { revision } => {
                writer.next_seq = last_seq + 1;
                writer.tip_mod_revision = revision;
                Ok(Appended {
                    first_seq,
                    last_seq,
                    revision,
                })
            }
            Sent::Fenced => {
                writer.condition = Condition::Fenced;
                tracing::warn!(session = %self.session_id(), %epoch, "journal fenced");
                Err(JournalWriteError::Fenced(self.fenced()))
            }
            Sent::Unknown(error) => {
                writer.condition = Condition::Indeterminate;
                Err(JournalWriteError::OutcomeUnknown(error))
            }
            Sent::Failed(error) => Err(JournalWriteError::Etcd(error)),
        }
    }

    /// Waits for the append in flight, if any, and refuses every later one
    /// ([`JournalWriteError::Closed`]): after this, the last durable append is behind us.
    pub async fn close(&self) {
        self.writer.lock().await.condition = Condition::Closed;
    }

    fn fenced(&self) -> AppendError {
        AppendError {
            session_id: self.session_id(),
            epoch: self.epoch(),
        }
    }
}
