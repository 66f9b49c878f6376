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
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::Compare;
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;
use uuid::Uuid;

use super::cas::{AppendTxn, ELSE_GETS, RESOLVE_GETS, Sent, append_size};
use super::key::IdempotencyKey;
use super::keyed::{KeyBudget, KeyIndex, Ticket};
use super::record::{self, Keyed, Tip, encode_tip};
use super::{AppendError, Appended, JournalLeaseLostError, JournalLimits, JournalWriteError};
use crate::etcd::Connection;
use crate::etcd::write::WritePolicy;
use crate::hooks::OnceHooks;
use crate::keys::Namespace;
use crate::lease::{Epoch, Ownership};
use crate::metrics::Metrics;

/// The compares of one append: the tip, the owner key, the first record.
const APPEND_COMPARES: usize = 3;

/// A transaction's `else` branch gets two keys per member and its resolving read three: no
/// more than the member's compares, so a transaction whose compares fit etcd's operations
/// limit fits it in its reads as well.
const _GETS_WITHIN_COMPARES: () =
    assert!(ELSE_GETS <= APPEND_COMPARES && RESOLVE_GETS <= APPEND_COMPARES);

/// What an append call is told, whether only the resolving read settled its transaction's
/// outcome, and whether etcd answered NOSPACE a transaction it applied (for the metrics).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) result: Result<Appended, JournalWriteError>,
    pub(crate) by_read: bool,
    pub(crate) for_space: bool,
}

impl Answer {
    fn refused(error: JournalWriteError) -> Self {
        Self {
            result: Err(error),
            by_read: false,
            for_space: false,
        }
    }
}

/// A call waiting for a transaction: its records, and where its answer goes (with its key's
/// ticket, for the first call of an idempotency key).
struct Call {
    records: Records,
    reply: oneshot::Sender<Answer>,
    ticket: Option<Ticket>,
}

impl Call {
    fn new(records: Records, reply: oneshot::Sender<Answer>) -> Self {
        Self {
            records,
            reply,
            ticket: None,
        }
    }

    /// Tells the call (and its key's waiting calls) what it came to.
    fn answer(mut self, answer: Answer) {
        if let Some(ticket) = self.ticket.take() {
            ticket.answer(&answer.result);
        }
        // A caller that went away meanwhile no longer needs its answer.
        let _ = self.reply.send(answer);
    }

    /// A transaction took it.
    fn sent(&mut self) {
        if let Some(ticket) = &mut self.ticket {
            ticket.sent();
        }
    }
}

/// What a call appends.
enum Records {
    /// One event per payload.
    Events(Vec<Vec<u8>>),
    /// One event per payload, each carrying the append's idempotency key and its place in it.
    Keyed(IdempotencyKey, Vec<Vec<u8>>),
    /// The journal's fence after the tip it names (`None`: no records yet): the first append
    /// of a journal being opened, alone in its journal's append.
    Fence(Option<Tip>),
}

impl Records {
    fn len(&self) -> usize {
        match self {
            Self::Events(payloads) | Self::Keyed(_, payloads) => payloads.len(),
            Self::Fence(_) => 1,
        }
    }

    fn is_fence(&self) -> bool {
        matches!(self, Self::Fence(_))
    }

    /// The length of each record's encoded value.
    fn value_lens(&self) -> impl Iterator<Item = usize> + '_ {
        let (events, header, fence) = match self {
            Self::Events(payloads) => (payloads.as_slice(), record::RECORD_HEADER, None),
            Self::Keyed(_, payloads) => (
                payloads.as_slice(),
                record::RECORD_HEADER + record::KEYED_PART,
                None,
            ),
            Self::Fence(previous) => ([].as_slice(), 0, Some(record::fence_len(previous.as_ref()))),
        };
        let events = events.iter().map(move |p| header + p.len());
        events.chain(fence)
    }

    /// The encoded values, from `first_seq` on, written with `nonce` at `epoch`.
    fn encode(&self, first_seq: u64, epoch: Epoch, nonce: Uuid) -> Vec<Vec<u8>> {
        match self {
            Self::Events(payloads) => payloads
                .iter()
                .zip(first_seq..)
                .map(|(payload, seq)| record::encode_event(seq, epoch, nonce, payload))
                .collect(),
            Self::Keyed(key, payloads) => {
                // Within one transaction's limits: far fewer than u32::MAX records.
                let parts = u32::try_from(payloads.len()).unwrap_or(u32::MAX);
                payloads
                    .iter()
                    .zip(first_seq..)
                    .zip(0..)
                    .map(|((payload, seq), part)| {
                        let keyed = Keyed {
                            key: *key,
                            part,
                            parts,
                        };
                        record::encode_keyed_event(seq, epoch, nonce, keyed, payload)
                    })
                    .collect()
            }
            Self::Fence(previous) => vec![record::encode_fence(first_seq, epoch, nonce, *previous)],
        }
    }
}

/// Where a joining call found its journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Joined {
    /// Listed as ready by this call: the caller pumps.
    Listed,
    /// Listed or in flight already: whoever listed it, or its transaction's task, pumps.
    Behind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Open,
    Fenced,
    Indeterminate,
    Closed,
}

/// A journal's side of the store's queue: where it stands, and its calls waiting.
pub(crate) struct Writer {
    ownership: Ownership,
    namespace: Namespace,
    /// The lengths of a record key and of the tip key, for [`encoded_size`](Self::encoded_size).
    key_lengths: (usize, usize),
    state: Mutex<State>,
    /// The idempotency keys its appends were sent with.
    keys: Arc<KeyIndex>,
    /// Set once the journal can no longer append: fenced, indeterminate, or its lease found
    /// lost.
    broken: Broken,
    /// Notified whenever the journal's transaction in flight ends.
    idle: Notify,
}

/// A journal's breaking: a flag, a notification for those who await it, and hooks for those
/// who would otherwise keep a task or a registration per journal waiting for it (a host's
/// session: see [`Writer::on_broken`]). Set once, never cleared.
#[derive(Default)]
struct Broken {
    set: std::sync::atomic::AtomicBool,
    wake: Notify,
    hooks: OnceHooks<()>,
}

impl Broken {
    fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets it: wakes those awaiting it and runs the hooks, the first time only.
    fn set(&self) {
        if !self.set.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.wake.notify_waiters();
            self.hooks.run(());
        }
    }

    async fn wait(&self) {
        loop {
            // Registered first, then the flag is read again: a set in between is seen there,
            // one after it wakes this registration.
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_set() {
                return;
            }
            woken.await;
        }
    }

    /// Runs `hook` once it is set (at once if it is), after the hooks added before it.
    fn on_set(&self, hook: impl FnOnce() + Send + 'static) {
        self.hooks
            .add(|| self.is_set().then_some(()), move |()| hook());
    }
}

struct State {
    next_seq: u64,
    /// The tip's mod_revision, as the last committed append left it (0: no tip).
    tip_mod_revision: i64,
    condition: Condition,
    waiting: VecDeque<Call>,
    in_flight: bool,
    /// Whether the journal is on the store's ready list.
    listed: bool,
}

impl Writer {
    pub(crate) fn new(
        ownership: Ownership,
        namespace: Namespace,
        next_seq: u64,
        tip_mod_revision: i64,
        keys: &Arc<KeyBudget>,
    ) -> Arc<Self> {
        let session = ownership.session_id();
        let key_lengths = (
            namespace.record_key(session, 0).len(),
            namespace.tip_key(session).len(),
        );
        Arc::new(Self {
            ownership,
            namespace,
            key_lengths,
            state: Mutex::new(State {
                next_seq,
                tip_mod_revision,
                condition: Condition::Open,
                waiting: VecDeque::new(),
                in_flight: false,
                listed: false,
            }),
            keys: KeyIndex::new(keys.clone()),
            broken: Broken::default(),
            idle: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The sequence number the next append takes.
    pub(crate) fn next_seq(&self) -> u64 {
        self.state().next_seq
    }

    /// The encoded size the limits are checked against, for an append of these payloads
    /// (`keyed`: made with an idempotency key).
    pub(crate) fn encoded_size<P: AsRef<[u8]>>(&self, payloads: &[P], keyed: bool) -> usize {
        let header = match keyed {
            false => record::RECORD_HEADER,
            true => record::RECORD_HEADER + record::KEYED_PART,
        };
        self.size_of(payloads.iter().map(|p| header + p.as_ref().len()))
    }

    /// The idempotency keys its appends were sent with.
    pub(crate) fn keys(&self) -> &Arc<KeyIndex> {
        &self.keys
    }

    /// The encoded size of an append of records whose values have these lengths.
    fn size_of(&self, value_lens: impl IntoIterator<Item = usize>) -> usize {
        let (key, tip) = self.key_lengths;
        let owner = self.ownership.owner_key().len();
        append_size(key, tip, owner, value_lens, record::TIP_LEN)
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.is_set()
    }

    pub(crate) async fn broken(&self) {
        self.broken.wait().await;
    }

    /// Runs `hook` once, when the journal breaks (at once if it is broken already). It runs
    /// where the breaking is found, under the journal's lock: it must neither block nor take
    /// a lock of the journal's or the store's.
    pub(crate) fn on_broken(&self, hook: impl FnOnce() + Send + 'static) {
        self.broken.on_set(hook);
    }

    /// Waits for the append in flight, if any, then refuses every later one.
    pub(crate) async fn close(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            {
                let mut state = self.state();
                if !state.in_flight {
                    if state.condition == Condition::Open {
                        state.condition = Condition::Closed;
                    }
                    return;
                }
            }
            idle.await;
        }
    }

    fn fenced(&self) -> AppendError {
        AppendError {
            session_id: self.ownership.session_id(),
            epoch: self.ownership.epoch(),
        }
    }

    /// Why the journal refuses to send appends now, if it does: its condition, or its lease
    /// lost or past its deadline (which breaks it: a lease is never valid again once lost).
    fn refusal(&self, condition: Condition) -> Option<JournalWriteError> {
        match condition {
            Condition::Open => {}
            Condition::Fenced => return Some(JournalWriteError::Fenced(self.fenced())),
            Condition::Indeterminate => return Some(JournalWriteError::Indeterminate),
            Condition::Closed => return Some(JournalWriteError::Closed),
        }
        let source = self.ownership.check().err()?;
        self.broken.set();
        Some(JournalWriteError::LeaseLost(JournalLeaseLostError {
            source,
        }))
    }

    /// How many of the waiting calls, from the front, the next append takes (in arrival order,
    /// within the journal's limits; a fence alone), with their records and encoded size. Calls
    /// whose callers went away are withdrawn first. Each call fits alone (checked when it was
    /// made).
    fn coalesce(&self, state: &mut State, limits: &JournalLimits) -> (usize, usize, usize) {
        // Dropped: a key's ticket among them says its call was withdrawn.
        state.waiting.retain(|call| !call.reply.is_closed());
        // The size is the fixed part plus each record's: sum the calls' record parts.
        let fixed = self.size_of([]);
        let (mut calls, mut records, mut size) = (0, 0, fixed);
        for call in &state.waiting {
            let more = call.records.len();
            let bytes = self
                .size_of(call.records.value_lens())
                .saturating_sub(fixed);
            let fits = records + more <= limits.max_records()
                && size.saturating_add(bytes) <= limits.max_bytes();
            let alone = calls > 0 && call.records.is_fence();
            if calls > 0 && (!fits || alone) {
                break;
            }
            (calls, records, size) = (calls + 1, records + more, size.saturating_add(bytes));
        }
        (calls, records, size)
    }

    /// What `sent` means for the append from `first_seq` to `last_seq`, recorded in `state`.
    fn settle(
        &self,
        state: &mut State,
        (first_seq, last_seq): (u64, u64),
        sent: Sent,
    ) -> Result<Appended, JournalWriteError> {
        let (session, epoch) = (self.ownership.session_id(), self.ownership.epoch());
        match sent {
            Sent::Committed { revision, .. } => {
                // `take` checked that the next append's first sequence number fits.
                state.next_seq = last_seq.saturating_add(1);
                state.tip_mod_revision = revision;
                Ok(Appended {
                    first_seq,
                    last_seq,
                    revision,
                })
            }
            Sent::Fenced { .. } => {
                state.condition = Condition::Fenced;
                self.broken.set();
                tracing::warn!(%session, %epoch, "journal fenced");
                Err(JournalWriteError::Fenced(self.fenced()))
            }
            Sent::Unknown(error) => {
                state.condition = Condition::Indeterminate;
                self.broken.set();
                tracing::warn!(%session, %epoch, %error, "append outcome unknown; the journal is indeterminate");
                Err(JournalWriteError::OutcomeUnknown(error))
            }
            Sent::Failed(error) => Err(JournalWriteError::Etcd(error)),
        }
    }

    /// The transaction that carried the journal's append went away unsettled (the store's
    /// runtime shut down under it): the append may still commit, so the journal no longer
    /// knows its tip.
    fn abandon(&self) {
        let mut state = self.state();
        state.in_flight = false;
        state.condition = Condition::Indeterminate;
        self.broken.set();
        for call in state.waiting.drain(..) {
            call.answer(Answer::refused(JournalWriteError::Indeterminate));
        }
        drop(state);
        self.idle.notify_waiters();
    }
}

/// One journal's append in a transaction being formed or sent: its calls, in order.
pub(crate) struct Member {
    writer: Arc<Writer>,
    calls: Vec<Call>,
    records: usize,
    first_seq: u64,
    /// The tip's mod_revision its append compares (for the mutants, which make it anew).
    #[cfg(feature = "testing")]
    tip_mod_revision: i64,
    pub(super) append: AppendTxn,
    /// Whether its journal has learnt what it came to (see [`Drop`]).
    settled: bool,
}

impl Member {
    fn new(writer: Arc<Writer>, calls: Vec<Call>, first_seq: u64, tip_mod_revision: i64) -> Self {
        let records = calls.iter().map(|call| call.records.len()).sum();
        let guard = Some(writer.ownership.guard());
        let append = build(&writer, &calls, first_seq, tip_mod_revision, guard);
        Self {
            writer,
            calls,
            records,
            first_seq,
            #[cfg(feature = "testing")]
            tip_mod_revision,
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

    /// Its journal's namespace.
    #[cfg(feature = "testing")]
    pub(super) fn namespace(&self) -> &Namespace {
        &self.writer.namespace
    }

    /// Makes its append anew, under a new nonce: from `first_seq`, after the tip at
    /// `tip_mod_revision`, with `guard` as the owner compare (`None`: none). Only the test-only
    /// mutants do this.
    #[cfg(feature = "testing")]
    pub(super) fn remake(&mut self, first_seq: u64, tip_mod_revision: i64, guard: Option<Compare>) {
        self.append = build(
            &self.writer,
            &self.calls,
            first_seq,
            tip_mod_revision,
            guard,
        );
        (self.first_seq, self.tip_mod_revision) = (first_seq, tip_mod_revision);
    }

    /// Where its append starts, and the tip's mod_revision it compares.
    #[cfg(feature = "testing")]
    pub(super) fn place(&self) -> (u64, i64) {
        (self.first_seq, self.tip_mod_revision)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if !self.settled {
            self.writer.abandon();
        }
    }
}

/// The append transaction of `calls`' records, in order, from `first_seq` under a fresh
/// nonce. `take` checked that the last sequence number fits.
fn build(
    writer: &Writer,
    calls: &[Call],
    first_seq: u64,
    tip_mod_revision: i64,
    guard: Option<Compare>,
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
    /// The protocol as written, unless a test turned a broken variant on.
    #[cfg(feature = "testing")]
    pub(crate) hook: Option<Box<dyn Hook>>,
}

/// What sends a transaction in place of the protocol: the test-only protocol mutants
/// (feature `testing`), one hook.
#[cfg(feature = "testing")]
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
    #[cfg(feature = "testing")]
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
            #[cfg(feature = "testing")]
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
            if state.in_flight || state.listed {
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
        if state.in_flight || state.listed {
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
        #[cfg(feature = "testing")]
        if let Some(hook) = &self.hook {
            return hook.send(self, members).await;
        }
        self.commit(members).await
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .expect("the queue's locks are never held across a panic")
}

#[cfg(test)]
mod tests;
