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

/// [`estimate_size`] of an append transaction: its three compares, its records and tip, and
/// the two gets of its `else` branch. Keys are the lengths of a record key, the tip key and
/// the owner key; `values` the encoded records' lengths.
pub(crate) fn append_size(
    record_key: usize,
    tip_key: usize,
    owner_key: usize,
    values: impl IntoIterator<Item = usize>,
    tip_value: usize,
) -> usize {
    estimate_size(
        [tip_key, owner_key, record_key],
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
    /// Records `values` from `first_seq` on, and `tip_value`, all written with `nonce`.
    pub(crate) fn build(
        namespace: &Namespace,
        ownership: &Ownership,
        first_seq: u64,
        nonce: Uuid,
        values: Vec<Vec<u8>>,
        tip_value: Vec<u8>,
        expected_tip_mod_revision: i64,
    ) -> Self {
        Self::build_guarded(
            namespace,
            ownership,
            Some(ownership.guard()),
            first_seq,
            nonce,
            values,
            tip_value,
            expected_tip_mod_revision,
        )
    }

    /// [`build`](Self::build) with `guard` as the owner compare (a test-only mutant may
    /// change or drop it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build_guarded(
        namespace: &Namespace,
        ownership: &Ownership,
        guard: Option<Compare>,
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
        let compares: Vec<Compare> = [
            Some(Compare::mod_revision(
                tip_key.as_str(),
                CompareOp::Equal,
                expected_tip_mod_revision,
            )),
            guard,
            Some(Compare::create_revision(
                first_key.as_str(),
                CompareOp::Equal,
                0,
            )),
        ]
        .into_iter()
        .flatten()
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
pub(super) mod tests {
    use std::time::Duration;

    use etcd_client::proto::{
        PbKeyValue, PbRangeResponse, PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnResponse,
    };

    use super::*;
    use crate::etcd::write::Reply;
    use crate::journal::record::{Tip, encode_event, encode_tip};

    const EPOCH: Epoch = Epoch(40);

    fn append(nonce: Uuid) -> AppendTxn {
        AppendTxn {
            compares: Vec::new(),
            puts: Vec::new(),
            first_key: "ns/journals/s/r/00000000000000000007".into(),
            first_seq: 7,
            tip_key: "ns/journals/s/tip".into(),
            tip_mod_revision: 5,
            owner_key: "ns/owners/s".into(),
            nonce,
            epoch: EPOCH,
            size: 0,
        }
    }

    /// The tip at `seq`, written with `nonce` at revision 55.
    pub(in crate::journal) fn tip(seq: u64, nonce: Uuid) -> PbKeyValue {
        PbKeyValue {
            key: b"ns/journals/s/tip".to_vec(),
            value: encode_tip(&Tip {
                seq,
                epoch: EPOCH,
                nonce,
            }),
            create_revision: 3,
            mod_revision: 55,
            version: 9,
            lease: 0,
        }
    }

    /// A record at seq 7 written with `nonce`, committed at revision 50.
    fn record(nonce: Uuid) -> PbKeyValue {
        PbKeyValue {
            key: b"ns/journals/s/r/00000000000000000007".to_vec(),
            value: encode_event(7, EPOCH, nonce, b"event"),
            create_revision: 50,
            mod_revision: 50,
            version: 1,
            lease: 0,
        }
    }

    pub(in crate::journal) fn owner(create_revision: i64) -> PbKeyValue {
        PbKeyValue {
            key: b"ns/owners/s".to_vec(),
            create_revision,
            ..PbKeyValue::default()
        }
    }

    /// A reply: `succeeded`, at revision 60, with one get per entry of `gets`.
    pub(in crate::journal) fn reply(succeeded: bool, gets: Vec<Option<PbKeyValue>>) -> TxnResponse {
        TxnResponse(PbTxnResponse {
            header: Some(PbResponseHeader {
                revision: 60,
                ..PbResponseHeader::default()
            }),
            succeeded,
            responses: gets
                .into_iter()
                .map(|kv| PbResponseOp {
                    response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse {
                        kvs: kv.into_iter().collect(),
                        ..PbRangeResponse::default()
                    })),
                })
                .collect(),
        })
    }

    pub(in crate::journal) fn unknown() -> EtcdError {
        EtcdError::timed_out("append", "http://e", Duration::from_secs(1))
    }

    fn settled(written: Written) -> String {
        let ours = Uuid::from_u128(1);
        format!("{:?}", append(ours).settle(written))
    }

    #[test]
    fn an_outcome_told_by_read_keeps_its_own_read_too() {
        for (own, later, expect) in [
            (false, false, false),
            (true, false, true),
            (false, true, true),
        ] {
            let committed = Sent::Committed {
                revision: 60,
                by_read: own,
                for_space: own,
            };
            assert_eq!(committed.for_space(), own, "kept");
            let committed = committed.told_by_read(later);
            assert_eq!(committed.by_read(), expect);
            assert_eq!(committed.for_space(), own);
            let fenced = Sent::Fenced { by_read: own };
            assert_eq!(fenced.told_by_read(later).by_read(), expect);
        }
    }

    #[test]
    fn a_reply_settles_by_its_compare_and_else_branch() {
        let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
        // A reply after a send whose outcome was unknown: the `else` branch tells.
        let failed = |first, tip| {
            let reply = Reply::after_unknown_send(reply(false, vec![first, tip]));
            settled(Written::Replied(reply))
        };
        assert_eq!(
            settled(Written::Replied(reply(true, vec![]).into())),
            "Committed { revision: 60, by_read: false, for_space: false }"
        );
        // The compare failed: an earlier send of ours committed the first record...
        assert_eq!(
            failed(Some(record(ours)), Some(tip(9, theirs))),
            "Committed { revision: 50, by_read: false, for_space: false }"
        );
        // ...or, its first record trimmed since, the tip is still ours.
        assert_eq!(
            failed(None, Some(tip(9, ours))),
            "Committed { revision: 55, by_read: false, for_space: false }"
        );
        // Someone else's record is there, or none is and the tip is short of it: fenced.
        assert_eq!(
            failed(Some(record(theirs)), Some(tip(9, theirs))),
            "Fenced { by_read: false }"
        );
        assert_eq!(
            failed(None, Some(tip(6, theirs))),
            "Fenced { by_read: false }"
        );
        // None is, but the tip is past it: a trim removed whoever's record it was. Unknown.
        let trimmed = failed(None, Some(tip(7, theirs)));
        assert!(trimmed.starts_with("Unknown("), "{trimmed}");
        assert!(trimmed.contains("record 7 was trimmed"), "{trimmed}");
        // The journal was deleted since the append read its tip (at revision 5): no tip, or
        // a new one (and whatever record is there now). Unknown too.
        let renewed = |seq| {
            let mut tip = tip(seq, theirs);
            tip.create_revision = 6;
            Some(tip)
        };
        assert!(failed(None, None).starts_with("Unknown("));
        assert!(failed(None, renewed(1)).starts_with("Unknown("));
        assert!(failed(Some(record(theirs)), renewed(7)).starts_with("Unknown("));
        // A tip created at the very revision the append read it at is the tip it read.
        let same = {
            let mut tip = tip(6, theirs);
            tip.create_revision = 5;
            Some(tip)
        };
        assert_eq!(failed(None, same), "Fenced { by_read: false }");
        // An append to a journal with no tip yet (its first fence), after an unknown send:
        // no tip now, or another's, may be its own committed and the journal deleted (and
        // created again) since. Unknown too; after a first send that failed, fenced.
        let first = AppendTxn {
            tip_mod_revision: 0,
            first_seq: 1,
            ..append(ours)
        };
        let first = |read| format!("{:?}", first.settle(Written::Replied(read)));
        let after_unknown = |read| first(Reply::after_unknown_send(read));
        assert!(after_unknown(reply(false, vec![None, None])).starts_with("Unknown("));
        let theirs_first = Some(record(theirs));
        assert!(
            after_unknown(reply(
                false,
                vec![theirs_first.clone(), Some(tip(1, theirs))]
            ))
            .starts_with("Unknown(")
        );
        assert_eq!(
            first(reply(false, vec![None, None]).into()),
            "Fenced { by_read: false }"
        );
        assert_eq!(
            first(reply(false, vec![theirs_first, Some(tip(1, theirs))]).into()),
            "Fenced { by_read: false }"
        );
        // A reply to the first send (or after sends that certainly did not apply): it never
        // applied, whatever is gone.
        let first_send =
            |first, tip| settled(Written::Replied(reply(false, vec![first, tip]).into()));
        assert_eq!(first_send(None, None), "Fenced { by_read: false }");
        assert_eq!(
            first_send(None, Some(tip(7, theirs))),
            "Fenced { by_read: false }"
        );
    }

    #[test]
    fn a_resolving_read_settles_by_the_first_record_the_tip_then_the_owner_key() {
        let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let resolved = |first, tip, owner| {
            settled(Written::Resolved {
                read: reply(true, vec![first, tip, owner]),
                unknown: unknown(),
            })
        };
        let epoch = EPOCH.revision();
        // Our record is there, or our tip: committed, whoever owns the session now.
        assert_eq!(
            resolved(Some(record(ours)), None, None),
            "Committed { revision: 50, by_read: true, for_space: false }"
        );
        assert_eq!(
            resolved(None, Some(tip(9, ours)), None),
            "Committed { revision: 55, by_read: true, for_space: false }"
        );
        // Another writer's record took its place: it can never commit.
        assert_eq!(
            resolved(
                Some(record(theirs)),
                Some(tip(7, theirs)),
                Some(owner(epoch))
            ),
            "Fenced { by_read: true }"
        );
        // No record ever, and the owner key is gone or newer: it can never commit either.
        assert_eq!(
            resolved(None, Some(tip(6, theirs)), None),
            "Fenced { by_read: true }"
        );
        assert_eq!(
            resolved(None, Some(tip(6, theirs)), Some(owner(epoch + 1))),
            "Fenced { by_read: true }"
        );
        // No record yet while the owner key is still ours: it may still commit.
        assert!(resolved(None, Some(tip(6, theirs)), Some(owner(epoch))).starts_with("Unknown("));
        // The journal is gone: whether the append committed before it went is, too.
        assert!(resolved(None, None, None).starts_with("Unknown("));
        // A record was there and is trimmed, the tip another's: whose it was is gone.
        assert!(resolved(None, Some(tip(8, theirs)), None).starts_with("Unknown("));
    }

    #[test]
    fn only_an_outcome_the_resolving_read_settles_counts_as_resolved() {
        let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let how = |written| append(ours).settle(written).by_read();
        let read = |first: Option<PbKeyValue>, owner: Option<PbKeyValue>| Written::Resolved {
            read: reply(true, vec![first, Some(tip(6, theirs)), owner]),
            unknown: unknown(),
        };
        // Settled by the read: committed, or fenced.
        assert!(how(read(Some(record(ours)), None)));
        assert!(how(read(Some(record(theirs)), None)));
        assert!(how(read(None, None)));
        // The read could not settle it.
        assert!(!how(read(None, Some(owner(EPOCH.revision())))));
        // A reply settled it, or nothing did.
        assert!(!how(Written::Replied(reply(true, vec![]).into())));
        let earlier = Reply::after_unknown_send(reply(false, vec![Some(record(ours)), None]));
        assert!(!how(Written::Replied(earlier)));
        assert!(!how(Written::Unknown(unknown())));
        assert!(!how(Written::Failed(unknown())));
    }

    /// etcd applies the transaction that takes it past its quota and answers it NOSPACE; the
    /// read made after that final answer says what it came to.
    #[test]
    fn a_send_refused_for_space_is_settled_by_the_read_after_it() {
        let (ours, theirs) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let space = || EtcdError::no_space("append");
        let refused = |first, tip, owner| {
            settled(Written::Refused {
                error: space(),
                read: Some(reply(true, vec![first, tip, owner])),
            })
        };
        let epoch = EPOCH.revision();
        // It applied: committed, and etcd refuses puts now.
        assert_eq!(
            refused(Some(record(ours)), Some(tip(7, ours)), Some(owner(epoch))),
            "Committed { revision: 50, by_read: true, for_space: true }"
        );
        assert_eq!(
            refused(None, Some(tip(9, ours)), Some(owner(epoch))),
            "Committed { revision: 55, by_read: true, for_space: true }"
        );
        // It did not, and never will: the refusal was final. The journal stays open.
        let failed = refused(None, Some(tip(6, theirs)), Some(owner(epoch)));
        assert!(
            failed.starts_with("Failed(") && failed.contains("space"),
            "{failed}"
        );
        // Another's record in its place, or its owner key moved on: fenced.
        assert_eq!(
            refused(
                Some(record(theirs)),
                Some(tip(7, theirs)),
                Some(owner(epoch))
            ),
            "Fenced { by_read: true }"
        );
        assert_eq!(
            refused(None, Some(tip(6, theirs)), Some(owner(epoch + 1))),
            "Fenced { by_read: true }"
        );
        // Its place may have been trimmed: whose record it was is gone.
        assert!(refused(None, Some(tip(8, theirs)), Some(owner(epoch))).starts_with("Unknown("));
        // No read: unknown, never failed.
        let unread = settled(Written::Refused {
            error: space(),
            read: None,
        });
        assert!(unread.starts_with("Unknown("), "{unread}");
    }

    #[test]
    fn no_answer_stays_unknown_and_a_refusal_stays_failed() {
        assert!(settled(Written::Unknown(unknown())).starts_with("Unknown("));
        assert!(settled(Written::Failed(unknown())).starts_with("Failed("));
    }

    #[test]
    fn the_size_estimate_counts_every_key_and_value_once_plus_fixed_overheads() {
        // 64 for the transaction, 24 per compare, 32 per put, 24 per get.
        assert_eq!(estimate_size([], [], []), 64);
        assert_eq!(estimate_size([10], [], []), 64 + 10 + 24);
        assert_eq!(estimate_size([], [(10, 100)], []), 64 + 10 + 100 + 32);
        assert_eq!(estimate_size([], [], [10]), 64 + 10 + 24);
        assert_eq!(
            estimate_size([1, 2, 3], [(4, 5), (6, 7)], [8]),
            64 + (1 + 24) + (2 + 24) + (3 + 24) + (4 + 5 + 32) + (6 + 7 + 32) + (8 + 24)
        );
    }
}
