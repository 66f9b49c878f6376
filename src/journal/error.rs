//! What a journal's operations return: opening ([`OpenJournalError`]), appending
//! ([`JournalWriteError`], with the hard fence [`AppendError`]), replaying ([`ReplayError`]),
//! trimming and deleting ([`RetentionError`]).

use uuid::Uuid;

use super::DecodeError;
use crate::etcd::EtcdError;
use crate::lease::error::lease_state;
use crate::lease::{Epoch, LeaseLostError};

/// `open_journal` was given no lease. Permanent: a journal is only written under a lease.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no lease given for session {session_id}: a journal is opened under its owner's lease")]
pub struct NilLeaseError {
    /// The session.
    pub session_id: Uuid,
}

/// The lease is lost or invalid, so the journal refused the operation locally, before sending
/// anything. Permanent for this journal; its `source()` is the [`LeaseLostError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the journal of session {} refuses to write: its lease is not valid", .source.session_id)]
pub struct JournalLeaseLostError {
    /// Why the lease is not valid.
    #[source]
    pub source: LeaseLostError,
}

/// The hard fence: an append's compare failed at etcd, because another owner fenced the
/// journal (or its lease's owner key is gone). The append did not commit, and the journal stays
/// fenced: every later append fails with this error too. Permanent for this journal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the journal of session {session_id} is fenced: epoch {epoch} no longer owns it")]
pub struct AppendError {
    /// The session.
    pub session_id: Uuid,
    /// The epoch of the fenced writer.
    pub epoch: Epoch,
}

/// [`Store::open_journal`](crate::Store::open_journal) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenJournalError {
    /// No lease was given. Permanent.
    #[error("no lease")]
    NilLease(#[source] NilLeaseError),
    /// The lease owns another session. Permanent.
    #[error("the lease owns session {lease_session}, not {session_id}")]
    WrongSession {
        /// The session asked for.
        session_id: Uuid,
        /// The session the lease owns.
        lease_session: Uuid,
    },
    /// The lease was acquired through another store. Permanent.
    #[error("the lease belongs to another store")]
    ForeignLease,
    /// A journal was already opened with this lease: one journal per lease, so that fence
    /// epochs strictly increase. Permanent.
    #[error("a journal was already opened with the lease at epoch {epoch}")]
    AlreadyOpen {
        /// The lease's epoch.
        epoch: Epoch,
    },
    /// The lease is not valid. Permanent for this lease.
    #[error("cannot open the journal")]
    LeaseLost(#[source] JournalLeaseLostError),
    /// The owner key no longer has the lease's epoch, or the fence's compare failed. Permanent
    /// for this lease.
    #[error("cannot open the journal")]
    Fenced(#[source] AppendError),
    /// The stored tip is corrupt. Permanent.
    #[error("cannot open the journal")]
    Decode(#[source] DecodeError),
    /// The journal's last sequence number leaves no room for a fence and a record. Permanent.
    #[error("the journal's tip is at sequence number {seq}: no room for more records")]
    SequenceExhausted {
        /// The tip's sequence number.
        seq: u64,
    },
    /// The fence's outcome stayed unknown until the lease stopped being valid. Outcome
    /// unknown: open again with a fresh lease.
    #[error("the fence's outcome is unknown")]
    OutcomeUnknown(#[source] EtcdError),
    /// etcd failed the request. Transient or permanent as its class says.
    #[error("cannot open the journal")]
    Etcd(#[source] EtcdError),
}

/// [`Journal::append`](crate::Journal::append) or
/// [`append_batch`](crate::Journal::append_batch) failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalWriteError {
    /// Refused locally: the lease is lost or invalid. Nothing was sent. Permanent.
    #[error("append refused: the lease is {}", lease_state(.0.source.reason))]
    LeaseLost(#[source] JournalLeaseLostError),
    /// The hard fence: not committed, and the journal stays fenced. Permanent.
    #[error("append failed")]
    Fenced(#[source] AppendError),
    /// An empty batch. Permanent.
    #[error("an append needs at least one record")]
    Empty,
    /// More records than one transaction can carry (etcd's op limit, less the tip). Nothing was
    /// sent. Permanent for this batch: split it.
    #[error("{count} records in one append; at most {max} fit one transaction")]
    TooManyRecords {
        /// Records in the batch.
        count: usize,
        /// The most one append takes.
        max: usize,
    },
    /// The encoded transaction is larger than etcd's request limit (less headroom). Nothing
    /// was sent. Permanent for this batch: split it.
    #[error("the append encodes to {bytes} bytes; at most {max} fit one request")]
    TooLarge {
        /// The encoded size.
        bytes: usize,
        /// The most one append takes.
        max: usize,
    },
    /// The sequence numbers would pass `u64::MAX`. Nothing was sent. Permanent.
    #[error("the journal has no sequence numbers left after {seq}")]
    SequenceExhausted {
        /// The first sequence number the append would have taken.
        seq: u64,
    },
    /// The append's outcome stayed unknown while it was re-sent for as long as the lease was
    /// valid, and a last read could not settle it: it committed at most once, or not at all.
    /// The journal is unusable (its tip is unknown); reopen it under a new lease to continue.
    /// Outcome unknown.
    #[error("the append's outcome is unknown")]
    OutcomeUnknown(#[source] EtcdError),
    /// An earlier append's outcome stayed unknown: the journal no longer knows its tip.
    /// Permanent for this journal.
    #[error("the journal's tip is unknown after an append with an unknown outcome")]
    Indeterminate,
    /// The journal was closed (its session is shutting down). Permanent.
    #[error("the journal is closed")]
    Closed,
    /// etcd failed the request without applying it. Transient or permanent as its class says;
    /// the journal can go on.
    #[error("append failed")]
    Etcd(#[source] EtcdError),
    /// The idempotency key names an append of other records under this epoch
    /// ([`Journal::append_with_key`](crate::Journal::append_with_key)). Nothing was appended.
    /// Permanent for this key.
    #[error("the idempotency key names an append of other records")]
    KeyReused,
    /// An append with this idempotency key committed from sequence number `first_seq`, and
    /// its records were trimmed since: what it was told can no longer be read back. Nothing
    /// was appended now. Permanent.
    #[error(
        "the idempotency key's append committed from {first_seq}, and its records were trimmed"
    )]
    Trimmed {
        /// The append's first sequence number.
        first_seq: u64,
    },
    /// A record read back for an idempotency key does not decode. Nothing was appended.
    /// Permanent.
    #[error("append failed")]
    Undecodable(#[source] DecodeError),
    /// The store's open journals hold [`JournalLimits::max_keys`](crate::JournalLimits::max_keys)
    /// idempotency keys already. Nothing was sent. Transient: keys are freed as journals
    /// close.
    #[error("the store's journals hold {max} idempotency keys already")]
    KeysExhausted {
        /// The store's limit.
        max: usize,
    },
}

/// Replaying a journal failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The snapshot revision was compacted while the replay was under way. Replay again (from a
    /// newer snapshot). Transient.
    #[error("the replay's snapshot revision {revision} was compacted")]
    Compacted {
        /// The snapshot revision.
        revision: i64,
    },
    /// A record could not be decoded. Permanent.
    #[error("replay failed")]
    Decode(#[source] DecodeError),
    /// etcd failed the request. Transient or permanent as its class says.
    #[error("replay failed")]
    Etcd(#[source] EtcdError),
}

/// Trimming or deleting a journal was refused or failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// Refused locally: the lease is lost or invalid. Nothing more was sent. Permanent.
    #[error("refused")]
    LeaseLost(#[source] JournalLeaseLostError),
    /// The session's owner key is not at this epoch (a stale owner): nothing was changed.
    /// Permanent.
    #[error("session {session} is not owned at epoch {epoch} (owner epoch: {})", .owner.map_or("none".to_owned(), |e| e.to_string()))]
    NotOwner {
        /// The session.
        session: Uuid,
        /// The epoch the trim or delete was made under.
        epoch: Epoch,
        /// The owner key's epoch, if anyone owns the session.
        owner: Option<Epoch>,
    },
    /// An operator's delete of a journal whose session is owned: revoke it first. Nothing was
    /// changed. Permanent while the session is owned.
    #[error(
        "session {session} is owned (epoch {owner}): a journal is deleted only when nobody owns its session"
    )]
    Owned {
        /// The session.
        session: Uuid,
        /// The owner's epoch.
        owner: Epoch,
    },
    /// A trim past the last record, which is always kept. Nothing was changed. Permanent.
    #[error(
        "cannot trim before {before}: the journal ends at {tip}, and its last record is always kept"
    )]
    BeyondTip {
        /// The first sequence number the trim would keep.
        before: u64,
        /// The tip's sequence number (0: no journal).
        tip: u64,
    },
    /// The base or tip could not be decoded. Permanent.
    #[error("retention failed")]
    Decode(#[source] DecodeError),
    /// Others kept changing the journal's base or tip between each read and write. Transient.
    #[error("the journal of {session} kept changing under the trim or delete")]
    Contended {
        /// The session.
        session: Uuid,
    },
    /// etcd failed. A trim may have moved the base part of the way, a delete may have
    /// applied; repeating either is safe. Transient or permanent as its class says.
    #[error("retention failed")]
    Etcd(#[source] EtcdError),
}

impl ReplayError {
    /// A read at `revision` failed: [`Compacted`](Self::Compacted) if etcd compacted it.
    pub(crate) fn reading_at(revision: i64) -> impl FnOnce(EtcdError) -> Self {
        move |error| {
            if error.is_compacted() {
                ReplayError::Compacted { revision }
            } else {
                ReplayError::Etcd(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LossReason;

    #[test]
    fn an_append_refused_for_a_lost_lease_says_why() {
        let refused = |reason| {
            JournalWriteError::LeaseLost(JournalLeaseLostError {
                source: LeaseLostError {
                    session_id: Uuid::nil(),
                    epoch: Epoch(7),
                    reason,
                },
            })
            .to_string()
        };
        assert_eq!(
            refused(Some(LossReason::Overtaken)),
            "append refused: the lease is lost (overtaken)"
        );
        assert_eq!(
            refused(None),
            "append refused: the lease is past its validity deadline"
        );
    }
}
