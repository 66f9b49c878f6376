//! The append transaction (fences are appends too), and how its outcome is read.
//!
//! ```text
//! if   mod_revision(tip)             == the tip's mod_revision this writer last saw (0: none)
//! and  create_revision(owner key)    == epoch
//! and  create_revision(r/{first})    == 0
//! then put(r/{first}) … put(r/{last}), put(tip)
//! else get(r/{first}), get(tip)
//! ```
//!
//! It is sent through the crate's one write path. What it came to:
//!
//! - applied: committed at the reply's revision;
//! - compare failed: the `else` branch read `r/{first}` and the tip in the same linearizable
//!   transaction. Our nonce on either means an earlier send committed. Otherwise the
//!   transaction is fenced, for good (the tip, the owner key at this epoch and an absent
//!   `r/{first}` can never all hold again), unless an earlier send's outcome was unknown and
//!   the record in `r/{first}`'s place may be gone: the tip is at or past it (a trim removed
//!   the record), or the journal was deleted since the append read its tip (no tip, or one
//!   created later; for a journal's first fence, which read no tip, any tip or none). Whose
//!   record it was can no longer be read, so the outcome stays unknown;
//! - refused for space (etcd's NOSPACE, which etcd also answers the transaction that took it
//!   past its quota *after applying it*), with no earlier send that may have applied: one read
//!   of `r/{first}`, the tip and the owner key, made after the refusal, settles it. Our nonce:
//!   committed. Another record there, or none and no owner key at this epoch: fenced. None
//!   under our owner key: not applied, and never will be (the refusal was final), so the
//!   append fails with etcd's error and the journal stays open. A place whose record may be
//!   gone, or no read: unknown;
//! - unknown until the lease stopped being valid: one read of `r/{first}`, the tip and the
//!   owner key. Our nonce on the record or the tip: committed. Another record there, or none
//!   ever and no owner key at this epoch (so the transaction can never apply): fenced. A
//!   place whose record may be gone, as above, or none yet under our owner key: still
//!   unknown.
//!
//! The tip is read because records can go: it carries the nonce of the append that wrote it,
//! and a trim never removes the last record, so an append whose first records were trimmed
//! before its outcome was read is still recognised while it is the last.

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnResponse};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::record::{decode_record, decode_tip};
use crate::etcd::write::{self, WritePolicy, Written};
use crate::etcd::{Connection, EtcdError, gets};
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};

/// What a sent append came to. `by_read`: the sends' outcome stayed unknown, and only the
/// resolving read settled it (for the metrics).
#[derive(Debug)]
pub(crate) enum Sent {
    /// `for_space`: etcd answered it NOSPACE all the same (it applied it, then raised its
    /// alarm), so etcd now refuses puts.
    Committed {
        revision: i64,
        by_read: bool,
        for_space: bool,
    },
    Fenced {
        by_read: bool,
    },
    Unknown(EtcdError),
    Failed(EtcdError),
}

impl Sent {
    /// Whether the resolving read settled it: committed or fenced, found by that read rather
    /// than by a reply.
    pub(crate) fn by_read(&self) -> bool {
        match self {
            Sent::Committed { by_read, .. } | Sent::Fenced { by_read } => *by_read,
            Sent::Unknown(_) | Sent::Failed(_) => false,
        }
    }

    /// Whether it committed and etcd answered it NOSPACE all the same, so that etcd now refuses
    /// puts. (One refused unapplied says so by its error.)
    pub(crate) fn for_space(&self) -> bool {
        matches!(
            self,
            Sent::Committed {
                for_space: true,
                ..
            }
        )
    }

    /// The same outcome, settled by a read if `by_read` (an earlier read of a shared
    /// transaction found that it never applied, and this send of one member's part settled
    /// it).
    pub(crate) fn told_by_read(self, by_read: bool) -> Self {
        match self {
            Sent::Committed {
                revision,
                by_read: own,
                for_space,
            } => Sent::Committed {
                revision,
                by_read: own || by_read,
                for_space,
            },
            Sent::Fenced { by_read: own } => Sent::Fenced {
                by_read: own || by_read,
            },
            other => other,
        }
    }
}

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

/// What an append compares, in the order its transaction does (see the module docs). The one
/// list: [`AppendTxn::build`] makes each compare from it, [`append_size`] counts each key, and
/// [`APPEND_COMPARES`] is its length; a new compare is a new entry here, and the matches on it
/// say what else it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compared {
    /// The tip's mod revision is the one the append was made on.
    Tip,
    /// The owner key is the ownership's (its guard: the key's create revision is the epoch).
    Owner,
    /// The first record's key is absent.
    FirstRecord,
}

pub(crate) const COMPARED: [Compared; 3] = [Compared::Tip, Compared::Owner, Compared::FirstRecord];

/// How many compares one append puts into a transaction.
pub(crate) const APPEND_COMPARES: usize = COMPARED.len();

/// [`estimate_size`] of an append transaction: its compares, its records and tip, and the two
/// gets of its `else` branch. Keys are the lengths of a record key, the tip key and the owner
/// key; `values` the encoded records' lengths.
pub(crate) fn append_size(
    record_key: usize,
    tip_key: usize,
    owner_key: usize,
    values: impl IntoIterator<Item = usize>,
    tip_value: usize,
) -> usize {
    estimate_size(
        COMPARED.map(|compared| match compared {
            Compared::Tip => tip_key,
            Compared::Owner => owner_key,
            Compared::FirstRecord => record_key,
        }),
        values
            .into_iter()
            .map(|value| (record_key, value))
            .chain([(tip_key, tip_value)]),
        [record_key, tip_key],
    )
}

/// The gets of an append's `else` branch: its first record and the tip.
pub(crate) const ELSE_GETS: usize = 2;

/// The gets of an append's resolving read: its first record, the tip and the owner key.
pub(crate) const RESOLVE_GETS: usize = 3;

/// The append transaction described in the module docs, with what settles its outcome. Kept
/// as its parts, so that appends of several sessions can share one transaction (see
/// [`batch`](super::batch)).
pub(crate) struct AppendTxn {
    pub(crate) compares: Vec<Compare>,
    pub(crate) puts: Vec<TxnOp>,
    first_key: String,
    first_seq: u64,
    tip_key: String,
    /// The tip's mod_revision when this append was made (0: there was none).
    tip_mod_revision: i64,
    owner_key: String,
    nonce: Uuid,
    epoch: Epoch,
    pub(crate) size: usize,
}

/// What a read of an append's first record and the tip (in one transaction) shows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// It committed, at this revision: its first record, or the tip, carries its nonce.
    Committed { revision: i64 },
    /// Another append's record stands where its first record would.
    Taken,
    /// Its first record is not there, yet its place may have been filled: the tip is at or
    /// past it (a trim removed the record), or the journal was deleted since this append read
    /// its tip (no tip, or one created after). And the tip is another append's: whose that
    /// record was can no longer be read.
    Gone,
    /// Its first record's place is empty, and always was: the tip, as this append read it, is
    /// still short of it.
    Empty,
}

impl Seen {
    /// Whether the read shows that the append never applied: another append's record stands
    /// in its first record's place, or that place always was empty. (That it never will is
    /// the compare's to say.)
    pub(crate) fn never_applied(self) -> bool {
        matches!(self, Seen::Taken | Seen::Empty)
    }
}

impl AppendTxn {
    /// Records `values` from `first_seq` on, and `tip_value`, all written with `nonce`, with
    /// `guard` as the owner compare (the ownership's guard; a test-only mutant may give another).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        namespace: &Namespace,
        ownership: &Ownership,
        guard: Compare,
        first_seq: u64,
        nonce: Uuid,
        values: Vec<Vec<u8>>,
        tip_value: Vec<u8>,
        expected_tip_mod_revision: i64,
    ) -> Self {
        let session = ownership.session_id();
        let tip_key = namespace.tip_key(session);
        let first_key = namespace.record_key(session, first_seq);
        let size = append_size(
            first_key.len(),
            tip_key.len(),
            ownership.owner_key().len(),
            values.iter().map(Vec::len),
            tip_value.len(),
        );
        let mut puts: Vec<TxnOp> = values
            .into_iter()
            .zip(first_seq..)
            .map(|(value, seq)| TxnOp::put(namespace.record_key(session, seq), value, None))
            .collect();
        puts.push(TxnOp::put(tip_key.as_str(), tip_value, None));
        let mut guard = Some(guard);
        let compares: Vec<Compare> = COMPARED
            .into_iter()
            .filter_map(|compared| match compared {
                Compared::Tip => Some(Compare::mod_revision(
                    tip_key.as_str(),
                    CompareOp::Equal,
                    expected_tip_mod_revision,
                )),
                Compared::Owner => guard.take(),
                Compared::FirstRecord => Some(Compare::create_revision(
                    first_key.as_str(),
                    CompareOp::Equal,
                    0,
                )),
            })
            .collect();
        Self {
            compares,
            puts,
            first_key,
            first_seq,
            tip_key,
            tip_mod_revision: expected_tip_mod_revision,
            owner_key: ownership.owner_key().to_owned(),
            nonce,
            epoch: ownership.epoch(),
            size,
        }
    }

    /// An append of `compares` compares and `puts` puts (on made-up keys) whose first record
    /// is `first_key`, at sequence number 1, made on a tip read at revision 5, for tests of
    /// what uses it.
    #[cfg(test)]
    pub(crate) fn for_test(
        first_key: String,
        nonce: Uuid,
        epoch: Epoch,
        compares: usize,
        puts: usize,
        size: usize,
    ) -> Self {
        Self {
            compares: (0..compares)
                .map(|i| Compare::version(format!("c{i}"), CompareOp::Equal, 0))
                .collect(),
            puts: (0..puts)
                .map(|i| TxnOp::put(format!("p{i}"), "", None))
                .collect(),
            first_key,
            first_seq: 1,
            tip_key: "ns/journals/s/tip".into(),
            // Its tip as read at revision 5 (the test tips were created at 3).
            tip_mod_revision: 5,
            owner_key: "ns/owners/s".into(),
            nonce,
            epoch,
            size,
        }
    }

    /// The `else` branch: the first record, then the tip.
    pub(crate) fn or_else(&self) -> [TxnOp; ELSE_GETS] {
        [
            TxnOp::get(self.first_key.as_str(), None),
            TxnOp::get(self.tip_key.as_str(), None),
        ]
    }

    /// The resolving read: the first record, the tip, then the owner key.
    pub(crate) fn resolve_ops(&self) -> [TxnOp; RESOLVE_GETS] {
        [
            TxnOp::get(self.first_key.as_str(), None),
            TxnOp::get(self.tip_key.as_str(), None),
            TxnOp::get(self.owner_key.as_str(), None),
        ]
    }

    /// The transaction, on its own.
    pub(super) fn txn(&self) -> Txn {
        Txn::new()
            .when(self.compares.clone())
            .and_then(self.puts.clone())
            .or_else(self.or_else())
    }

    /// The resolving read, on its own.
    fn resolve(&self) -> Txn {
        Txn::new().and_then(self.resolve_ops())
    }

    /// Sends it through the write path, re-sending while `ownership` is valid.
    pub(crate) async fn send(
        &self,
        connection: &Connection,
        policy: &WritePolicy,
        ownership: &Ownership,
        stop: &CancellationToken,
    ) -> Sent {
        let written = write::send(
            connection,
            policy,
            "append",
            &self.txn(),
            Some(&self.resolve()),
            || ownership.is_valid(),
            stop,
        )
        .await;
        self.settle(written)
    }

    /// What `first` (its first record) and `tip`, read in one transaction, show of it.
    pub(crate) fn seen(&self, first: Option<&KeyValue>, tip: Option<&KeyValue>) -> Seen {
        // The journal this append read its tip from may have been deleted since: its tip is
        // gone, or is a new one. An append that read no tip (a journal's first fence) cannot
        // tell a tip created by another writer from one created after its own committed and
        // the journal was deleted: for it, any tip is "new".
        let deleted = tip.is_none_or(|tip| tip.create_revision() > self.tip_mod_revision);
        let tip = tip.and_then(|kv| {
            let decoded = decode_tip(kv.key(), kv.value()).ok()?;
            Some((decoded, kv.mod_revision()))
        });
        match (first, tip) {
            (Some(first), _) if self.ours(first) => Seen::Committed {
                revision: first.mod_revision(),
            },
            (_, Some((tip, revision))) if tip.nonce == self.nonce => Seen::Committed { revision },
            _ if deleted => Seen::Gone,
            (Some(_), _) => Seen::Taken,
            (None, Some((tip, _))) if tip.seq >= self.first_seq => Seen::Gone,
            (None, _) => Seen::Empty,
        }
    }

    /// What its resolving read (see [`resolve_ops`](Self::resolve_ops)) shows of it, and
    /// whether its owner key moved on.
    pub(crate) fn resolved(&self, read: &TxnResponse) -> (Seen, bool) {
        let mut gets = gets(read);
        let (first, tip, owner) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        (
            self.seen(first.as_ref(), tip.as_ref()),
            self.unowned(owner.as_ref()),
        )
    }

    /// Whether `record` carries this append's nonce.
    fn ours(&self, record: &KeyValue) -> bool {
        decode_record(record.key(), None, record.value())
            .is_ok_and(|record| record.nonce() == self.nonce)
    }

    /// Whether `owner` (the owner key as read, `None` when absent) is no longer at this
    /// append's epoch, so that its owner compare can never hold again.
    pub(crate) fn unowned(&self, owner: Option<&KeyValue>) -> bool {
        owner.map(KeyValue::create_revision) != Some(self.epoch.revision())
    }

    /// The outcome a first record gone for good leaves: unknown, for good.
    pub(crate) fn gone(&self) -> EtcdError {
        EtcdError::unreadable(
            "append",
            format!(
                "record {} was trimmed, or the journal deleted, before the append's outcome was read",
                self.first_seq
            ),
        )
    }

    /// Reads what the write came to (see the module docs).
    pub(crate) fn settle(&self, written: Written) -> Sent {
        match written {
            Written::Replied(response) if response.succeeded() => Sent::Committed {
                revision: response.header().map_or(0, |h| h.revision()),
                by_read: false,
                for_space: false,
            },
            Written::Replied(response) => {
                let mut gets = gets(&response);
                let (first, tip) = (gets.next().flatten(), gets.next().flatten());
                match self.seen(first.as_ref(), tip.as_ref()) {
                    Seen::Committed { revision } => {
                        tracing::debug!(key = self.first_key, "an earlier send committed");
                        Sent::Committed {
                            revision,
                            by_read: false,
                            for_space: false,
                        }
                    }
                    // What is gone hides a commit only if an earlier send may have applied;
                    // otherwise this send's failed compare says it never did.
                    Seen::Gone if response.after_unknown() => Sent::Unknown(self.gone()),
                    Seen::Gone | Seen::Taken | Seen::Empty => Sent::Fenced { by_read: false },
                }
            }
            Written::Resolved { read, unknown } => {
                let mut gets = gets(&read);
                let (first, tip, owner) = (
                    gets.next().flatten(),
                    gets.next().flatten(),
                    gets.next().flatten(),
                );
                match self.seen(first.as_ref(), tip.as_ref()) {
                    Seen::Committed { revision } => Sent::Committed {
                        revision,
                        by_read: true,
                        for_space: false,
                    },
                    Seen::Taken => Sent::Fenced { by_read: true },
                    Seen::Empty if self.unowned(owner.as_ref()) => Sent::Fenced { by_read: true },
                    Seen::Gone | Seen::Empty => Sent::Unknown(unknown),
                }
            }
            // The refusal was final: what the read does not show never applied.
            Written::Refused {
                error,
                read: Some(read),
            } => match self.resolved(&read) {
                (Seen::Committed { revision }, _) => Sent::Committed {
                    revision,
                    by_read: true,
                    for_space: true,
                },
                (Seen::Taken, _) | (Seen::Empty, true) => Sent::Fenced { by_read: true },
                (Seen::Empty, false) => Sent::Failed(error),
                (Seen::Gone, _) => Sent::Unknown(self.gone()),
            },
            Written::Refused { error, read: None } => Sent::Unknown(error),
            Written::Unknown(error) => Sent::Unknown(error),
            Written::Failed(error) => Sent::Failed(error),
        }
    }
}

#[cfg(test)]
#[path = "cas_tests.rs"]
pub(super) mod tests;
