//! Group commit across sessions: the appends of a store's journals share transactions.
//!
//! A journal has one transaction in flight at a time (its own group commit). With many busy
//! journals, a store would still send one etcd request per journal per round trip, and etcd's
//! work per request (the gRPC call, the raft entry, the apply) would bound it. So the store's
//! one append queue (see [`queue`](super::queue)) puts the appends of the journals that are
//! ready together into one transaction, each with its own compares:
//!
//! ```text
//! if   every member's compares (its tip, its owner key, its first record)
//! then every member's puts (its records, its tip)
//! else get(every member's first record and tip)
//! ```
//!
//! A lone append is sent as its own transaction.
//!
//! The shared transaction applies all or nothing, so every member's outcome follows from it:
//!
//! - applied: every member committed, at the reply's revision;
//! - a compare failed: the `else` branch showing any member's first record or tip with that
//!   member's nonce means an earlier send committed, for every member. Otherwise the failed
//!   compare is a member's whose compares can never all hold again (see `cas`), so the shared
//!   transaction can never apply again. Whether an earlier send applied it:
//!   - not if every send before this one certainly failed, nor if some member's place shows
//!     that it never did (another append's record there, or none ever): each member is then
//!     sent on its own, through the one write path, and learns its own outcome there
//!     (committed, fenced, unknown). From one member's view, that is a send that did not
//!     apply followed by a send of its own part;
//!   - otherwise every member's first record is gone (trimmed, or its journal deleted), and
//!     with it the proof either way: every member's outcome is unknown, for good. Never
//!     fenced: the shared transaction may have committed before a successor trimmed it;
//! - unknown: the shared transaction is re-sent byte-identical while any member's lease is
//!   valid (a member whose owner key is gone makes the next send's compare fail, above). When
//!   none is, one read of every member's first record, tip and owner key settles it the same
//!   way: committed; never applied and never will (a member's place taken by another's
//!   record, or empty with its owner key moved on: each member on its own); or still unknown,
//!   for every member (a first record gone proves nothing). A reply too large for the client
//!   to decode (4 MiB: members' places holding large records of others, after their journals
//!   were deleted and made anew) is read again member by member, and the members' reads
//!   settle it as the one read would have;
//! - certainly not applied (refused), or refused for space (final, though etcd answers so the
//!   transaction that crossed its quota after applying it): each member on its own. Had it
//!   applied, each member's own compare fails on the tip it moved, and its `else` branch shows
//!   its nonce: committed.

use etcd_client::{Txn, TxnOp};

use super::cas::{AppendTxn, ELSE_GETS, RESOLVE_GETS, Seen, Sent};
use super::queue::{Batcher, Member};
use crate::etcd::write::{self, Written};
use crate::etcd::{EtcdError, gets};

impl Batcher {
    /// Sends the appends of `members` as one transaction (one member alone as its own) and
    /// says what each came to, in order.
    pub(super) async fn commit(&self, members: &[Member]) -> Vec<Sent> {
        if let [member] = members {
            return vec![self.alone(member).await];
        }
        self.count_txn(members.iter());
        let txn = Txn::new()
            .when(
                members
                    .iter()
                    .flat_map(|m| m.append.compares.iter().cloned())
                    .collect::<Vec<_>>(),
            )
            .and_then(
                members
                    .iter()
                    .flat_map(|m| m.append.puts.iter().cloned())
                    .collect::<Vec<_>>(),
            )
            .or_else(
                members
                    .iter()
                    .flat_map(|m| m.append.or_else())
                    .collect::<Vec<_>>(),
            );
        // No resolving read for the write path: an outcome still unknown comes back as such,
        // and is read here (see `resolve`).
        let written = write::send(
            &self.connection,
            &self.policy,
            "append",
            &txn,
            None,
            || members.iter().any(|m| m.ownership().is_valid()),
            &self.stop,
        )
        .await;
        let appends: Vec<&AppendTxn> = members.iter().map(|m| &m.append).collect();
        let (shared, by_read) = match written {
            Written::Unknown(unknown) => (self.resolve(&appends, unknown).await, true),
            written => (settle(&appends, written), false),
        };
        match shared {
            Shared::Committed { revision } => members
                .iter()
                .map(|_| Sent::Committed {
                    revision,
                    by_read,
                    for_space: false,
                })
                .collect(),
            Shared::Unknown(error) => members
                .iter()
                .map(|_| Sent::Unknown(error.clone()))
                .collect(),
            Shared::Gone => appends
                .iter()
                .map(|append| Sent::Unknown(append.gone()))
                .collect(),
            Shared::Never => {
                tracing::debug!(
                    members = members.len(),
                    "a shared append transaction can never apply; sending each on its own"
                );
                let alone = members
                    .iter()
                    .map(|member| async move { self.alone(member).await.told_by_read(by_read) });
                futures_util::future::join_all(alone).await
            }
        }
    }

    /// Sends `member`'s append as its own transaction, through the one write path.
    /// Counts a transaction of `members` in the metrics, by its appends: fences (journals
    /// being opened) are not appends.
    fn count_txn<'a>(&self, members: impl Iterator<Item = &'a Member>) {
        let appends = members.filter(|member| !member.is_fence()).count();
        if appends > 0 {
            self.metrics.append_txn(appends);
        }
    }

    pub(super) async fn alone(&self, member: &Member) -> Sent {
        self.count_txn([member].into_iter());
        let ownership = member.ownership();
        (member.append)
            .send(&self.connection, &self.policy, ownership, &self.stop)
            .await
    }

    /// Reads what the shared transaction of `members` came to, its sends having stayed
    /// unknown (`unknown` is the first failure that may have applied): one read of every
    /// member's first record, tip and owner key. A reply too large for the client to decode
    /// (members' places holding large records of others) is read again member by member:
    /// each read is one member's, and settles the whole transaction as the shared read would
    /// (it applied all or nothing, and can no longer apply once any member shows it never
    /// will); a member whose read fails adds nothing.
    async fn resolve(&self, members: &[&AppendTxn], unknown: EtcdError) -> Shared {
        let read = Txn::new().and_then(
            members
                .iter()
                .flat_map(|m| m.resolve_ops())
                .collect::<Vec<TxnOp>>(),
        );
        let error = match write::read_once(&self.connection, &self.policy, &read, &self.stop).await
        {
            Ok(read) => return settle(members, Written::Resolved { read, unknown }),
            Err(error) => error,
        };
        if !error.is_reply_too_large() {
            return Shared::Unknown(unknown);
        }
        tracing::debug!(
            members = members.len(),
            "the shared resolving read's reply is too large; reading member by member"
        );
        let reads = members.iter().map(|member| async move {
            let read = Txn::new().and_then(member.resolve_ops());
            let read = write::read_once(&self.connection, &self.policy, &read, &self.stop).await;
            read.ok().map(|read| member.resolved(&read))
        });
        let seen: Vec<(Seen, bool)> = futures_util::future::join_all(reads)
            .await
            .into_iter()
            .flatten()
            .collect();
        from_reads(&seen, unknown)
    }
}

/// What a shared transaction came to (see the module docs).
#[derive(Debug)]
enum Shared {
    /// Every member committed, at this revision.
    Committed { revision: i64 },
    /// It never applied and never will: each member is to be sent on its own.
    Never,
    /// It can never apply again, and whether an earlier send did can no longer be read: every
    /// member's first record is gone (trimmed, or its journal deleted). Unknown, for good, for
    /// every member.
    Gone,
    /// It may have applied, or may still.
    Unknown(EtcdError),
}

/// Reads what the shared transaction of `members` (in order) came to.
fn settle(members: &[&AppendTxn], written: Written) -> Shared {
    match written {
        Written::Replied(response) if response.succeeded() => Shared::Committed {
            revision: response.header().map_or(0, |h| h.revision()),
        },
        // The `else` branch: each member's first record and tip, in order.
        Written::Replied(response) => {
            let read: Vec<_> = gets(&response).collect();
            let seen: Vec<Seen> = members
                .iter()
                .zip(read.chunks(ELSE_GETS))
                .map(|(member, read)| {
                    member.seen(read[0].as_ref(), read.get(1).and_then(Option::as_ref))
                })
                .collect();
            if let Some(committed) = committed(seen.iter().copied()) {
                return committed;
            }
            // The failed compare says it can never apply again. Whether an earlier send did:
            // not if every send before this one certainly failed, nor if some member's place
            // shows it never did (another's record there, or none ever). Otherwise every
            // member's first record is gone, and with it what it would have said.
            if !response.after_unknown() || seen.iter().any(|seen| seen.never_applied()) {
                Shared::Never
            } else {
                Shared::Gone
            }
        }
        // Each member's first record, tip and owner key, in order.
        Written::Resolved { read, unknown } => {
            let read: Vec<_> = gets(&read).collect();
            if read.len() != RESOLVE_GETS * members.len() {
                return Shared::Unknown(unknown);
            }
            let seen: Vec<_> = members
                .iter()
                .zip(read.chunks(RESOLVE_GETS))
                .map(|(member, read)| {
                    (
                        member.seen(read[0].as_ref(), read[1].as_ref()),
                        member.unowned(read[2].as_ref()),
                    )
                })
                .collect();
            from_reads(&seen, unknown)
        }
        Written::Unknown(error) => Shared::Unknown(error),
        // Certainly not applied; or refused for space, which is final but may have applied it
        // (etcd applies the transaction that crosses its quota, then answers NOSPACE): each
        // member on its own all the same. If the shared transaction applied, a member's own
        // compare fails on the tip it moved and its `else` branch shows its nonce: committed.
        Written::Failed(_) | Written::Refused { .. } => Shared::Never,
    }
}

/// What reads of members' first records, tips and owner keys (each with whether its owner
/// key moved on), made once the sends stayed unknown, show of the shared transaction.
fn from_reads(seen: &[(Seen, bool)], unknown: EtcdError) -> Shared {
    if let Some(committed) = committed(seen.iter().map(|(seen, _)| *seen)) {
        return committed;
    }
    // A member whose place shows that the shared transaction never applied, and whose
    // compares can never all hold again (another's record there; or none ever, and its owner
    // key moved on): the shared transaction never applied and never will. A member whose
    // first record is gone shows neither: an earlier send may have applied, so it stays
    // unknown, for every member.
    let never = |(seen, unowned): &(Seen, bool)| match seen {
        Seen::Taken => true,
        Seen::Empty => *unowned,
        Seen::Gone | Seen::Committed { .. } => false,
    };
    if seen.iter().any(never) {
        Shared::Never
    } else {
        Shared::Unknown(unknown)
    }
}

/// Committed, at the revision some member's record or tip shows, if any does: the shared
/// transaction applies all or nothing.
fn committed(seen: impl IntoIterator<Item = Seen>) -> Option<Shared> {
    seen.into_iter().find_map(|seen| match seen {
        Seen::Committed { revision } => Some(Shared::Committed { revision }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use etcd_client::proto::PbKeyValue;
    use uuid::Uuid;

    use super::*;
    use crate::etcd::write::Reply;
    use crate::journal::cas::tests::{owner, reply, tip, unknown};
    use crate::journal::record::encode_event;
    use crate::lease::Epoch;

    const EPOCH: Epoch = Epoch(40);

    /// Member `i`'s append: session `i`, first record `r/{i}`, nonce `i`, an append's compares,
    /// 2 puts.
    fn append(i: u128) -> AppendTxn {
        AppendTxn::for_test(
            format!("ns/journals/{i}/r/1"),
            Uuid::from_u128(i),
            EPOCH,
            crate::journal::cas::APPEND_COMPARES,
            2,
            100,
        )
    }

    /// Member `i`'s first record, written by it (or by someone else) at revision 50.
    fn record(i: u128, ours: bool) -> PbKeyValue {
        let nonce = Uuid::from_u128(if ours { i } else { 1000 + i });
        PbKeyValue {
            key: format!("ns/journals/{i}/r/1").into_bytes(),
            value: encode_event(1, EPOCH, nonce, b"event"),
            create_revision: 50,
            mod_revision: 50,
            version: 1,
            lease: 0,
        }
    }

    /// What the shared transaction of members 1, 2, 3 came to.
    fn settled(written: Written) -> String {
        let members = [append(1), append(2), append(3)];
        format!("{:?}", settle(&members.iter().collect::<Vec<_>>(), written))
    }

    #[test]
    fn a_reply_settles_every_member_by_the_compare_and_the_else_branch() {
        let theirs = Uuid::from_u128(1000);
        let failed = |read| settled(Written::Replied(reply(false, read).into()));
        assert_eq!(
            settled(Written::Replied(reply(true, vec![]).into())),
            "Committed { revision: 60 }"
        );
        // The compare failed, and member 2's first record is its own: an earlier send
        // committed, for every member.
        assert_eq!(
            failed(vec![None, None, Some(record(2, true)), None, None, None]),
            "Committed { revision: 50 }"
        );
        // Member 3's first record was trimmed since, but the tip is still its own: the same.
        let tip3 = Some(tip(4, Uuid::from_u128(3)));
        assert_eq!(
            failed(vec![None, None, None, None, None, tip3]),
            "Committed { revision: 55 }"
        );
        // Nobody's record, someone else's, or a trimmed one: it never applies; each on its
        // own (where a trimmed member learns that its outcome is unknown).
        assert_eq!(failed(vec![None; 6]), "Never");
        assert_eq!(
            failed(vec![Some(record(1, false)), None, None, None, None, None]),
            "Never"
        );
        assert_eq!(
            failed(vec![None, Some(tip(4, theirs)), None, None, None, None]),
            "Never"
        );
    }

    #[test]
    fn after_an_unknown_send_a_failed_compare_over_first_records_all_gone_is_unknown() {
        let theirs = Uuid::from_u128(1000);
        let failed = |read| {
            let reply = Reply::after_unknown_send(reply(false, read));
            settled(Written::Replied(reply))
        };
        // Every member's first record trimmed, every tip a successor's: the shared
        // transaction may have committed before the trims. Unknown, never fenced.
        let gone = || Some(tip(4, theirs));
        assert_eq!(
            failed(vec![None, gone(), None, gone(), None, gone()]),
            "Gone"
        );
        // One member's record is its own: committed, for every member.
        assert_eq!(
            failed(vec![
                None,
                gone(),
                Some(record(2, true)),
                gone(),
                None,
                gone()
            ]),
            "Committed { revision: 50 }"
        );
        // One member's place shows the shared transaction never applied: another's record
        // there, or none ever (the tip short of it). Each member on its own.
        assert_eq!(
            failed(vec![
                Some(record(1, false)),
                gone(),
                None,
                gone(),
                None,
                gone()
            ]),
            "Never"
        );
        assert_eq!(
            failed(vec![None, gone(), None, Some(tip(0, theirs)), None, gone()]),
            "Never"
        );
    }

    #[test]
    fn a_member_told_gone_learns_that_its_outcome_is_unknown_for_good() {
        let members = [append(1), append(2)];
        let refs: Vec<_> = members.iter().collect();
        let theirs = Uuid::from_u128(1000);
        let read = vec![None, Some(tip(4, theirs)), None, Some(tip(4, theirs))];
        let shared = settle(
            &refs,
            Written::Replied(Reply::after_unknown_send(reply(false, read))),
        );
        assert!(matches!(shared, Shared::Gone));
        let message = format!("{:?}", members[0].gone());
        assert!(message.contains("record 1 was trimmed"), "{message}");
    }

    #[test]
    fn a_resolving_read_settles_every_member_or_leaves_every_member_unknown() {
        let theirs = Uuid::from_u128(1000);
        let at_epoch = || Some(owner(EPOCH.revision()));
        let resolved = |read: Vec<Option<PbKeyValue>>| {
            settled(Written::Resolved {
                read: reply(true, read),
                unknown: unknown(),
            })
        };
        // Each member: its first record, its tip, its owner key.
        let member = |first, tip, owner| [first, tip, owner];
        let untouched = || member(None, Some(tip(0, theirs)), at_epoch());
        let read = |members: [[Option<PbKeyValue>; 3]; 3]| members.concat();
        // Member 3's record is its own: committed, for every member.
        assert_eq!(
            resolved(read([
                untouched(),
                untouched(),
                member(Some(record(3, true)), None, None)
            ])),
            "Committed { revision: 50 }"
        );
        // Member 1's tip is its own: the same.
        assert_eq!(
            resolved(read([
                member(None, Some(tip(3, Uuid::from_u128(1))), None),
                untouched(),
                untouched()
            ])),
            "Committed { revision: 55 }"
        );
        // Member 2's owner key is gone, and no record ever was in its place: the shared
        // transaction never applied and can never apply.
        assert_eq!(
            resolved(read([
                untouched(),
                member(None, Some(tip(0, theirs)), None),
                untouched()
            ])),
            "Never"
        );
        // Member 1's first record is someone else's: the same.
        assert_eq!(
            resolved(read([
                member(Some(record(1, false)), Some(tip(1, theirs)), at_epoch()),
                untouched(),
                untouched()
            ])),
            "Never"
        );
        // Member 1's first record was trimmed (the tip is past it, another's): whose it was is
        // gone, so the shared transaction may have committed. Unknown, even with every owner
        // key moved on; never "can never apply", which would send each member on its own
        // and tell it fenced.
        assert!(
            resolved(read([
                member(None, Some(tip(2, theirs)), at_epoch()),
                untouched(),
                untouched()
            ]))
            .starts_with("Unknown(")
        );
        let gone = || member(None, Some(tip(2, theirs)), None);
        assert!(resolved(read([gone(), gone(), gone()])).starts_with("Unknown("));
        // Every owner key at its epoch, no record: it may still apply.
        assert!(resolved(read([untouched(), untouched(), untouched()])).starts_with("Unknown("));
        // A read that does not match the members says nothing.
        assert!(resolved(vec![None, None, at_epoch()]).starts_with("Unknown("));
    }

    #[test]
    fn no_answer_leaves_every_member_unknown_and_a_refusal_sends_each_on_its_own() {
        assert!(settled(Written::Unknown(unknown())).starts_with("Unknown("));
        assert_eq!(settled(Written::Failed(unknown())), "Never");
        // Refused for space: final, so each member's own send settles whether it applied.
        let refused = Written::Refused {
            error: unknown(),
            read: None,
        };
        assert_eq!(settled(refused), "Never");
    }
}
