//! Retention: trimming a journal's oldest records, deleting a finished session's journal.
//!
//! `{ns}/journals/{s}/base` holds the first sequence number a journal keeps. A journal without
//! a base key starts at its first record (1 for a journal never trimmed): see "Under NOSPACE"
//! below for how a journal that was trimmed comes to have none.
//!
//! A trim to `before` moves the base in batches of at most [`TRIM_BATCH`] records, each one
//! transaction:
//!
//! ```text
//! if   mod_revision(base)         == as read (so the base only grows)
//! and  create_revision(tip)       == as read (the journal was not deleted and made anew)
//! and  create_revision(r/{base})  == as read (only without a base key: no trim meanwhile)
//! and  create_revision(owner key) == epoch   (the owner's trim; an admin's skips it)
//! then put(base = next), delete r/{base} .. r/{next} (exclusive)
//! ```
//!
//! It never touches the tip, so it never fences the writer, and `before` is at most the tip's
//! sequence number as read: the last record is always kept (and the tip only grows). The base
//! and the records below it change in one transaction, so at every revision the records under
//! `r/` are exactly those from the base to the tip.
//!
//! # Under NOSPACE
//!
//! While etcd's NOSPACE alarm is raised it refuses every transaction that puts a key (its
//! capped applier, `applierV3Capped::Txn`, refuses any transaction whose cost, the size of its
//! puts, is not 0), whatever its compares, and it accepts those that only delete. So a trim
//! etcd refuses for space ([`EtcdError::is_no_space`](crate::EtcdError::is_no_space)) is
//! sent again, and the rest of the trim made, with deletes only, under the same compares:
//!
//! ```text
//! then delete(base) (if there is one), delete r/{base} .. r/{next} (exclusive)
//! ```
//!
//! etcd may have applied the trim it refused: it applies the write that takes its backend past
//! the quota, then answers it NOSPACE all the same. The trim reads the base again before each
//! send, so it then finds the base moved, and a send made on what it read before would fail
//! its compares.
//!
//! The base key goes with the records: the journal then starts at its first record, `next`,
//! which is where the base would have been. At every revision the records are still exactly
//! those from the journal's base to its tip, so a replay or a check that reads the base at its
//! snapshot revision still tells a trim from a loss: a record missing below a base key is a
//! loss, as before; a journal without one has nothing below its first record to miss. The base
//! still only grows (`next` is above the base as read), and every trim still compares what it
//! read: deleting the base key changes its `mod_revision` (to 0), and without a base key the
//! first record's `create_revision` stands for it. The next trim etcd accepts writes the base
//! key again, also one that has nothing left to delete.
//!
//! What is given up while a journal has no base key is only this: a loss of its *first*
//! records would read as a trim (a journal never trimmed had no base key before either).
//!
//! Deleting a journal is one transaction under the same compares, except that an admin's
//! requires the session to have no owner at all (`create_revision(owner key) == 0`): it deletes
//! the whole `journals/{s}/` prefix. It only deletes, so etcd accepts it under NOSPACE.
//!
//! Both go through the crate's one write path, and both are idempotent in effect: a trim
//! whose base already reached `before` is done, whoever moved it, so a send whose outcome is
//! unknown is settled by reading the base again, never by guessing.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, KvClient, Txn, TxnOp};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::DecodeError;
use super::record::{Tip, decode_base, decode_tip, encode_base, seq_of_key};
use crate::etcd::write::{self, WritePolicy, Written};
use crate::etcd::{Connection, gets};
use crate::journal::{JournalLeaseLostError, RetentionError};
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};

/// The most records one trim transaction deletes: a trim of more moves the base in steps, so
/// no single transaction (and no single watch event burst) grows with the journal.
pub const TRIM_BATCH: u64 = 10_000;

/// How many times a trim or delete reads again after a concurrent change before giving up.
const MAX_CONTENDED: usize = 100;

/// What a trim came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trimmed {
    /// The journal's base now: the first sequence number it keeps.
    pub base: u64,
    /// How many records this call removed (0 if the base was already there).
    pub removed: u64,
}

/// What deleting a journal came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deleted {
    /// How many keys were deleted (records, tip and base); 0 if there was no journal.
    pub keys: u64,
}

/// On whose behalf a trim or delete is made.
#[derive(Clone, Copy)]
pub(crate) enum Authority<'a> {
    /// The owner, under its epoch: refused once the lease is invalid, or the owner key is not
    /// at this epoch.
    Owner(&'a Ownership),
    /// An operator: no lease. A trim skips the owner compare; a delete requires no owner.
    /// Re-sends go on until `until`.
    Admin { until: Instant },
}

impl Authority<'_> {
    /// An admin authority whose re-sends go on for `patience`.
    pub(crate) fn admin(patience: Duration) -> Authority<'static> {
        Authority::Admin {
            until: crate::deadline::deadline(Instant::now(), patience),
        }
    }

    pub(crate) fn go_on(&self) -> bool {
        match self {
            Authority::Owner(ownership) => ownership.is_valid(),
            Authority::Admin { until } => Instant::now() < *until,
        }
    }

    fn check_local(&self) -> Result<(), RetentionError> {
        match self {
            Authority::Owner(ownership) => ownership
                .check()
                .map_err(|source| RetentionError::LeaseLost(JournalLeaseLostError { source })),
            Authority::Admin { .. } => Ok(()),
        }
    }
}

/// Reads the first record key under a journal's `r/` prefix (its key only).
pub(crate) fn first_record(records_prefix: &str) -> TxnOp {
    let options = GetOptions::new()
        .with_range(crate::keys::prefix_end(records_prefix))
        .with_limit(1)
        .with_keys_only();
    TxnOp::get(records_prefix, Some(options))
}

/// A journal's base, from its base key and its first record (see the module docs): the base
/// key's value; without one, the first record's sequence number; 1 for a journal with neither.
pub(crate) fn base_of(
    base: Option<&KeyValue>,
    first: Option<&KeyValue>,
) -> Result<u64, DecodeError> {
    match (base, first) {
        (Some(kv), _) => decode_base(kv.key(), kv.value()),
        (None, Some(kv)) => match seq_of_key(kv.key()) {
            Some(seq) if seq > 0 => Ok(seq),
            _ => Err(DecodeError {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                reason: "not a record key (r/ and a 20-digit sequence number from 1)".into(),
            }),
        },
        (None, None) => Ok(1),
    }
}

/// The keys a trim or delete compares, as one linearizable read saw them.
struct Seen {
    /// The journal's base (see [`base_of`]).
    base: u64,
    /// Whether the base key exists.
    base_key: bool,
    base_mod_revision: i64,
    /// The first record's create revision (0: none); compared when there is no base key.
    first_create_revision: i64,
    tip: Option<Tip>,
    tip_create_revision: i64,
    /// The owner key's create revision (the holder's epoch); 0 if nobody owns the session.
    owner: i64,
}

/// A trim or delete of one session's journal, on behalf of `authority`.
pub(crate) struct Retention<'a> {
    pub(crate) connection: &'a Connection,
    pub(crate) namespace: &'a Namespace,
    pub(crate) policy: &'a WritePolicy,
    pub(crate) stop: &'a CancellationToken,
    pub(crate) session: Uuid,
    pub(crate) authority: Authority<'a>,
}

impl Retention<'_> {
    async fn read(&self) -> Result<Seen, RetentionError> {
        let keys = [
            self.namespace.base_key(self.session),
            self.namespace.tip_key(self.session),
            self.namespace.owner_key(self.session),
        ];
        let first = first_record(&self.namespace.records_prefix(self.session));
        let response = self
            .connection
            .read("retention read", |mut client: KvClient, _| {
                let mut ops = keys.clone().map(|key| TxnOp::get(key, None)).to_vec();
                ops.push(first.clone());
                let txn = Txn::new().and_then(ops);
                async move { client.txn(txn).await }
            })
            .await
            .map_err(RetentionError::Etcd)?;
        let mut gets = gets(&response);
        let (base, tip, owner, first) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        Ok(Seen {
            base: base_of(base.as_ref(), first.as_ref()).map_err(RetentionError::Decode)?,
            base_key: base.is_some(),
            base_mod_revision: base.as_ref().map_or(0, |kv| kv.mod_revision()),
            first_create_revision: first.as_ref().map_or(0, |kv| kv.create_revision()),
            tip: match &tip {
                Some(kv) => Some(decode_tip(kv.key(), kv.value()).map_err(RetentionError::Decode)?),
                None => None,
            },
            tip_create_revision: tip.as_ref().map_or(0, |kv| kv.create_revision()),
            owner: owner.map_or(0, |kv| kv.create_revision()),
        })
    }

    /// The owner compare of this authority, after checking that `seen` passes it.
    fn owner_compare(&self, seen: &Seen, delete: bool) -> Result<Option<Compare>, RetentionError> {
        let key = self.namespace.owner_key(self.session);
        match self.authority {
            Authority::Owner(ownership) => {
                let epoch = ownership.epoch();
                if seen.owner != epoch.revision() {
                    return Err(RetentionError::NotOwner {
                        session: self.session,
                        epoch,
                        owner: (seen.owner > 0).then(|| Epoch::from_revision(seen.owner)),
                    });
                }
                Ok(Some(ownership.guard()))
            }
            Authority::Admin { .. } if delete => {
                if seen.owner > 0 {
                    return Err(RetentionError::Owned {
                        session: self.session,
                        owner: Epoch::from_revision(seen.owner),
                    });
                }
                Ok(Some(Compare::create_revision(key, CompareOp::Equal, 0)))
            }
            Authority::Admin { .. } => Ok(None),
        }
    }

    fn unchanged(&self, seen: &Seen) -> Vec<Compare> {
        let mut compares = vec![
            Compare::mod_revision(
                self.namespace.base_key(self.session),
                CompareOp::Equal,
                seen.base_mod_revision,
            ),
            Compare::create_revision(
                self.namespace.tip_key(self.session),
                CompareOp::Equal,
                seen.tip_create_revision,
            ),
        ];
        if !seen.base_key {
            // No base key to move: the first record stands for it.
            compares.push(Compare::create_revision(
                self.namespace.record_key(self.session, seen.base),
                CompareOp::Equal,
                seen.first_create_revision,
            ));
        }
        compares
    }

    /// The trim of `seen`'s records below `next`: with the base key put, or, once etcd refused
    /// that for space, with deletes only (see the module docs).
    fn trim_ops(&self, seen: &Seen, next: u64, deletes_only: bool) -> Vec<TxnOp> {
        let base_key = self.namespace.base_key(self.session);
        let mut ops = match (deletes_only, seen.base_key) {
            (false, _) => vec![TxnOp::put(base_key, encode_base(next), None)],
            (true, true) => vec![TxnOp::delete(base_key, None)],
            (true, false) => vec![],
        };
        if next > seen.base {
            ops.push(TxnOp::delete(
                self.namespace.record_key(self.session, seen.base),
                Some(
                    DeleteOptions::new().with_range(self.namespace.record_key(self.session, next)),
                ),
            ));
        }
        ops
    }

    async fn send(&self, operation: &'static str, txn: &Txn) -> Result<bool, RetentionError> {
        let written = write::send(
            self.connection,
            self.policy,
            operation,
            txn,
            None,
            || self.authority.go_on(),
            self.stop,
        )
        .await;
        match written {
            Written::Replied(response) => Ok(response.succeeded()),
            // Unknown or not applied: read again, the base says where things stand.
            Written::Resolved { .. } => Ok(false),
            // Refused for space (maybe applied: the caller reads the base again before its
            // next send, whose compares fail if this one applied).
            Written::Unknown(error) | Written::Failed(error) | Written::Refused { error, .. } => {
                self.authority.check_local()?;
                Err(RetentionError::Etcd(error))
            }
        }
    }

    /// Trims the records before `before`, in batches of at most `batch` records.
    pub(crate) async fn trim(&self, before: u64, batch: u64) -> Result<Trimmed, RetentionError> {
        let mut first_base = None;
        let mut contended = 0;
        // Set once etcd refused a put for space: the rest of the trim only deletes.
        let mut deletes_only = false;
        while contended <= MAX_CONTENDED {
            self.authority.check_local()?;
            let seen = self.read().await?;
            let first = *first_base.get_or_insert(seen.base);
            let done = Trimmed {
                base: seen.base,
                removed: seen.base.saturating_sub(first),
            };
            if before <= seen.base {
                if !seen.base_key && seen.base > 1 && !deletes_only {
                    self.record_base(&seen).await?;
                }
                return Ok(done);
            }
            let tip = seen.tip.map_or(0, |tip| tip.seq);
            if before > tip {
                return Err(RetentionError::BeyondTip { before, tip });
            }
            let mut compares = self.unchanged(&seen);
            compares.extend(self.owner_compare(&seen, false)?);
            let next = before.min(seen.base.saturating_add(batch.max(1)));
            let txn = Txn::new()
                .when(compares)
                .and_then(self.trim_ops(&seen, next, deletes_only));
            match self.send("trim", &txn).await {
                Ok(true) if next == before => {
                    return Ok(Trimmed {
                        base: next,
                        removed: next.saturating_sub(first),
                    });
                }
                Ok(true) => {}
                // Changed meanwhile, or an earlier send applied: the next read says.
                Ok(false) => contended += 1,
                // Refused, not applied: the same trim with deletes only, which etcd accepts.
                Err(RetentionError::Etcd(error)) if error.is_no_space() && !deletes_only => {
                    tracing::warn!(
                        session = %self.session,
                        "etcd refuses puts (NOSPACE): trimming with deletes only; the journal \
                         starts at its first record until a later trim writes its base key again"
                    );
                    deletes_only = true;
                }
                Err(error) => return Err(error),
            }
        }
        Err(RetentionError::Contended {
            session: self.session,
        })
    }

    /// Writes the base key of a journal that has none (trimmed under NOSPACE) at its first
    /// record, under the compares of a trim. Best effort: a change meanwhile is another trim's
    /// doing, and etcd may still refuse puts for space.
    async fn record_base(&self, seen: &Seen) -> Result<(), RetentionError> {
        let mut compares = self.unchanged(seen);
        compares.extend(self.owner_compare(seen, false)?);
        let txn = Txn::new()
            .when(compares)
            .and_then(self.trim_ops(seen, seen.base, false));
        match self.send("trim", &txn).await {
            Ok(_) => Ok(()),
            Err(RetentionError::Etcd(error)) if error.is_no_space() => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Deletes the whole journal.
    pub(crate) async fn delete(&self) -> Result<Deleted, RetentionError> {
        for _ in 0..=MAX_CONTENDED {
            self.authority.check_local()?;
            let seen = self.read().await?;
            let mut compares = self.unchanged(&seen);
            compares.extend(self.owner_compare(&seen, true)?);
            let txn = Txn::new().when(compares).and_then([TxnOp::delete(
                self.namespace.journal_prefix(self.session),
                Some(DeleteOptions::new().with_prefix()),
            )]);
            let written = write::send(
                self.connection,
                self.policy,
                "delete journal",
                &txn,
                None,
                || self.authority.go_on(),
                self.stop,
            )
            .await;
            match written {
                Written::Replied(response) if response.succeeded() => {
                    let keys = response
                        .op_responses()
                        .into_iter()
                        .map(|op| match op {
                            etcd_client::TxnOpResponse::Delete(delete) => {
                                delete.deleted().max(0) as u64
                            }
                            _ => 0,
                        })
                        .sum();
                    return Ok(Deleted { keys });
                }
                // Changed meanwhile, or an earlier send applied: the next read says.
                Written::Replied(_) | Written::Resolved { .. } => {}
                Written::Unknown(error)
                | Written::Failed(error)
                | Written::Refused { error, .. } => {
                    self.authority.check_local()?;
                    return Err(RetentionError::Etcd(error));
                }
            }
        }
        Err(RetentionError::Contended {
            session: self.session,
        })
    }
}

#[cfg(test)]
mod tests {
    use etcd_client::proto::PbKeyValue;

    use super::*;

    fn kv(key: &str, value: Vec<u8>) -> PbKeyValue {
        PbKeyValue {
            key: key.as_bytes().to_vec(),
            value,
            create_revision: 4,
            mod_revision: 4,
            version: 1,
            lease: 0,
        }
    }

    fn base(base: Option<&PbKeyValue>, first: Option<&PbKeyValue>) -> Result<u64, DecodeError> {
        base_of(base.map(<&KeyValue>::from), first.map(<&KeyValue>::from))
    }

    #[test]
    fn the_base_is_the_base_key_else_the_first_record_else_1() {
        let key = kv("ns/journals/s/base", encode_base(40));
        let first = kv("ns/journals/s/r/00000000000000000057", Vec::new());
        // A base key says where the journal starts: a record missing above it is a loss.
        assert_eq!(base(Some(&key), Some(&first)).unwrap(), 40);
        assert_eq!(base(Some(&key), None).unwrap(), 40);
        // Without one (never trimmed, or trimmed under NOSPACE): its first record.
        assert_eq!(base(None, Some(&first)).unwrap(), 57);
        assert_eq!(base(None, None).unwrap(), 1);
        // Garbage is a typed error naming the key, never a guess.
        for stray in ["ns/journals/s/r/x", "ns/journals/s/r/00000000000000000000"] {
            let error = base(None, Some(&kv(stray, Vec::new()))).unwrap_err();
            assert_eq!(error.key, stray);
        }
        let bad = kv("ns/journals/s/base", vec![9]);
        assert_eq!(
            base(Some(&bad), Some(&first)).unwrap_err().key,
            "ns/journals/s/base"
        );
    }

    proptest::proptest! {
        /// An admin's patience of any length makes a deadline; a long one goes on re-sending.
        #[test]
        fn any_admin_patience_makes_a_deadline(
            secs in proptest::prelude::any::<u64>(),
            nanos in 0u32..1_000_000_000,
        ) {
            let patience = Duration::new(secs, nanos);
            let admin = Authority::admin(patience);
            if patience >= Duration::from_secs(3600) {
                proptest::prop_assert!(admin.go_on());
            }
        }
    }

    #[test]
    fn an_admin_without_patience_stops_and_one_waiting_forever_goes_on() {
        assert!(!Authority::admin(Duration::ZERO).go_on());
        assert!(Authority::admin(Duration::MAX).go_on());
    }
}
