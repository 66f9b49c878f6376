//! Writes that share etcd transactions: a store's independent writes (acquisitions, workspace
//! roots, guarded deletes), each a transaction with compares of its own, sent together when
//! several are ready at once.
//!
//! An operation of an etcd transaction may itself be a transaction (etcd 3.3 and later), which
//! evaluates its own compares and applies its own branch. So the shared transaction has no
//! compares of its own and always applies; each write in it is one of its operations, and
//! succeeds or fails its compares, and reads its `else` branch, exactly as it would alone. One
//! write's refusal never becomes another's, and the shared transaction is one request, one
//! raft entry and one apply in etcd instead of many.
//!
//! It is sent through the one write path ([`write::send`]): re-sent byte-identical while any
//! member's condition holds (each member's compares make at most one of its sends apply, so a
//! member whose own condition failed meanwhile is safe in it), within the write's deadline. Its
//! outcome, left unknown, is resolved by one read made of every member's resolving read (as
//! operations of one read-only transaction). Each member then learns its own part of what the
//! shared transaction came to: its own reply (and whether an earlier send may have applied), its
//! own resolving read, or the shared failure, unknown outcome or NOSPACE refusal, which are
//! every member's, except a permanent refusal (not applied, and maybe for one member's sake
//! alone, such as a key its user may not write): each member is then sent on its own.
//!
//! No timer, as in the append queue: a write that finds one of the `slots` free is sent at
//! once and alone (its own transaction, as [`write::send`] sends it). Writes that arrive while
//! every slot is taken wait, and the next free slot takes up to `max_members` of them in
//! arrival order, never two naming the same key (etcd refuses a transaction that writes one key
//! twice). Writes are sent on the store's tasks: one whose caller went away before a
//! transaction took it is withdrawn; one taken goes on, and what it commits is its caller's to
//! find (an acquisition's orphan is deleted by the owner watch).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connection::Connection;
use super::error::{EtcdError, FailureClass};
use super::write::{self, WritePolicy, Written};

/// Whether a write may still be re-sent (see [`write::send`]).
type GoOn = Box<dyn Fn() -> bool + Send + Sync>;

/// A write waiting for a transaction.
struct Pending {
    operation: &'static str,
    /// The key it writes: no two writes of one key share a transaction.
    key: String,
    txn: Txn,
    resolve: Option<Txn>,
    go_on: GoOn,
    reply: oneshot::Sender<Written>,
}

/// What a [`SharedWrites`] needs: where and how to send, how many at once, and the store's
/// shutdown and tasks.
pub(crate) struct SharedParts {
    pub(crate) connection: Connection,
    pub(crate) policy: WritePolicy,
    /// Transactions in flight at most.
    pub(crate) slots: usize,
    /// Writes per transaction at most: etcd's operations per transaction.
    pub(crate) max_members: usize,
    pub(crate) stop: CancellationToken,
    pub(crate) tasks: TaskTracker,
}

/// A store's writes that share transactions (see the module docs).
pub(crate) struct SharedWrites {
    waiting: Mutex<VecDeque<Pending>>,
    slots: Arc<Semaphore>,
    max_members: usize,
    connection: Connection,
    policy: WritePolicy,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for SharedWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWrites")
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl SharedWrites {
    pub(crate) fn new(parts: SharedParts) -> Arc<Self> {
        Arc::new(Self {
            waiting: Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(parts.slots.max(1))),
            max_members: parts.max_members.max(1),
            connection: parts.connection,
            policy: parts.policy,
            stop: parts.stop,
            tasks: parts.tasks,
        })
    }

    /// Sends `txn`, which writes `key`, as [`write::send`] does (re-sent while `go_on` holds,
    /// `resolve` settling an unknown outcome), sharing a transaction with the writes ready at
    /// the same time; what it came to is its own part of the shared outcome (see the module
    /// docs).
    pub(crate) async fn send(
        self: &Arc<Self>,
        operation: &'static str,
        key: impl Into<String>,
        txn: Txn,
        resolve: Option<Txn>,
        go_on: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Written {
        let (reply, written) = oneshot::channel();
        lock(&self.waiting).push_back(Pending {
            operation,
            key: key.into(),
            txn,
            resolve,
            go_on: Box::new(go_on),
            reply,
        });
        self.pump();
        // Its sender goes only with its transaction's task, cut short by the runtime's end.
        written
            .await
            .unwrap_or_else(|_| Written::Unknown(EtcdError::stopped(operation)))
    }

    /// Sends transactions while a slot is free and writes wait.
    fn pump(self: &Arc<Self>) {
        while let Ok(slot) = self.slots.clone().try_acquire_owned() {
            let members = self.take();
            if members.is_empty() {
                return;
            }
            let shared = self.clone();
            self.tasks.spawn(async move {
                shared.write(members).await;
                drop(slot);
                shared.pump();
            });
        }
    }

    /// The next transaction's writes: up to `max_members` of the waiting ones, in arrival
    /// order, no two of one key. Writes whose callers went away are withdrawn.
    fn take(&self) -> Vec<Pending> {
        let mut waiting = lock(&self.waiting);
        let mut keys = HashSet::new();
        let mut taken = Vec::new();
        let mut i = 0;
        while i < waiting.len() && taken.len() < self.max_members {
            if waiting[i].reply.is_closed() {
                waiting.remove(i);
            } else if keys.insert(waiting[i].key.clone()) {
                taken.extend(waiting.remove(i));
            } else {
                i += 1;
            }
        }
        taken
    }

    /// Sends the transaction of `members` and answers each.
    async fn write(&self, members: Vec<Pending>) {
        let stop = &self.stop;
        if members.len() == 1 {
            let member = members.into_iter().next().expect("one member");
            self.alone(member).await;
            return;
        }
        let txn = Txn::new().and_then(
            members
                .iter()
                .map(|m| TxnOp::txn(m.txn.clone()))
                .collect::<Vec<_>>(),
        );
        // Member i's resolving read is the read's operation `resolving[i]`, if it has one.
        let mut reads = Vec::new();
        let resolving: Vec<Option<usize>> = members
            .iter()
            .map(|m| {
                m.resolve.as_ref().map(|read| {
                    reads.push(TxnOp::txn(read.clone()));
                    reads.len() - 1
                })
            })
            .collect();
        let resolve = (!reads.is_empty()).then(|| Txn::new().and_then(reads));
        let operation = members[0].operation;
        let operation = if members.iter().all(|m| m.operation == operation) {
            operation
        } else {
            "shared write"
        };
        let go_on = || members.iter().any(|m| (m.go_on)());
        let written = write::send(
            &self.connection,
            &self.policy,
            operation,
            &txn,
            resolve.as_ref(),
            go_on,
            stop,
        )
        .await;
        if let Written::Failed(error) = &written
            && error.class() == FailureClass::Permanent
        {
            // Not applied, and maybe for one member's sake alone (a key its user may not
            // write): each is sent on its own, and learns its own outcome.
            tracing::debug!(%error, writes = members.len(), "a shared transaction was refused; its writes go alone");
            futures_util::future::join_all(members.into_iter().map(|m| self.alone(m))).await;
            return;
        }
        let parts = split(written, &resolving, operation);
        for (member, written) in members.into_iter().zip(parts) {
            // A caller that went away meanwhile no longer needs its answer.
            let _ = member.reply.send(written);
        }
    }
}

impl SharedWrites {
    /// Sends `member` as its own transaction and answers it.
    async fn alone(&self, member: Pending) {
        let written = write::send(
            &self.connection,
            &self.policy,
            member.operation,
            &member.txn,
            member.resolve.as_ref(),
            &member.go_on,
            &self.stop,
        )
        .await;
        let _ = member.reply.send(written);
    }
}

/// Each member's part of what a shared transaction came to: member i's reply is the reply's
/// operation i, its resolving read the read's operation `resolving[i]`.
fn split(written: Written, resolving: &[Option<usize>], operation: &'static str) -> Vec<Written> {
    let members = resolving.len();
    let unreadable = |what: &str| {
        let why = format!("a shared transaction's {what} is not one transaction per write");
        Written::Unknown(EtcdError::unreadable(operation, why))
    };
    match written {
        Written::Replied(reply) => match parts(&reply, members) {
            Some(parts) => parts
                .into_iter()
                .map(|part| Written::Replied(reply.part(part)))
                .collect(),
            // Applied as sent, but not as it reads: what each member came to is unknown.
            None => (0..members).map(|_| unreadable("reply")).collect(),
        },
        Written::Resolved { read, unknown } => {
            let reads = parts(&read, resolving.iter().flatten().count());
            resolving
                .iter()
                .map(|at| match (at, &reads) {
                    (Some(at), Some(reads)) => Written::Resolved {
                        read: reads[*at].clone(),
                        unknown: unknown.clone(),
                    },
                    _ => Written::Unknown(unknown.clone()),
                })
                .collect()
        }
        Written::Refused { error, read } => {
            let reads = read.and_then(|read| parts(&read, resolving.iter().flatten().count()));
            resolving
                .iter()
                .map(|at| Written::Refused {
                    error: error.clone(),
                    read: at.and_then(|at| reads.as_ref().map(|reads| reads[at].clone())),
                })
                .collect()
        }
        Written::Unknown(error) => (0..members)
            .map(|_| Written::Unknown(error.clone()))
            .collect(),
        Written::Failed(error) => (0..members)
            .map(|_| Written::Failed(error.clone()))
            .collect(),
    }
}

/// The `count` transactions a shared transaction's response holds, one per operation; `None`
/// if it holds anything else.
///
/// etcd gives an operation's transaction no header: each part gets the shared one, whose
/// revision is the one each part's writes applied at (the whole transaction is one revision),
/// or the store's revision after it, as a transaction of its own would say.
fn parts(response: &TxnResponse, count: usize) -> Option<Vec<TxnResponse>> {
    let parts: Vec<TxnResponse> = response
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Txn(mut part) => {
                part.0.header.clone_from(&response.0.header);
                Some(part)
            }
            _ => None,
        })
        .collect::<Option<_>>()?;
    (parts.len() == count).then_some(parts)
}

use crate::sync::lock;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use etcd_client::proto::{
        PbKeyValue, PbRangeResponse, PbResponseHeader, PbResponseOp, PbTxnOpResponse, PbTxnResponse,
    };

    use super::*;
    use crate::etcd::write::Reply;

    /// A write's own part: `succeeded`, one get of `key`, and no header (as etcd gives it).
    fn part(succeeded: bool, key: &str) -> PbTxnResponse {
        PbTxnResponse {
            header: None,
            succeeded,
            responses: vec![PbResponseOp {
                response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse {
                    kvs: vec![PbKeyValue {
                        key: key.as_bytes().to_vec(),
                        ..PbKeyValue::default()
                    }],
                    ..PbRangeResponse::default()
                })),
            }],
        }
    }

    /// A shared transaction's response at revision 60, one operation per part.
    fn shared(parts: Vec<PbTxnResponse>) -> TxnResponse {
        TxnResponse(PbTxnResponse {
            header: Some(PbResponseHeader {
                revision: 60,
                ..PbResponseHeader::default()
            }),
            succeeded: true,
            responses: parts
                .into_iter()
                .map(|part| PbResponseOp {
                    response: Some(PbTxnOpResponse::ResponseTxn(part)),
                })
                .collect(),
        })
    }

    fn key_of(response: &TxnResponse) -> String {
        match response.op_responses().first() {
            Some(TxnOpResponse::Get(get)) => String::from_utf8_lossy(get.kvs()[0].key()).into(),
            other => panic!("{other:?}"),
        }
    }

    fn error() -> EtcdError {
        EtcdError::timed_out("acquire", "http://e", Duration::from_secs(1))
    }

    #[test]
    fn each_write_gets_its_own_reply_with_the_shared_header_and_history() {
        let reply = Reply::after_unknown_send(shared(vec![part(true, "a"), part(false, "b")]));
        let parts = split(Written::Replied(reply), &[None, None], "acquire");
        let [Written::Replied(a), Written::Replied(b)] = parts.as_slice() else {
            panic!("{parts:?}");
        };
        assert!(a.succeeded() && !b.succeeded(), "each its own compares");
        assert_eq!((key_of(a), key_of(b)), ("a".into(), "b".into()));
        for part in [a, b] {
            assert_eq!(part.header().map(|h| h.revision()), Some(60));
            assert!(
                part.after_unknown(),
                "an earlier send may have applied, for each"
            );
        }
    }

    #[test]
    fn each_write_gets_its_own_resolving_read_or_stays_unknown_without_one() {
        let read = shared(vec![part(true, "a"), part(true, "c")]);
        let written = Written::Resolved {
            read,
            unknown: error(),
        };
        let parts = split(written, &[Some(0), None, Some(1)], "acquire");
        match parts.as_slice() {
            [
                Written::Resolved { read: a, .. },
                Written::Unknown(_),
                Written::Resolved { read: c, .. },
            ] => assert_eq!((key_of(a), key_of(c)), ("a".into(), "c".into())),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_unknown_outcome_or_refusal_is_every_writes() {
        let failed = split(Written::Failed(error()), &[None, None], "acquire");
        assert!(failed.iter().all(|w| matches!(w, Written::Failed(_))));
        let unknown = split(Written::Unknown(error()), &[None, None], "acquire");
        assert!(unknown.iter().all(|w| matches!(w, Written::Unknown(_))));
        let refused = Written::Refused {
            error: EtcdError::no_space("acquire"),
            read: Some(shared(vec![part(true, "b")])),
        };
        match split(refused, &[None, Some(0)], "acquire").as_slice() {
            [
                Written::Refused { read: None, .. },
                Written::Refused { read: Some(b), .. },
            ] => assert_eq!(key_of(b), "b"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_not_made_of_one_transaction_per_write_leaves_each_unknown() {
        let short = Reply::from(shared(vec![part(true, "a")]));
        let parts = split(Written::Replied(short), &[None, None], "acquire");
        assert!(parts.iter().all(|w| matches!(w, Written::Unknown(_))));
    }

    async fn writes(max_members: usize) -> Arc<SharedWrites> {
        SharedWrites::new(SharedParts {
            connection: Connection::unconnected("http://127.0.0.1:1").await,
            policy: WritePolicy::default(),
            slots: 1,
            max_members,
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
        })
    }

    /// Queues a write of `key` without sending it; the receiver is its caller.
    fn queue(writes: &SharedWrites, key: &str) -> oneshot::Receiver<Written> {
        let (reply, written) = oneshot::channel();
        lock(&writes.waiting).push_back(Pending {
            operation: "acquire",
            key: key.into(),
            txn: Txn::new(),
            resolve: None,
            go_on: Box::new(|| true),
            reply,
        });
        written
    }

    #[tokio::test]
    async fn a_transaction_takes_waiting_writes_in_order_never_one_key_twice_nor_a_withdrawn_one() {
        let writes = writes(3).await;
        let _a = queue(&writes, "a");
        let _a_again = queue(&writes, "a");
        drop(queue(&writes, "gone"));
        let _b = queue(&writes, "b");
        let _c = queue(&writes, "c");
        let _d = queue(&writes, "d");
        let keys = |taken: Vec<Pending>| taken.into_iter().map(|p| p.key).collect::<Vec<_>>();
        assert_eq!(keys(writes.take()), ["a", "b", "c"], "at most 3, in order");
        assert_eq!(
            keys(writes.take()),
            ["a", "d"],
            "the second `a` in the next one"
        );
        assert!(writes.take().is_empty());
    }
}
