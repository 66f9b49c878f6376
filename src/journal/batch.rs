//! Group commit across sessions: the appends of a store's journals share transactions.
//!
//! A journal has one transaction in flight at a time (its own group commit). With many busy
//! journals, a store would still send one etcd request per journal per round trip, and etcd's
//! work per request (the gRPC call, the raft entry, the apply) would bound it. So a store's
//! journals hand their append transactions to the store's one [`Batcher`]. At most
//! [`JournalLimits::in_flight`] (default 8) transactions are in flight for the whole store.
//! Appends that arrive while every slot is busy queue up, and the next free slot takes as
//! many of them, in arrival order, as fit etcd's limits, into one transaction:
//!
//! ```text
//! if   every member's compares (its tip, its owner key, its first record)
//! then every member's puts (its records, its tip)
//! else get(every member's first record and tip)
//! ```
//!
//! A lone append is sent at once, as its own transaction, with no timer. Two appends of one
//! session never share a transaction (a stale journal and its successor in one store would put
//! the same keys, which etcd refuses).
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
//! - certainly not applied (refused): each member on its own.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Txn, TxnOp};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::JournalLimits;
use super::cas::{AppendTxn, ELSE_GETS, RESOLVE_GETS, Seen, Sent};
use crate::etcd::write::{self, WritePolicy, Written};
use crate::etcd::{Connection, EtcdError, gets};
use crate::lease::Ownership;
use crate::metrics::Metrics;

/// What an append came to, and whether a resolving read settled it (for the metrics).
type Outcome = (Sent, bool);

/// An append waiting for a slot, or in a shared transaction.
struct Member {
    id: u64,
    append: AppendTxn,
    ownership: Ownership,
    reply: oneshot::Sender<Outcome>,
}

/// The store's appends, sent in shared transactions (see the module docs).
pub(crate) struct Batcher {
    queue: std::sync::Mutex<VecDeque<Member>>,
    slots: Arc<Semaphore>,
    ids: AtomicU64,
    connection: Connection,
    policy: WritePolicy,
    limits: JournalLimits,
    metrics: Metrics,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl Batcher {
    pub(crate) fn new(
        connection: Connection,
        policy: WritePolicy,
        limits: JournalLimits,
        metrics: Metrics,
        stop: CancellationToken,
        tasks: TaskTracker,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: std::sync::Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(limits.in_flight)),
            ids: AtomicU64::new(0),
            connection,
            policy,
            limits,
            metrics,
            stop,
            tasks,
        })
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Member>> {
        self.queue
            .lock()
            .expect("the queue lock is never held across a panic")
    }

    /// Sends `append` (under `ownership`) alone or with others', and says what it came to.
    ///
    /// Cancel safety: dropping this future withdraws the append if no transaction took it
    /// yet; if one did, that transaction goes on for its other members, and this append
    /// commits or not with it (the journal is left indeterminate, as for any append whose
    /// sending future is dropped).
    pub(crate) async fn send(
        self: &Arc<Self>,
        append: AppendTxn,
        ownership: &Ownership,
    ) -> Outcome {
        let (reply, mut answer) = oneshot::channel();
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.queue().push_back(Member {
            id,
            append,
            ownership: ownership.clone(),
            reply,
        });
        loop {
            let permit = tokio::select! {
                biased;
                answer = &mut answer => return answer.unwrap_or_else(|_| stopped()),
                permit = self.slots.clone().acquire_owned() => {
                    permit.expect("the slots are never closed")
                }
            };
            let mut batch = self.take();
            match batch.as_slice() {
                // Taken into someone else's transaction: its answer comes.
                [] => continue,
                // Alone: sent here, as its own transaction.
                [only] if only.id == id => {
                    let member = batch.pop().expect("one member");
                    let outcome = self.alone(&member).await;
                    drop(permit);
                    return outcome;
                }
                // Shared (or someone else's alone): sent on a task of the store's, so that
                // dropping this call never cuts the others' transaction short.
                _ => {
                    let batcher = self.clone();
                    self.tasks.spawn(async move {
                        batcher.commit(batch).await;
                        drop(permit);
                    });
                }
            }
        }
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

    /// The next members off the queue (see [`take`]).
    fn take(&self) -> Vec<Member> {
        take(&mut self.queue(), &self.limits)
    }

    /// Sends `member`'s append as its own transaction, through the one write path.
    async fn alone(&self, member: &Member) -> Outcome {
        self.metrics.append_txn(1);
        member
            .append
            .send_telling_how(
                &self.connection,
                &self.policy,
                &member.ownership,
                &self.stop,
            )
            .await
    }

    /// Sends `batch` as one transaction (one member alone as its own) and answers each member.
    async fn commit(&self, batch: Vec<Member>) {
        if batch.len() == 1 {
            let member = batch.into_iter().next().expect("one member");
            let outcome = self.alone(&member).await;
            let _ = member.reply.send(outcome);
            return;
        }
        self.metrics.append_txn(batch.len());
        let txn = Txn::new()
            .when(
                batch
                    .iter()
                    .flat_map(|m| m.append.compares.iter().cloned())
                    .collect::<Vec<_>>(),
            )
            .and_then(
                batch
                    .iter()
                    .flat_map(|m| m.append.puts.iter().cloned())
                    .collect::<Vec<_>>(),
            )
            .or_else(
                batch
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
            || batch.iter().any(|m| m.ownership.is_valid()),
            &self.stop,
        )
        .await;
        let appends: Vec<&AppendTxn> = batch.iter().map(|m| &m.append).collect();
        let (shared, by_read) = match written {
            Written::Unknown(unknown) => (self.resolve(&appends, unknown).await, true),
            written => (settle(&appends, written), false),
        };
        match shared {
            Shared::Committed { revision } => {
                for member in batch {
                    let _ = member.reply.send((Sent::Committed { revision }, by_read));
                }
            }
            Shared::Unknown(error) => {
                for member in batch {
                    let _ = member.reply.send((Sent::Unknown(error.clone()), false));
                }
            }
            Shared::Gone => {
                for member in batch {
                    let gone = member.append.gone();
                    let _ = member.reply.send((Sent::Unknown(gone), false));
                }
            }
            Shared::Never => {
                tracing::debug!(
                    members = batch.len(),
                    "a shared append transaction can never apply; sending each on its own"
                );
                let alone = batch.into_iter().map(|member| async move {
                    let (sent, resolved) = self.alone(&member).await;
                    let _ = member.reply.send((sent, resolved || by_read));
                });
                futures_util::future::join_all(alone).await;
            }
        }
    }
}

/// The next members off `queue`, in order, within etcd's limits (compares, puts, the resolving
/// read's gets, bytes), one per session; the first always, since each append fits alone
/// (checked when it was made). Members whose callers went away are dropped.
fn take(queue: &mut VecDeque<Member>, limits: &JournalLimits) -> Vec<Member> {
    let (max_ops, max_bytes) = (limits.max_txn_ops, limits.max_bytes());
    let mut batch: Vec<Member> = Vec::new();
    let mut sessions = HashSet::new();
    let (mut compares, mut puts, mut bytes) = (0, 0, 0);
    let mut i = 0;
    while let Some(next) = queue.get(i) {
        if next.reply.is_closed() {
            queue.remove(i);
            continue;
        }
        let fits = batch.is_empty()
            || (compares + next.append.compares.len() <= max_ops
                && puts + next.append.puts.len() <= max_ops
                // The `else` branch gets two keys per member, the resolving read three.
                && RESOLVE_GETS.max(ELSE_GETS) * (batch.len() + 1) <= max_ops
                && bytes + next.append.size <= max_bytes);
        if !fits {
            break;
        }
        if !sessions.insert(next.append.session) {
            // The same session's later append: a later transaction.
            i += 1;
            continue;
        }
        let member = queue.remove(i).expect("there");
        compares += member.append.compares.len();
        puts += member.append.puts.len();
        bytes += member.append.size;
        batch.push(member);
    }
    batch
}

/// The answer for a member whose transaction's sender went away: the store is shutting down.
fn stopped() -> Outcome {
    (Sent::Unknown(EtcdError::stopped("append")), false)
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
        Written::Failed(_) => Shared::Never,
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
    use std::time::Duration;

    use etcd_client::proto::PbKeyValue;
    use tokio::time::Instant;
    use uuid::Uuid;

    use super::*;
    use crate::etcd::write::Reply;
    use crate::journal::cas::tests::{owner, reply, tip, unknown};
    use crate::journal::record::encode_event;
    use crate::lease::{Epoch, LeaseState, NodeLease};

    const EPOCH: Epoch = Epoch(40);

    /// Member `i`'s append: session `i`, first record `r/{i}`, nonce `i`, 3 compares, 2 puts.
    fn append(i: u128) -> AppendTxn {
        AppendTxn::for_test(
            Uuid::from_u128(i),
            format!("ns/journals/{i}/r/1"),
            Uuid::from_u128(i),
            EPOCH,
            3,
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
    }

    fn member(i: u128, session: u128) -> (Member, oneshot::Receiver<Outcome>) {
        let node = Arc::new(NodeLease::new(1, Instant::now() + Duration::from_secs(60)));
        let state = LeaseState::new(
            Uuid::from_u128(session),
            EPOCH,
            "k".into(),
            Uuid::nil(),
            node,
        );
        let (reply, answer) = oneshot::channel();
        let mut append = append(i);
        append.session = Uuid::from_u128(session);
        let member = Member {
            id: i as u64,
            append,
            ownership: Ownership::new(state),
            reply,
        };
        (member, answer)
    }

    fn ids(batch: &[Member]) -> Vec<u64> {
        batch.iter().map(|m| m.id).collect()
    }

    #[test]
    fn a_batch_takes_the_queue_in_order_one_append_per_session_within_the_limits() {
        let mut answers = Vec::new();
        let mut queue: VecDeque<Member> = [(1, 1), (2, 2), (3, 1), (4, 3), (5, 4)]
            .into_iter()
            .map(|(i, session)| {
                let (member, answer) = member(i, session);
                answers.push(answer);
                member
            })
            .collect();
        // Room for 3 members' compares (3 each) in 10 operations per branch.
        let limits = JournalLimits::default().with_max_txn_ops(10);
        // Session 1's second append waits for a later transaction; the limit stops at 3.
        assert_eq!(ids(&take(&mut queue, &limits)), [1, 2, 4]);
        assert_eq!(ids(&take(&mut queue, &limits)), [3, 5]);
        assert!(take(&mut queue, &limits).is_empty());

        // Bytes: 100 each, room for 250.
        let mut queue: VecDeque<Member> = (1..=3)
            .map(|i| {
                let (member, answer) = member(i, i);
                answers.push(answer);
                member
            })
            .collect();
        let limits = JournalLimits::default()
            .with_max_request_bytes(250 + 1024)
            .with_headroom(1024);
        assert_eq!(ids(&take(&mut queue, &limits)), [1, 2]);
        assert_eq!(ids(&take(&mut queue, &limits)), [3]);

        // A member whose caller went away is dropped, not sent.
        let (first, answer) = member(1, 1);
        drop(answer);
        let (second, answer) = member(2, 2);
        answers.push(answer);
        let mut queue: VecDeque<Member> = [first, second].into_iter().collect();
        assert_eq!(ids(&take(&mut queue, &JournalLimits::default())), [2]);
        assert!(queue.is_empty());
        drop(answers);
    }
}
