//! A journal's side of the store's queue: where it stands (its next sequence number, its tip,
//! whether it is fenced, indeterminate or closed), its calls waiting, and its breaking.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::call::{Answer, Call};
use super::lock;
use crate::hooks::OnceHooks;
use crate::journal::cas::{Sent, append_size};
use crate::journal::keyed::{KeyBudget, KeyIndex};
use crate::journal::record;
use crate::journal::{
    AppendError, Appended, JournalLeaseLostError, JournalLimits, JournalWriteError,
};
use crate::keys::Namespace;
use crate::lease::Ownership;

/// Where a joining call found its journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Joined {
    /// Listed as ready by this call: the caller pumps.
    Listed,
    /// Listed or in flight already: whoever listed it, or its transaction's task, pumps.
    Behind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Condition {
    Open,
    Fenced,
    Indeterminate,
    Closed,
}

/// A journal's side of the store's queue: where it stands, and its calls waiting.
pub(crate) struct Writer {
    pub(super) ownership: Ownership,
    pub(super) namespace: Namespace,
    /// The lengths of a record key and of the tip key, for [`encoded_size`](Self::encoded_size).
    key_lengths: (usize, usize),
    pub(super) state: Mutex<State>,
    /// The idempotency keys its appends were sent with.
    keys: Arc<KeyIndex>,
    /// Set once the journal can no longer append: fenced, indeterminate, or its lease found
    /// lost.
    broken: Broken,
    /// Notified whenever the journal's transaction in flight ends.
    pub(super) idle: Notify,
}

/// A journal's breaking: a flag, a notification for those who await it, and hooks for those
/// who would otherwise keep a task or a registration per journal waiting for it (a host's
/// session: see [`Writer::on_broken`]). Set once, never cleared.
#[derive(Default)]
pub(super) struct Broken {
    set: std::sync::atomic::AtomicBool,
    wake: Notify,
    hooks: OnceHooks<()>,
}

impl Broken {
    pub(super) fn is_set(&self) -> bool {
        self.set.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets it: wakes those awaiting it and runs the hooks, the first time only.
    pub(super) fn set(&self) {
        if !self.set.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.wake.notify_waiters();
            self.hooks.run(());
        }
    }

    pub(super) async fn wait(&self) {
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
    pub(super) fn on_set(&self, hook: impl FnOnce() + Send + 'static) {
        self.hooks
            .add(|| self.is_set().then_some(()), move |()| hook());
    }
}

pub(super) struct State {
    pub(super) next_seq: u64,
    /// The tip's mod_revision, as the last committed append left it (0: no tip).
    pub(super) tip_mod_revision: i64,
    pub(super) condition: Condition,
    pub(super) waiting: VecDeque<Call>,
    pub(super) in_flight: bool,
    /// Whether the journal is on the store's ready list.
    pub(super) listed: bool,
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

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
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
    pub(super) fn size_of(&self, value_lens: impl IntoIterator<Item = usize>) -> usize {
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

    pub(super) fn fenced(&self) -> AppendError {
        AppendError {
            session_id: self.ownership.session_id(),
            epoch: self.ownership.epoch(),
        }
    }

    /// Why the journal refuses to send appends now, if it does: its condition, or its lease
    /// lost or past its deadline (which breaks it: a lease is never valid again once lost).
    pub(super) fn refusal(&self, condition: Condition) -> Option<JournalWriteError> {
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
    pub(super) fn coalesce(
        &self,
        state: &mut State,
        limits: &JournalLimits,
    ) -> (usize, usize, usize) {
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
    pub(super) fn settle(
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
    pub(super) fn abandon(&self) {
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
