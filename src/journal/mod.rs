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
//! # Appending: one transaction at a time, shared by concurrent appends
//!
//! Every append (and the fence) is one transaction: compare the tip, the owner key's epoch and
//! the absence of the first new record; put the records and the new tip (see `cas` for the
//! exact transaction). Each transaction carries a fresh nonce, written into its records and
//! the tip. A failed compare is the hard fence ([`AppendError`]): the journal does not re-read
//! the tip or recover in place; it stays fenced. A journal whose lease is lost or past its
//! deadline refuses to append locally ([`JournalLeaseLostError`]), without sending anything.
//!
//! Every append call of a store's journals joins the store's one append queue (the `queue`
//! module). One transaction is in flight per journal. Appends that arrive meanwhile wait, and
//! the next transaction carries as many of them, in arrival order, as fit the
//! [limits](#limits) (group commit): under concurrency a journal commits many appends per
//! round trip, and a lone append is sent at once, with no timer. Each call is answered on its
//! own: its own sequence numbers, or the transaction's outcome (fenced, unknown, failed) as its
//! own error.
//!
//! The journals of one store share transactions too: at most a few transactions are in flight
//! for the whole store, and the journals waiting for one go together, each with its own
//! compares, in one etcd transaction (see the `batch` module). It applies all or nothing; when
//! it cannot apply because one journal is fenced, each journal's append is sent again on its
//! own, so one journal's fence or loss never becomes another's.
//!
//! # Outcome unknown
//!
//! A write that fails with a timeout, a lost connection, "request timed out" or "leader
//! changed" may still commit. The journal re-sends the byte-identical transaction (same nonce,
//! same compares; at most one send can ever commit), with backoff and on the next endpoint,
//! for as long as its lease is valid (a transaction shared by several journals: while any
//! member's lease is valid), and never past the store's write deadline
//! ([`WritePolicy::deadline`](crate::WritePolicy::deadline), three node lease TTLs by
//! default): a blip or an etcd leader election delays an append, it does not break the
//! journal, and a cluster that keeps refusing one journal's transaction while its renewals get
//! through does not hold the append forever. If a re-send's compare fails, its `else` branch
//! has read `r/{first}` and the tip in the same linearizable transaction: our nonce in either
//! means an earlier send committed; another append's record there, or no record and a tip that
//! has not reached it, means fenced (no send of ours can apply any more); `r/{first}` gone
//! while the tip has moved past it (a trim, or the journal deleted and made anew) leaves the
//! outcome unknown, never fenced. Reading the old tip alone would prove nothing (the first
//! send may still be in the raft log). Only when the lease stops being valid or the deadline
//! passes with the outcome still unknown, and a last read cannot settle it, does the append
//! return [`OutcomeUnknown`](JournalWriteError::OutcomeUnknown); the journal is then unusable
//! ([`Indeterminate`](JournalWriteError::Indeterminate)), since it no longer knows its tip. A
//! committed append is never reported as failed, and never applied twice.
//!
//! # Exactly once, by idempotency key
//!
//! [`Journal::append_with_key`] appends at most once per [`IdempotencyKey`] under the
//! journal's epoch, and the journal's records decide it: the key (a digest of the caller's
//! request id) is written into every record of the append, with the record's place in the
//! append, so any one record names the whole append. The journal knows every key it sent under
//! its epoch (one journal per lease, and only it writes under that epoch): a key it has not sent
//! is appended with no read; a repeat waits for its first call, or reads the append's records
//! back, compares them with its payloads and is told the first call's sequence numbers. A key
//! whose call certainly did not apply (refused before sending, fenced, failed by etcd) may be
//! sent again. For a retry that comes after the journal is gone (a restart, another process,
//! the ownership ended), [`Store::find_append`](crate::Store::find_append) reads the answer from
//! the records: found, not appended (the epoch's records read to its fence without the key, and
//! the owner key no longer at the epoch, so no transaction of it can apply any more), or
//! [`Unknowable`] (still owned, trimmed, no fence). See the `find` module.
//!
//! # Cancel safety
//!
//! Transactions are sent on the store's tasks, never on a caller's future. Dropping the future
//! of an append withdraws it if no transaction has taken it yet; if one has, it commits or not
//! with that transaction, and the journal learns which: dropping an append never leaves the
//! journal indeterminate. (Only a transaction cut short by its runtime shutting down does: the
//! journal then no longer knows its tip, its calls get
//! [`Indeterminate`](JournalWriteError::Indeterminate), and so does every later append, and
//! [`Journal::broken`] resolves; give the session up and open it again under a new lease, as
//! a [`SessionHost`](crate::SessionHost) does by itself.)
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
//! [`ReplayError::Compacted`].
//!
//! # Retention
//!
//! etcd is shared and has a storage quota; a full quota stops writes for every tenant. So a
//! journal can be trimmed ([`Journal::trim`], or an operator's
//! [`Admin::trim`](crate::admin::Admin::trim)) and a finished session's journal deleted
//! ([`Store::delete_journal`](crate::Store::delete_journal),
//! [`Admin::delete_journal`](crate::admin::Admin::delete_journal)). `{ns}/journals/{s}/base`
//! holds the first sequence number kept (absent: the first record, 1 for a journal never
//! trimmed); a trim moves it and deletes the records below it in one transaction, in batches
//! of [`TRIM_BATCH`], comparing the base as read and, for the owner, the owner key's epoch. It
//! never touches the tip, so it never fences the writer; the last record is always kept.
//! Replays start at the base, and a gap below it is a trim, not a loss. Under etcd's NOSPACE
//! alarm, which refuses every transaction that puts a key, a trim goes on with deletes only:
//! it deletes the base key with the records, and the journal starts at its first record until
//! a later trim writes the base key again. A trim may remove the records of an append whose reply has not come back
//! yet: the append then still finds its outcome by the tip, which names the last append. An
//! append whose records were trimmed after another append moved the tip on, or whose journal
//! was deleted meanwhile, is reported [`OutcomeUnknown`](JournalWriteError::OutcomeUnknown),
//! never fenced. Deleted keys still take space in etcd's backend until etcd compacts its
//! history and defragments.
//!
//! # Encoding
//!
//! See the `record` module: a versioned binary envelope; decoding garbage yields a
//! [`DecodeError`] naming the key, never a panic.

mod batch;
mod cas;
mod check;
mod error;
mod fence;
mod find;
mod key;
mod keyed;
mod limits;
mod queue;
mod record;
#[cfg(feature = "testing")]
pub(crate) use queue::mutant;
mod replay;
mod retention;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::etcd::Connection;
use crate::etcd::write::WritePolicy;
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};
use crate::metrics::{AppendOutcome, Metrics, Put};
pub(crate) use find::find;
pub use find::{Found, Unknowable};
pub(crate) use keyed::KeyBudget;
use keyed::{Answering, Begun, Settled};
use queue::Writer;
pub(crate) use queue::{Batcher, BatcherParts};

pub use check::{JournalCheck, Violation};
pub(crate) use check::{check, check_all};
pub use error::{
    AppendError, JournalLeaseLostError, JournalWriteError, NilLeaseError, OpenJournalError,
    ReplayError, RetentionError,
};
pub(crate) use fence::{SeenTip, open};
pub use key::IdempotencyKey;
pub use limits::{JournalLimits, MAX_IN_FLIGHT, MIN_TXN_OPS, ReplayOptions};
pub use record::{DecodeError, Event, Fence, Record, Tip};
pub(crate) use record::{decode_record, decode_tip, seq_of_key};
pub use replay::Replay;
pub(crate) use retention::{Authority, Retention, base_of, first_record};
pub use retention::{Deleted, TRIM_BATCH, Trimmed};

/// Whether a call with an idempotency key was its key's first (for the sidecar's metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
pub(crate) enum Repeat {
    /// The first call with the key: it was sent.
    First,
    /// A later call, told what the first call (under way) came to.
    Waited,
    /// A later call, answered from the journal's records.
    Read,
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

/// What a journal needs of its store: where to write, under which names, within which limits,
/// and the store's shutdown. One per store, shared by its journals.
pub(crate) struct JournalContext {
    /// The store's span (node, namespace), parent of the journal's.
    pub(crate) span: tracing::Span,
    pub(crate) metrics: Metrics,
    pub(crate) connection: Connection,
    pub(crate) namespace: Namespace,
    pub(crate) limits: JournalLimits,
    pub(crate) policy: WritePolicy,
    pub(crate) stop: CancellationToken,
    /// The store's append queue.
    pub(crate) batcher: Arc<Batcher>,
    /// The places for the idempotency keys of the store's open journals.
    pub(crate) keys: Arc<KeyBudget>,
}

/// A session's journal, open for appending under one lease. One transaction is in flight at a
/// time; the appends that arrive meanwhile are committed together in the next one.
pub struct Journal {
    context: Arc<JournalContext>,
    ownership: Ownership,
    /// The journal's side of the store's append queue.
    writer: Arc<Writer>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("session", &self.ownership.session_id())
            .field("epoch", &self.ownership.epoch())
            .finish()
    }
}

impl Journal {
    /// The journal whose fence `writer` committed.
    pub(crate) fn with_writer(
        context: Arc<JournalContext>,
        ownership: Ownership,
        writer: Arc<Writer>,
    ) -> Self {
        Self {
            context,
            ownership,
            writer,
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
        &self.context.limits
    }

    /// Whether the journal can no longer append: it was fenced, an append's outcome stayed
    /// unknown, or an append found its lease lost. No lock, no I/O.
    pub fn is_broken(&self) -> bool {
        self.writer.is_broken()
    }

    /// Resolves once the journal can no longer append (see [`is_broken`](Self::is_broken)):
    /// the session must be given up and opened again under a new lease to go on. Like
    /// [`Lost`](crate::Lost), awaiting it after the fact resolves at once.
    pub async fn broken(&self) {
        self.writer.broken().await;
    }

    /// Runs `hook` once, when the journal breaks (see `Writer::on_broken`).
    pub(crate) fn on_broken(&self, hook: impl FnOnce() + Send + 'static) {
        self.writer.on_broken(hook);
    }

    /// The encoded size the limits are checked against, for a batch of these payloads.
    pub fn encoded_size<P: AsRef<[u8]>>(&self, payloads: &[P]) -> usize {
        self.writer.encoded_size(payloads, false)
    }

    /// Appends one event. See [`append_batch`](Self::append_batch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold::{Journal, JournalWriteError};
    ///
    /// # async fn example(journal: Journal) -> Result<(), Box<dyn std::error::Error>> {
    /// match journal.append(br#"{"step": 1}"#).await {
    ///     Ok(appended) => println!("event {} at {}", appended.first_seq, appended.revision),
    ///     // Refused by etcd and not applied: the journal can go on.
    ///     Err(JournalWriteError::Etcd(error)) => println!("not appended: {error}"),
    ///     // Fenced, the lease lost, the outcome unknown: this journal can append no more.
    ///     Err(error) => return Err(error.into()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn append(&self, payload: impl AsRef<[u8]>) -> Result<Appended, JournalWriteError> {
        self.append_batch(&[payload.as_ref()]).await
    }

    /// Appends events in one transaction: all of them or none.
    ///
    /// Concurrent appends to one journal are committed together (group commit): while one
    /// transaction is in flight, the appends that arrive queue up, and the next transaction
    /// takes as many of them, in arrival order, as fit its limits. Each call still gets its own
    /// [`Appended`] (its own sequence numbers, in the journal in the order the calls were
    /// queued) or its own copy of the batch's error: a fenced transaction fences every call in
    /// it, and every call of a transaction whose outcome stays unknown is told so. A call
    /// never waits for a timer: when nothing is in flight, it is sent at once.
    ///
    /// An append whose outcome is unknown is re-sent while the lease is valid, so it may take
    /// as long as the lease stays valid (bounded by the node lease's TTL) during an outage.
    /// **Cancel safety:** dropping the future of an append withdraws it unless a
    /// transaction took it already; one that did commits or not, and the journal learns which
    /// (see the [module docs](self#cancel-safety)).
    pub async fn append_batch<P: AsRef<[u8]>>(
        &self,
        payloads: &[P],
    ) -> Result<Appended, JournalWriteError> {
        self.check(payloads, false)?;
        let owned = payloads.iter().map(|p| p.as_ref().to_vec()).collect();
        let answer = self.context.batcher.append(&self.writer, owned);
        self.sent(payloads.len(), answer).await
    }

    /// Appends events in one transaction, all or none, **at most once for `key`** under this
    /// journal's epoch: a call with a key already appended is answered where that append's
    /// records are, and appends nothing.
    ///
    /// The key is written into every record of the append (see [`IdempotencyKey`]), so the
    /// journal's records, not this process's memory, say where an append with it committed.
    /// A first call costs what [`append_batch`](Self::append_batch) costs: the journal knows
    /// every key it sent under its epoch (one journal per lease, and only it writes under that
    /// epoch), so a key it has not sent needs no read. A call with a key it has sent waits for
    /// that first call if it is still under way and is told the same; after it, one read of
    /// the append's records answers it (its sequence numbers and revision), once compared with
    /// this call's payloads. What the first call was refused without applying (fenced, etcd
    /// unavailable, the lease lost) frees the key: the next call with it is sent anew.
    ///
    /// For a retry that comes after the journal is gone (its process restarted, the session
    /// moved on), [`Store::find_append`](crate::Store::find_append) reads the answer from the
    /// journal's records.
    ///
    /// Fails as [`append_batch`](Self::append_batch) does, and with
    /// [`KeyReused`](JournalWriteError::KeyReused) when the key names an append of other
    /// payloads, [`Trimmed`](JournalWriteError::Trimmed) when the key's append committed and
    /// its records were trimmed since, [`Indeterminate`](JournalWriteError::Indeterminate)
    /// when its first call's outcome stayed unknown, and
    /// [`KeysExhausted`](JournalWriteError::KeysExhausted) past
    /// [`JournalLimits::max_keys`]. Cancel safe as `append_batch`.
    ///
    /// ```no_run
    /// # async fn example(journal: leasehold::Journal) -> Result<(), leasehold::JournalWriteError> {
    /// use leasehold::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("order-7/step-3");
    /// let first = journal.append_with_key(key, &[b"charged card"]).await?;
    /// // A retry (its caller never heard the answer): told the same, nothing appended.
    /// let again = journal.append_with_key(key, &[b"charged card"]).await?;
    /// assert_eq!(first, again);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn append_with_key<P: AsRef<[u8]>>(
        &self,
        key: IdempotencyKey,
        payloads: &[P],
    ) -> Result<Appended, JournalWriteError> {
        self.append_keyed(key, payloads).await.0
    }

    /// [`append_with_key`](Self::append_with_key), and whether this call was its key's first.
    pub(crate) async fn append_keyed<P: AsRef<[u8]>>(
        &self,
        key: IdempotencyKey,
        payloads: &[P],
    ) -> (Result<Appended, JournalWriteError>, Repeat) {
        if let Err(refused) = self.check(payloads, true) {
            return (Err(refused), Repeat::First);
        }
        let digest = keyed::digest(payloads);
        loop {
            match self.writer.keys().begin(key, digest) {
                Begun::First(ticket) => {
                    let owned = payloads.iter().map(|p| p.as_ref().to_vec()).collect();
                    let answer = self
                        .context
                        .batcher
                        .append_keyed(&self.writer, ticket, owned);
                    return (self.sent(payloads.len(), answer).await, Repeat::First);
                }
                Begun::Wait(first) => match keyed::settled(first).await {
                    Settled::Answered(answered) => return (answered, Repeat::Waited),
                    // Its caller went away before a transaction took it: this call is first.
                    Settled::Withdrawn => continue,
                },
                Begun::Committed(first_seq) => {
                    return (
                        self.read_keyed(key, first_seq, payloads).await,
                        Repeat::Read,
                    );
                }
                Begun::Unknown => return (Err(JournalWriteError::Indeterminate), Repeat::Read),
                Begun::Reused => return (Err(JournalWriteError::KeyReused), Repeat::Waited),
                Begun::Exhausted { max } => {
                    return (Err(JournalWriteError::KeysExhausted { max }), Repeat::First);
                }
            }
        }
    }

    /// What this journal's append with `key` came to, appending nothing: `None` if no append
    /// with it was made under this epoch (yet), or none applied; its answer otherwise (read
    /// from the journal's records, as [`append_with_key`](Self::append_with_key) reads it),
    /// after waiting for one under way. For a service that answers a retry it may not write
    /// for itself (its caller is not the session's holder).
    pub async fn appended_with_key<P: AsRef<[u8]>>(
        &self,
        key: IdempotencyKey,
        payloads: &[P],
    ) -> Option<Result<Appended, JournalWriteError>> {
        if payloads.is_empty() {
            return Some(Err(JournalWriteError::Empty));
        }
        match self
            .writer
            .keys()
            .begin_answer(key, keyed::digest(payloads))
        {
            Answering::Nothing => None,
            Answering::Wait(first) => match keyed::settled(first).await {
                Settled::Answered(Ok(appended)) => Some(Ok(appended)),
                Settled::Answered(Err(error @ JournalWriteError::OutcomeUnknown(_))) => {
                    Some(Err(error))
                }
                // Not appended: refused, or withdrawn.
                Settled::Answered(Err(_)) | Settled::Withdrawn => None,
            },
            Answering::Committed(first_seq) => {
                Some(self.read_keyed(key, first_seq, payloads).await)
            }
            Answering::Unknown => Some(Err(JournalWriteError::Indeterminate)),
            Answering::Reused => Some(Err(JournalWriteError::KeyReused)),
        }
    }

    /// The answer to a call with `key`, whose append committed from `first_seq`, read from
    /// the journal's records and compared with `payloads`.
    async fn read_keyed<P: AsRef<[u8]>>(
        &self,
        key: IdempotencyKey,
        first_seq: u64,
        payloads: &[P],
    ) -> Result<Appended, JournalWriteError> {
        // Never empty: checked before.
        let last_seq = first_seq.saturating_add((payloads.len() as u64).saturating_sub(1));
        let context = &self.context;
        let read = find::read_append(
            &context.connection,
            &context.namespace,
            self.session_id(),
            key,
            (first_seq, last_seq),
            payloads,
            0,
        )
        .await;
        match read {
            Ok(Found::Appended(appended)) => Ok(appended),
            Ok(Found::Unknown(_)) => Err(JournalWriteError::Trimmed { first_seq }),
            Ok(_) => Err(JournalWriteError::KeyReused),
            Err(ReplayError::Decode(error)) => Err(JournalWriteError::Undecodable(error)),
            Err(ReplayError::Etcd(error)) => Err(JournalWriteError::Etcd(error)),
            Err(ReplayError::Compacted { .. }) => {
                unreachable!("a read at the current revision is never compacted")
            }
        }
    }

    /// What can be refused from the call alone (`keyed`: an append with an idempotency key);
    /// the journal's condition and the lease are checked when the call joins the queue, and
    /// again when its transaction is formed.
    fn check<P: AsRef<[u8]>>(&self, payloads: &[P], keyed: bool) -> Result<(), JournalWriteError> {
        if payloads.is_empty() {
            return Err(JournalWriteError::Empty);
        }
        let limits = &self.context.limits;
        if payloads.len() > limits.max_records() {
            return Err(JournalWriteError::TooManyRecords {
                count: payloads.len(),
                max: limits.max_records(),
            });
        }
        let size = self.writer.encoded_size(payloads, keyed);
        if size > limits.max_bytes() {
            return Err(JournalWriteError::TooLarge {
                bytes: size,
                max: limits.max_bytes(),
            });
        }
        Ok(())
    }

    /// Waits for `answer`, the answer to an append of `count` records, in the append's span,
    /// and counts it in the metrics.
    async fn sent(
        &self,
        count: usize,
        answer: impl std::future::Future<Output = queue::Answer>,
    ) -> Result<Appended, JournalWriteError> {
        let started = tokio::time::Instant::now();
        let span = tracing::info_span!(parent: &self.context.span, "append", session = %self.session_id(), epoch = %self.epoch());
        let answer = answer.instrument(span).await;
        count_append(
            &self.context.metrics,
            &answer.result,
            answer.by_read,
            answer.for_space,
            count,
            started.elapsed(),
        );
        answer.result
    }

    /// The sequence number the next append takes, as this journal knows it now: just after
    /// its fence when it was just opened, and after the last append that committed since.
    pub fn next_seq(&self) -> u64 {
        self.writer.next_seq()
    }

    /// Trims the journal: removes the records before `before`, keeping `before` and every
    /// record after it, under this journal's epoch (see the [retention](self#retention)
    /// protocol). It never fences appends, and may run while they go on. Idempotent: a journal
    /// already trimmed that far is left as it is.
    ///
    /// Works under etcd's NOSPACE alarm too (with deletes only), so that trimming can free a
    /// full etcd: see the [retention](self#retention) protocol.
    ///
    /// Fails with [`BeyondTip`](RetentionError::BeyondTip) past the last record (always kept),
    /// [`NotOwner`](RetentionError::NotOwner) when the session is no longer owned at this
    /// epoch, and [`LeaseLost`](RetentionError::LeaseLost) once the lease is invalid.
    pub async fn trim(&self, before: u64) -> Result<Trimmed, RetentionError> {
        let span = tracing::info_span!(parent: &self.context.span, "trim", session = %self.session_id(), epoch = %self.epoch(), before);
        self.retention()
            .trim(before, TRIM_BATCH)
            .instrument(span)
            .await
    }

    fn retention(&self) -> Retention<'_> {
        let context = &self.context;
        Retention {
            connection: &context.connection,
            namespace: &context.namespace,
            policy: &context.policy,
            stop: &context.stop,
            session: self.session_id(),
            authority: Authority::Owner(&self.ownership),
        }
    }

    /// Waits for the append in flight, if any, and refuses every later one
    /// ([`JournalWriteError::Closed`]): after this, the last durable append is behind us.
    pub async fn close(&self) {
        self.writer.close().await;
    }
}

/// Counts an append call in `metrics`: its outcome, and what etcd's answer says of the NOSPACE
/// alarm (a write etcd accepted clears it; one it refused for space raises it, also one it
/// applied and answered NOSPACE all the same: `for_space`).
fn count_append<T>(
    metrics: &Metrics,
    answered: &Result<T, JournalWriteError>,
    resolved_by_read: bool,
    for_space: bool,
    records: usize,
    took: std::time::Duration,
) {
    match answered {
        _ if for_space => metrics.written(Put::RefusedForSpace),
        Ok(_) => metrics.written(Put::Accepted),
        Err(JournalWriteError::Etcd(error)) if error.is_no_space() => {
            metrics.written(Put::RefusedForSpace);
        }
        Err(_) => {}
    }
    metrics.append(append_outcome(answered, resolved_by_read), records, took);
}

/// The `outcome` an append call counts under.
fn append_outcome<T>(
    result: &Result<T, JournalWriteError>,
    resolved_by_read: bool,
) -> AppendOutcome {
    match result {
        // Committed or fenced, as only the resolving read could tell.
        Ok(_) | Err(JournalWriteError::Fenced(_)) if resolved_by_read => AppendOutcome::Resolved,
        Ok(_) => AppendOutcome::Committed,
        Err(JournalWriteError::Fenced(_)) => AppendOutcome::Fenced,
        Err(JournalWriteError::OutcomeUnknown(_)) => AppendOutcome::Unknown,
        Err(_) => AppendOutcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::etcd::EtcdError;

    #[test]
    fn an_etcd_refusal_for_space_raises_the_nospace_alarm_and_an_appended_record_clears_it() {
        let metrics = Metrics::new("n", &Namespace::default());
        let nospace = metrics.nospace();
        let full = EtcdError::no_space("txn");
        let refused = Err::<(), _>(JournalWriteError::Etcd(full));
        count_append(&metrics, &refused, false, false, 1, Duration::ZERO);
        assert!(*nospace.borrow());
        count_append(&metrics, &Ok(()), false, false, 1, Duration::ZERO);
        assert!(!*nospace.borrow());
        // Committed, and answered NOSPACE all the same (etcd applied it, then raised the alarm).
        count_append(&metrics, &Ok(()), true, true, 1, Duration::ZERO);
        assert!(*nospace.borrow());
    }

    #[test]
    fn an_append_counts_under_one_outcome() {
        let fenced = || {
            Err::<(), _>(JournalWriteError::Fenced(AppendError {
                session_id: uuid::Uuid::nil(),
                epoch: Epoch(7),
            }))
        };
        let unknown = || {
            let error = EtcdError::timed_out("append", "e", Duration::from_secs(1));
            Err::<(), _>(JournalWriteError::OutcomeUnknown(error))
        };
        assert_eq!(append_outcome(&Ok(()), false), AppendOutcome::Committed);
        assert_eq!(append_outcome(&fenced(), false), AppendOutcome::Fenced);
        assert_eq!(append_outcome(&unknown(), false), AppendOutcome::Unknown);
        assert_eq!(
            append_outcome(&Err::<(), _>(JournalWriteError::Indeterminate), false),
            AppendOutcome::Failed
        );
        // Settled by the resolving read, committed or not.
        assert_eq!(append_outcome(&Ok(()), true), AppendOutcome::Resolved);
        assert_eq!(append_outcome(&fenced(), true), AppendOutcome::Resolved);
    }
}
