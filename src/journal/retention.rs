//! Retention: trimming a journal's oldest records, deleting a finished session's journal.
//!
//! `{ns}/journals/{s}/base` holds the first sequence number a journal keeps (absent: 1).
//!
//! A trim to `before` moves the base in batches of at most [`TRIM_BATCH`] records, each one
//! transaction:
//!
//! ```text
//! if   mod_revision(base)         == as read (so the base only grows)
//! and  create_revision(tip)       == as read (the journal was not deleted and made anew)
//! and  create_revision(owner key) == epoch   (the owner's trim; an admin's skips it)
//! then put(base = next), delete r/{base} .. r/{next} (exclusive)
//! ```
//!
//! It never touches the tip, so it never fences the writer, and `before` is at most the tip's
//! sequence number as read: the last record is always kept (and the tip only grows). The base
//! and the records below it change in one transaction, so at every revision the records under
//! `r/` are exactly those from the base to the tip.
//!
//! Deleting a journal is one transaction under the same compares, except that an admin's
//! requires the session to have no owner at all (`create_revision(owner key) == 0`): it deletes
//! the whole `journals/{s}/` prefix.
//!
//! Both go through the crate's one write path, and both are idempotent in effect: a trim
//! whose base already reached `before` is done, whoever moved it, so a send whose outcome is
//! unknown is settled by reading the base again, never by guessing.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, KvClient, Txn, TxnOp};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::cas::gets;
use super::record::{Tip, decode_base, decode_tip, encode_base};
use crate::connection::Connection;
use crate::error::{JournalLeaseLostError, RetentionError};
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};
use crate::write::{self, WritePolicy, Written};

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

/// The keys a trim or delete compares, as one linearizable read saw them.
struct Seen {
    base: u64,
    base_mod_revision: i64,
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
        let response = self
            .connection
            .read("retention read", |mut client: KvClient, _| {
                let txn = Txn::new().and_then(keys.clone().map(|key| TxnOp::get(key, None)));
                async move { client.txn(txn).await }
            })
            .await
            .map_err(RetentionError::Etcd)?;
        let mut gets = gets(&response);
        let (base, tip, owner) = (
            gets.next().flatten(),
            gets.next().flatten(),
            gets.next().flatten(),
        );
        Ok(Seen {
            base: match &base {
                Some(kv) => decode_base(kv.key(), kv.value()).map_err(RetentionError::Decode)?,
                None => 1,
            },
            base_mod_revision: base.as_ref().map_or(0, |kv| kv.mod_revision()),
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
        vec![
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
        ]
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
            Written::Unknown(error) | Written::Failed(error) => {
                self.authority.check_local()?;
                Err(RetentionError::Etcd(error))
            }
        }
    }

    /// Trims the records before `before`, in batches of at most `batch` records.
    pub(crate) async fn trim(&self, before: u64, batch: u64) -> Result<Trimmed, RetentionError> {
        let mut first_base = None;
        let mut contended = 0;
        while contended <= MAX_CONTENDED {
            self.authority.check_local()?;
            let seen = self.read().await?;
            let first = *first_base.get_or_insert(seen.base);
            let done = Trimmed {
                base: seen.base,
                removed: seen.base.saturating_sub(first),
            };
            if before <= seen.base {
                return Ok(done);
            }
            let tip = seen.tip.map_or(0, |tip| tip.seq);
            if before > tip {
                return Err(RetentionError::BeyondTip { before, tip });
            }
            let mut compares = self.unchanged(&seen);
            compares.extend(self.owner_compare(&seen, false)?);
            let next = before.min(seen.base.saturating_add(batch.max(1)));
            let txn = Txn::new().when(compares).and_then([
                TxnOp::put(
                    self.namespace.base_key(self.session),
                    encode_base(next),
                    None,
                ),
                TxnOp::delete(
                    self.namespace.record_key(self.session, seen.base),
                    Some(
                        DeleteOptions::new()
                            .with_range(self.namespace.record_key(self.session, next)),
                    ),
                ),
            ]);
            if !self.send("trim", &txn).await? {
                // Changed meanwhile, or an earlier send applied: the next read says.
                contended += 1;
            } else if next == before {
                return Ok(Trimmed {
                    base: next,
                    removed: next.saturating_sub(first),
                });
            }
        }
        Err(RetentionError::Contended {
            session: self.session,
        })
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
                Written::Unknown(error) | Written::Failed(error) => {
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
    use super::*;

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
