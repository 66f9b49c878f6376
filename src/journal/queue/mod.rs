//! The store's append queue: every append call of every journal of a store waits here, and the
//! store forms its append transactions from it.
//!
//! A call joins its journal's waiting calls (the journal's [`Writer`]). A journal with calls
//! waiting and no transaction in flight is *ready*. Whenever one of the store's
//! [`JournalLimits::in_flight`] slots is free and a journal is ready, the store takes the ready
//! journals in the order they became ready and forms one transaction of them:
//!
//! - one append per journal, made of its waiting calls in arrival order, as many as fit the
//!   journal's [limits](super#limits) (group commit);
//! - as many journals as fit etcd's limits, each with its own compares (journals sharing a
//!   transaction: see [`batch`](super::batch) for how its outcome is read);
//! - never two journals of one session (a stale journal and its successor in one store would
//!   put the same keys, which etcd refuses).
//!
//! So a journal has at most one transaction in flight, a store at most `in_flight`, and a lone
//! call is sent at once, with no timer. The journals that did not fit go first in the next
//! transaction. A transaction's journals stay in flight for one turn of the scheduler after
//! its calls are answered, so that callers who append again at once share their journal's
//! next append rather than wait a round trip behind one of whichever came back first.
//!
//! Transactions are sent on the store's tasks, never on a caller's future: a call dropped
//! before a transaction took it is withdrawn; one dropped after commits or not with its
//! transaction, and its journal learns which. A journal whose lease is lost, or whose journal
//! is fenced, indeterminate or closed, has its waiting calls refused without sending anything.
//!
//! Lock order: the ready list, then a writer's state, then its keys. None is held across an
//! `.await`.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use etcd_client::Compare;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;
use uuid::Uuid;

mod call;
#[cfg(feature = "testing")]
pub(crate) mod mutant;
mod writer;

use super::cas::{APPEND_COMPARES, AppendTxn, ELSE_GETS, RESOLVE_GETS, Sent};
use super::keyed::Ticket;
use super::record::{Tip, encode_tip};
use super::{Appended, JournalLimits, JournalWriteError};
use crate::etcd::Connection;
use crate::etcd::write::WritePolicy;
use crate::lease::Ownership;
use crate::metrics::Metrics;
pub(crate) use call::Answer;
use call::{Call, Records};
use writer::Joined;
pub(crate) use writer::Writer;

/// A transaction's `else` branch gets two keys per member and its resolving read three: no
/// more than the member's compares, so a transaction whose compares fit etcd's operations
/// limit fits it in its reads as well.
const _GETS_WITHIN_COMPARES: () =
    assert!(ELSE_GETS <= APPEND_COMPARES && RESOLVE_GETS <= APPEND_COMPARES);

/// One journal's append in a transaction being formed or sent: its calls, in order.
pub(crate) struct Member {
    writer: Arc<Writer>,
    calls: Vec<Call>,
    records: usize,
    first_seq: u64,
    pub(super) append: AppendTxn,
    /// Whether its journal has learnt what it came to (see [`Drop`]).
    settled: bool,
}

impl Member {
    fn new(writer: Arc<Writer>, calls: Vec<Call>, first_seq: u64, tip_mod_revision: i64) -> Self {
        let records = calls.iter().map(|call| call.records.len()).sum();
        let guard = writer.ownership.guard();
        let append = build(&writer, &calls, first_seq, tip_mod_revision, guard);
        Self {
            writer,
            calls,
            records,
            first_seq,
            append,
            settled: false,
        }
    }

    pub(super) fn ownership(&self) -> &Ownership {
        &self.writer.ownership
    }

    /// Whether it is its journal's fence.
    pub(super) fn is_fence(&self) -> bool {
        self.calls
            .first()
            .is_some_and(|call| call.records.is_fence())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if !self.settled {
            self.writer.abandon();
        }
    }
}

/// Whether a call joins its journal behind others: the journal is in flight or listed already,
/// so whoever listed it, or its transaction's task, pumps.
fn joins_behind(state: &writer::State) -> bool {
    state.in_flight || state.listed
}

/// The append transaction of `calls`' records, in order, from `first_seq` under a fresh
/// nonce. `take` checked that the last sequence number fits.
fn build(
    writer: &Writer,
    calls: &[Call],
    first_seq: u64,
    tip_mod_revision: i64,
    guard: Compare,
) -> AppendTxn {
    let (ownership, epoch) = (&writer.ownership, writer.ownership.epoch());
    let nonce = Uuid::new_v4();
    let mut values = Vec::new();
    for call in calls {
        // Within the append's range: never saturates.
        let seq = first_seq.saturating_add(values.len() as u64);
        values.extend(call.records.encode(seq, epoch, nonce));
    }
    let last_seq = first_seq.saturating_add(values.len() as u64 - 1);
    let tip = encode_tip(&Tip {
        seq: last_seq,
        epoch,
        nonce,
    });
    let append = AppendTxn::build(
        &writer.namespace,
        ownership,
        guard,
        first_seq,
        nonce,
        values,
        tip,
        tip_mod_revision,
    );
    debug_assert_eq!(
        append.size,
        writer.size_of(calls.iter().flat_map(|call| call.records.value_lens()))
    );
    append
}

/// What the store's batcher is made of.
pub(crate) struct BatcherParts {
    pub(crate) connection: Connection,
    pub(crate) policy: WritePolicy,
    pub(crate) limits: JournalLimits,
    pub(crate) metrics: Metrics,
    pub(crate) stop: CancellationToken,
    pub(crate) tasks: TaskTracker,
    /// The store's span, parent of each transaction's.
    pub(crate) span: tracing::Span,
    /// What sends its transactions in place of the protocol: `None`, the protocol as written
    /// (only the test-only protocol mutants set one).
    pub(crate) hook: Option<Box<dyn Hook>>,
}

/// What sends a transaction in place of the protocol: the seam where the test-only protocol
/// mutants ([`mutant`], feature `testing`) come in, once per store, when it is built.
pub(crate) trait Hook: Send + Sync {
    /// Sends the appends of `members` and says what each came to, in order.
    fn send<'a>(
        &'a self,
        batcher: &'a Batcher,
        members: &'a mut [Member],
    ) -> futures_util::future::BoxFuture<'a, Vec<Sent>>;
}

/// The store's append queue and the transactions it sends (see the module docs).
pub(crate) struct Batcher {
    /// The ready journals, in the order they became ready.
    ready: Mutex<VecDeque<Arc<Writer>>>,
    slots: Arc<Semaphore>,
    pub(super) connection: Connection,
    pub(super) policy: WritePolicy,
    limits: JournalLimits,
    pub(super) metrics: Metrics,
    pub(super) stop: CancellationToken,
    tasks: TaskTracker,
    span: tracing::Span,
    hook: Option<Box<dyn Hook>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl Batcher {
    pub(crate) fn new(parts: BatcherParts) -> Arc<Self> {
        Arc::new(Self {
            ready: Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(parts.limits.in_flight)),
            connection: parts.connection,
            policy: parts.policy,
            limits: parts.limits,
            metrics: parts.metrics,
            stop: parts.stop,
            tasks: parts.tasks,
            span: parts.span,
            hook: parts.hook,
        })
    }

    /// Queues an append of `payloads` (which fit one append alone) to `writer`'s journal, and
    /// waits for its answer.
    ///
    /// Cancel safety: dropping this future withdraws the call unless a transaction took it
    /// already; one that did commits or not with its transaction, and the journal learns
    /// which.
    pub(crate) async fn append(
        self: &Arc<Self>,
        writer: &Arc<Writer>,
        payloads: Vec<Vec<u8>>,
    ) -> Answer {
        self.call(
            writer,
            Call::new(Records::Events(payloads), oneshot::channel().0),
        )
        .await
    }

    /// Queues the append of `payloads` under `ticket`'s idempotency key (its first call), and
    /// waits for its answer. Cancel safe as [`append`](Self::append); the ticket records what
    /// the call came to in the journal's keys, also when it is dropped.
    pub(crate) async fn append_keyed(
        self: &Arc<Self>,
        writer: &Arc<Writer>,
        ticket: Ticket,
        payloads: Vec<Vec<u8>>,
    ) -> Answer {
        let records = Records::Keyed(ticket.key(), payloads);
        let mut call = Call::new(records, oneshot::channel().0);
        call.ticket = Some(ticket);
        self.call(writer, call).await
    }

    /// Queues `writer`'s fence after `previous`, the first append of a journal being opened
    /// (`writer` made for it, nothing else queued), and waits for its answer. Fences of many
    /// journals being opened share transactions as appends do; a fence is as its journal's
    /// appends are: the same compares, the same outcomes.
    pub(crate) async fn fence(
        self: &Arc<Self>,
        writer: &Arc<Writer>,
        previous: Option<Tip>,
    ) -> Answer {
        self.call(
            writer,
            Call::new(Records::Fence(previous), oneshot::channel().0),
        )
        .await
    }

    /// Queues `call` (its reply made here) and waits for its answer.
    async fn call(self: &Arc<Self>, writer: &Arc<Writer>, mut call: Call) -> Answer {
        let (reply, answer) = oneshot::channel();
        call.reply = reply;
        match self.join(writer, call) {
            Err(refused) => return Answer::refused(refused),
            // Whoever listed the journal, or the transaction it is in, pumps after this.
            Ok(Joined::Behind) => {}
            Ok(Joined::Listed) => self.pump(),
        }
        // The answer's sender goes only with its transaction's task, unsettled: see
        // `Writer::abandon`.
        answer
            .await
            .unwrap_or_else(|_| Answer::refused(JournalWriteError::Indeterminate))
    }

    /// Adds `call` to its journal's waiting calls, listing the journal as ready if it is not
    /// and has nothing in flight; or refuses it at once.
    fn join(&self, writer: &Arc<Writer>, call: Call) -> Result<Joined, JournalWriteError> {
        {
            // The common case under load: the journal is in flight or listed already.
            let mut state = writer.state();
            if let Some(refused) = writer.refusal(state.condition) {
                return Err(refused);
            }
            if joins_behind(&state) {
                state.waiting.push_back(call);
                return Ok(Joined::Behind);
            }
        }
        let mut ready = lock(&self.ready);
        let mut state = writer.state();
        if let Some(refused) = writer.refusal(state.condition) {
            return Err(refused);
        }
        state.waiting.push_back(call);
        // Listed or sent since the look above.
        if joins_behind(&state) {
            return Ok(Joined::Behind);
        }
        state.listed = true;
        ready.push_back(writer.clone());
        Ok(Joined::Listed)
    }

    /// Sends transactions while a slot is free and a journal is ready.
    fn pump(self: &Arc<Self>) {
        while let Ok(slot) = self.slots.clone().try_acquire_owned() {
            let members = self.take();
            if members.is_empty() {
                return;
            }
            let span =
                tracing::debug_span!(parent: &self.span, "append txn", journals = members.len());
            let batcher = self.clone();
            self.tasks.spawn(
                async move {
                    batcher.send(members).await;
                    drop(slot);
                    batcher.pump();
                }
                .instrument(span),
            );
        }
    }

    /// Takes the next transaction's journals off the ready list (see the module docs), each
    /// with its calls, in flight from now on; answers the calls of journals that refuse.
    fn take(&self) -> Vec<Member> {
        let (max_ops, max_bytes) = (self.limits.max_txn_ops, self.limits.max_bytes());
        let mut taken = Vec::new();
        let mut sessions = HashSet::new();
        let (mut compares, mut puts, mut bytes) = (0, 0, 0);
        let mut ready = lock(&self.ready);
        let mut i = 0;
        while let Some(writer) = ready.get(i).cloned() {
            let mut state = writer.state();
            let refused = writer.refusal(state.condition);
            let (calls, records, size) = writer.coalesce(&mut state, &self.limits);
            let first_seq = state.next_seq;
            // The last record and the next append's first must fit in a u64.
            let exhausted = first_seq
                .checked_add(records as u64)
                .is_none()
                .then_some(JournalWriteError::SequenceExhausted { seq: first_seq });
            if let Some(refused) = refused.or(exhausted) {
                for call in state.waiting.drain(..) {
                    call.answer(Answer::refused(refused.clone()));
                }
            }
            if state.waiting.is_empty() {
                state.listed = false;
                drop(state);
                ready.remove(i);
                continue;
            }
            if sessions.contains(&writer.ownership.session_id()) {
                // The same session's other journal: a later transaction.
                i += 1;
                continue;
            }
            // The compares bound the gets too: see `_GETS_WITHIN_COMPARES`.
            let fits = taken.is_empty()
                || (compares + APPEND_COMPARES <= max_ops
                    && puts + (records + 1) <= max_ops
                    && bytes + size <= max_bytes);
            if !fits {
                break;
            }
            sessions.insert(writer.ownership.session_id());
            (compares, puts, bytes) =
                (compares + APPEND_COMPARES, puts + records + 1, bytes + size);
            let mut calls: Vec<Call> = state.waiting.drain(..calls).collect();
            calls.iter_mut().for_each(Call::sent);
            if state.waiting.is_empty() {
                // A journal that appends now and then keeps no queue between its appends.
                state.waiting = VecDeque::new();
            }
            (state.listed, state.in_flight) = (false, true);
            let tip_mod_revision = state.tip_mod_revision;
            drop(state);
            ready.remove(i);
            taken.push((writer, calls, first_seq, tip_mod_revision));
        }
        drop(ready);
        taken
            .into_iter()
            .map(|(writer, calls, first_seq, tip)| Member::new(writer, calls, first_seq, tip))
            .collect()
    }

    /// Sends the transaction of `members` and tells each journal and call what it came to.
    async fn send(&self, mut members: Vec<Member>) {
        for member in members.iter().filter(|member| !member.is_fence()) {
            self.metrics.batch(member.records);
        }
        let sent = self.sent(&mut members).await;
        let flight = Flight {
            batcher: self,
            writers: members.iter().map(|m| m.writer.clone()).collect(),
        };
        for (member, sent) in members.into_iter().zip(sent) {
            self.finish(member, sent);
        }
        // The callers just answered come back with their next appends at once: they join
        // their journals' next appends rather than wait a round trip behind a transaction of
        // whichever came back first. (No timer: one turn of the scheduler.)
        tokio::task::yield_now().await;
        drop(flight);
    }

    /// What the transaction of `members` came to, member by member: as the protocol says, or
    /// as a test-only mutant breaks it.
    async fn sent(&self, members: &mut [Member]) -> Vec<Sent> {
        match &self.hook {
            None => self.commit(members).await,
            Some(hook) => hook.send(self, members).await,
        }
    }

    /// Records what `member`'s append came to in its journal and answers each of its calls
    /// (its own sequence numbers, or the outcome as its own error). The journal stays in
    /// flight until [`land`](Self::land).
    fn finish(&self, mut member: Member, sent: Sent) {
        let (by_read, for_space) = (sent.by_read(), sent.for_space());
        let writer = member.writer.clone();
        let mut state = writer.state();
        let last_seq = member.first_seq.saturating_add(member.records as u64 - 1);
        let result = writer.settle(&mut state, (member.first_seq, last_seq), sent);
        member.settled = true;
        let mut first_seq = member.first_seq;
        for call in member.calls.drain(..) {
            // Inside the transaction's range: these never saturate.
            let last_seq = first_seq.saturating_add(call.records.len() as u64 - 1);
            let result = result.clone().map(|appended| Appended {
                first_seq,
                last_seq,
                ..appended
            });
            first_seq = last_seq.saturating_add(1);
            call.answer(Answer {
                result,
                by_read,
                for_space,
            });
        }
    }

    /// Ends `writer`'s transaction in flight, and lists its journal again if calls wait.
    fn land(&self, writer: &Arc<Writer>) {
        let mut ready = lock(&self.ready);
        let mut state = writer.state();
        state.in_flight = false;
        if !state.waiting.is_empty() && !state.listed {
            state.listed = true;
            ready.push_back(writer.clone());
        }
        drop(state);
        drop(ready);
        writer.idle.notify_waiters();
    }
}

/// The journals of a transaction whose outcome they have learnt: landed when this is dropped,
/// also if the transaction's task is dropped before it lands them.
struct Flight<'a> {
    batcher: &'a Batcher,
    writers: Vec<Arc<Writer>>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        for writer in &self.writers {
            self.batcher.land(writer);
        }
    }
}

use crate::sync::lock;

#[cfg(test)]
mod tests;
