//! What the campaign saw: every append call and its result, every lease change, every fault.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold::testing::{AppendHistory, Invocation};
use leasehold::{Appended, Epoch, IdempotencyKey, JournalWriteError, Uuid};
use tokio::time::Instant;

/// One lease state change or fault, with when it happened (the campaign's clock: one
/// process, one monotonic clock for every node).
#[derive(Clone, Debug)]
// Some fields are read only through `Debug`, in the printed slices of history.
#[allow(dead_code)]
pub(crate) enum Entry {
    /// A node opened a session's rig at an epoch (its fence committed).
    Acquired {
        at: Instant,
        node: usize,
        session: Uuid,
        epoch: Epoch,
    },
    /// A node's work on a session ended (the host gave it up).
    Ended {
        at: Instant,
        node: usize,
        session: Uuid,
        epoch: Epoch,
    },
    /// The owner key at `epoch` was deleted from outside at `revision`.
    Revoked {
        at: Instant,
        session: Uuid,
        epoch: Epoch,
        revision: i64,
    },
    /// A fault began (`healed: false`) or healed.
    Fault {
        at: Instant,
        what: String,
        healed: bool,
    },
}

impl Entry {
    pub(crate) fn at(&self) -> Instant {
        match self {
            Entry::Acquired { at, .. }
            | Entry::Ended { at, .. }
            | Entry::Revoked { at, .. }
            | Entry::Fault { at, .. } => *at,
        }
    }

    pub(crate) fn session(&self) -> Option<Uuid> {
        match self {
            Entry::Acquired { session, .. }
            | Entry::Ended { session, .. }
            | Entry::Revoked { session, .. } => Some(*session),
            Entry::Fault { .. } => None,
        }
    }
}

/// A sidecar call's request id, and the sequence numbers it was told if acknowledged.
pub(crate) type Requested = (IdempotencyKey, Option<(u64, u64)>);

/// The shared record of the run, written by every node's tasks and by the fault scheduler.
#[derive(Default)]
pub(crate) struct History {
    start: Mutex<Option<Instant>>,
    /// Each session's append calls, across all its owners.
    appends: Mutex<HashMap<Uuid, Arc<Mutex<AppendHistory>>>>,
    entries: Mutex<Vec<Entry>>,
    /// The last time each (session, epoch) was seen valid by its owner, just before an append.
    valid_seen: Mutex<HashMap<(Uuid, Epoch), (usize, Instant)>>,
    /// The invocation time of each session's latest acknowledged append.
    progress: Mutex<HashMap<Uuid, Instant>>,
    next_payload: AtomicU64,
    pub(crate) calls_ok: AtomicU64,
    pub(crate) calls_unknown: AtomicU64,
    pub(crate) calls_failed: AtomicU64,
    /// Acknowledged appends made through a sidecar.
    pub(crate) sidecar_ok: AtomicU64,
    /// Each session's sidecar calls: the request id's key, and the sequence numbers the call
    /// was told if it was acknowledged.
    requests: Mutex<HashMap<Uuid, Vec<Requested>>>,
    /// Sidecar calls answered only by a retry with their request id: acknowledged, or refused
    /// (not in the journal, and never will be).
    pub(crate) retried_ok: AtomicU64,
    pub(crate) retried_refused: AtomicU64,
    /// Acknowledged sidecar calls sent again with their request id, and answered.
    pub(crate) repeated: AtomicU64,
    /// `Validate` answers that called an epoch current, and those of them asked after the
    /// epoch's ownership ended.
    pub(crate) validated: AtomicU64,
    pub(crate) validated_late: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl History {
    pub(crate) fn new() -> Arc<Self> {
        let history = Arc::new(Self::default());
        *lock(&history.start) = Some(Instant::now());
        history
    }

    /// Seconds since the run started, for log lines.
    pub(crate) fn secs(&self, at: Instant) -> f64 {
        let start = lock(&self.start).expect("set at creation");
        at.saturating_duration_since(start).as_secs_f64()
    }

    pub(crate) fn note(&self, entry: Entry) {
        lock(&self.entries).push(entry);
    }

    pub(crate) fn entries(&self) -> Vec<Entry> {
        lock(&self.entries).clone()
    }

    pub(crate) fn appends_of(&self, session: Uuid) -> Arc<Mutex<AppendHistory>> {
        lock(&self.appends).entry(session).or_default().clone()
    }

    /// A payload no other append of the run carries.
    pub(crate) fn payload(&self, session: Uuid, node: usize) -> Vec<u8> {
        let n = self.next_payload.fetch_add(1, Ordering::Relaxed);
        format!("{}/n{node}/{n}", &session.to_string()[..8]).into_bytes()
    }

    pub(crate) fn seen_valid(&self, session: Uuid, epoch: Epoch, node: usize) {
        self.seen_valid_at(session, epoch, node, Instant::now());
    }

    /// Notes that `node` saw `session` valid at `epoch` at `at`; the latest sighting is kept.
    pub(crate) fn seen_valid_at(&self, session: Uuid, epoch: Epoch, node: usize, at: Instant) {
        let mut seen = lock(&self.valid_seen);
        let latest = seen.entry((session, epoch)).or_insert((node, at));
        if at >= latest.1 {
            *latest = (node, at);
        }
    }

    pub(crate) fn valid_seen(&self) -> HashMap<(Uuid, Epoch), (usize, Instant)> {
        lock(&self.valid_seen).clone()
    }

    pub(crate) fn progress(&self) -> HashMap<Uuid, Instant> {
        lock(&self.progress).clone()
    }

    /// Notes a sidecar call of `session` with request id `key`, and what it was told:
    /// acknowledged at `told`, or not (refused, or its outcome never learnt).
    pub(crate) fn requested(&self, session: Uuid, key: IdempotencyKey, told: Option<(u64, u64)>) {
        lock(&self.requests)
            .entry(session)
            .or_default()
            .push((key, told));
    }

    /// How many request ids the sidecar clients used, and how many of them were acknowledged.
    pub(crate) fn request_counts(&self) -> (usize, usize) {
        let requests = lock(&self.requests);
        let calls = requests.values().flatten();
        let ids: std::collections::HashSet<_> = calls.clone().map(|(key, _)| key).collect();
        let acknowledged: std::collections::HashSet<_> = calls
            .filter(|(_, told)| told.is_some())
            .map(|(key, _)| key)
            .collect();
        (ids.len(), acknowledged.len())
    }

    /// `session`'s sidecar calls (see [`requested`](Self::requested)).
    pub(crate) fn requests_of(&self, session: Uuid) -> Vec<Requested> {
        lock(&self.requests)
            .get(&session)
            .cloned()
            .unwrap_or_default()
    }

    /// Starts an append call; finish it with [`Call::done`]. A call dropped before it is done
    /// (its task aborted mid-send) is recorded with an unknown outcome.
    pub(crate) fn call(self: &Arc<Self>, session: Uuid, payloads: Vec<Vec<u8>>) -> Call {
        let appends = self.appends_of(session);
        let invocation = lock(&appends).invoke();
        Call {
            history: self.clone(),
            appends,
            session,
            payloads,
            invoked: Instant::now(),
            invocation: Some(invocation),
        }
    }

    /// Handovers: acquisitions after each session's first.
    /// How many times each node acquired a session.
    pub(crate) fn acquisitions_by_node(&self) -> BTreeMap<usize, u64> {
        let mut by_node = BTreeMap::new();
        for entry in lock(&self.entries).iter() {
            if let Entry::Acquired { node, .. } = entry {
                *by_node.entry(*node).or_default() += 1;
            }
        }
        by_node
    }

    pub(crate) fn handovers(&self) -> u64 {
        let mut per_session: BTreeMap<Uuid, u64> = BTreeMap::new();
        for entry in lock(&self.entries).iter() {
            if let Entry::Acquired { session, .. } = entry {
                *per_session.entry(*session).or_default() += 1;
            }
        }
        per_session.values().map(|n| n.saturating_sub(1)).sum()
    }
}

/// An append call in flight.
pub(crate) struct Call {
    history: Arc<History>,
    appends: Arc<Mutex<AppendHistory>>,
    session: Uuid,
    pub(crate) payloads: Vec<Vec<u8>>,
    invoked: Instant,
    invocation: Option<Invocation>,
}

impl Call {
    /// The call never learnt its outcome.
    pub(crate) fn unknown(mut self) {
        let invocation = self.invocation.take().expect("done once");
        lock(&self.appends).complete_unknown(invocation, &self.payloads);
        self.history.calls_unknown.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn done(mut self, result: &Result<Appended, JournalWriteError>) {
        let invocation = self.invocation.take().expect("done once");
        lock(&self.appends).complete(invocation, &self.payloads, result);
        let counter = match result {
            Ok(_) => {
                let mut progress = lock(&self.history.progress);
                let latest = progress.entry(self.session).or_insert(self.invoked);
                *latest = (*latest).max(self.invoked);
                &self.history.calls_ok
            }
            Err(JournalWriteError::OutcomeUnknown(_)) => &self.history.calls_unknown,
            Err(_) => &self.history.calls_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.invocation.take().is_some() {
            lock(&self.appends).record_unknown(&self.payloads);
            self.history.calls_unknown.fetch_add(1, Ordering::Relaxed);
        }
    }
}
