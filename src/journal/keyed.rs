//! What a journal knows of the idempotency keys appended under its epoch.
//!
//! One journal per lease, and only its queue writes records of its epoch: so the keys of the
//! appends it has sent are every key its epoch's records can hold. A key it has not sent is
//! certainly not in the journal under this epoch, and is appended at once, with no read. A
//! key it has sent is never appended again: a second call with it waits for the first call's
//! answer if that is still to come, or learns from the journal's own records where the first
//! call committed (see `Journal::append_with_key`). Memory holds where an append committed,
//! not what it was told: the journal's records decide that answer.
//!
//! Each key of an open journal takes one place of the store's budget
//! ([`JournalLimits::max_keys`](super::JournalLimits::max_keys)); a place is given back when
//! its append certainly did not apply, and all of a journal's when it is dropped.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash as _, Hasher as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::key::IdempotencyKey;
use super::{Appended, JournalWriteError};

/// The store's places for the keys of its open journals.
#[derive(Debug)]
pub(crate) struct KeyBudget {
    used: AtomicUsize,
    max: usize,
}

impl KeyBudget {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes a place, if one is free.
    fn take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.max).then_some(used + 1)
            })
            .is_ok()
    }

    fn give_back(&self, places: usize) {
        self.used.fetch_sub(places, Ordering::AcqRel);
    }

    /// How many places are taken.
    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// What became of the first call of a key that later calls wait for.
#[derive(Clone, Debug)]
pub(crate) enum Settled {
    /// What the first call was told.
    Answered(Result<Appended, JournalWriteError>),
    /// Its caller went away before a transaction took it: nothing was sent. A waiting call
    /// becomes the first.
    Withdrawn,
}

/// A key's call waiting or in flight.
struct Pending {
    /// The digest of its records: a call with the key and other records is refused.
    digest: u64,
    settled: watch::Sender<Option<Settled>>,
}

#[derive(Default)]
struct Keys {
    /// Every key committed under the epoch, and its append's first sequence number.
    committed: HashMap<IdempotencyKey, u64, foldhash::fast::RandomState>,
    /// Keys whose call is waiting for a transaction or in one.
    pending: HashMap<IdempotencyKey, Pending>,
    /// Keys whose transaction's outcome stayed unknown (the journal is then indeterminate).
    unknown: HashSet<IdempotencyKey>,
}

impl Keys {
    fn len(&self) -> usize {
        self.committed.len() + self.pending.len() + self.unknown.len()
    }
}

/// The keys of one journal (see the module docs).
pub(crate) struct KeyIndex {
    keys: Mutex<Keys>,
    budget: Arc<KeyBudget>,
}

/// What [`KeyIndex::begin_answer`] found for a call that only asks.
pub(crate) enum Answering {
    /// No append with the key was made under this epoch (yet).
    Nothing,
    /// As [`Begun`]'s.
    Wait(watch::Receiver<Option<Settled>>),
    Committed(u64),
    Unknown,
    Reused,
}

/// What [`KeyIndex::begin`] found for a call.
pub(crate) enum Begun {
    /// A key not sent under this epoch: the call sends it, holding this ticket.
    First(Ticket),
    /// The key's first call is waiting or in flight: wait for what it comes to.
    Wait(watch::Receiver<Option<Settled>>),
    /// The key's append committed, from this sequence number: the journal's records say
    /// where, and whether they are this call's.
    Committed(u64),
    /// The key's transaction's outcome stayed unknown.
    Unknown,
    /// The key's call in flight has other records.
    Reused,
    /// The store's budget of keys is spent.
    Exhausted { max: usize },
}

impl KeyIndex {
    pub(crate) fn new(budget: Arc<KeyBudget>) -> Arc<Self> {
        Arc::new(Self {
            keys: Mutex::new(Keys::default()),
            budget,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Keys> {
        crate::sync::lock(&self.keys)
    }

    /// Looks `key` up for a call of records whose digest is `digest` (see [`digest`]), and
    /// registers the call as the key's first if it is new.
    pub(crate) fn begin(self: &Arc<Self>, key: IdempotencyKey, digest: u64) -> Begun {
        let mut keys = self.lock();
        if let Some(&first_seq) = keys.committed.get(&key) {
            return Begun::Committed(first_seq);
        }
        if keys.unknown.contains(&key) {
            return Begun::Unknown;
        }
        if let Some(pending) = keys.pending.get(&key) {
            if pending.digest != digest {
                return Begun::Reused;
            }
            return Begun::Wait(pending.settled.subscribe());
        }
        if !self.budget.take() {
            return Begun::Exhausted {
                max: self.budget.max,
            };
        }
        let (settled, _) = watch::channel(None);
        keys.pending.insert(key, Pending { digest, settled });
        Begun::First(Ticket {
            index: self.clone(),
            key,
            sent: false,
            done: false,
        })
    }

    /// Looks `key` up for a call of records whose digest is `digest` that only asks what
    /// became of it, and appends nothing.
    pub(crate) fn begin_answer(&self, key: IdempotencyKey, digest: u64) -> Answering {
        let keys = self.lock();
        if let Some(&first_seq) = keys.committed.get(&key) {
            return Answering::Committed(first_seq);
        }
        if keys.unknown.contains(&key) {
            return Answering::Unknown;
        }
        match keys.pending.get(&key) {
            Some(pending) if pending.digest != digest => Answering::Reused,
            Some(pending) => Answering::Wait(pending.settled.subscribe()),
            None => Answering::Nothing,
        }
    }

    /// Records what `key`'s first call came to (`sent`: whether a transaction took it), and
    /// tells the calls waiting for it.
    fn settle(
        &self,
        key: IdempotencyKey,
        sent: bool,
        result: Option<&Result<Appended, JournalWriteError>>,
    ) {
        let mut keys = self.lock();
        let Some(pending) = keys.pending.remove(&key) else {
            return;
        };
        let settled = match result {
            Some(Ok(appended)) => {
                keys.committed.insert(key, appended.first_seq);
                Settled::Answered(Ok(*appended))
            }
            Some(Err(error @ JournalWriteError::OutcomeUnknown(_))) => {
                keys.unknown.insert(key);
                Settled::Answered(Err(error.clone()))
            }
            // Refused before sending, or sent and certainly not applied (fenced, or failed
            // by etcd): the key is free again.
            Some(Err(error)) => {
                self.budget.give_back(1);
                Settled::Answered(Err(error.clone()))
            }
            // Dropped with its transaction, which may yet apply.
            None if sent => {
                keys.unknown.insert(key);
                Settled::Answered(Err(JournalWriteError::Indeterminate))
            }
            None => {
                self.budget.give_back(1);
                Settled::Withdrawn
            }
        };
        drop(keys);
        pending.settled.send_replace(Some(settled));
    }

    /// How many keys it holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for KeyIndex {
    fn drop(&mut self) {
        let held = self.keys.get_mut().map_or(0, |keys| keys.len());
        self.budget.give_back(held);
    }
}

/// A key's first call, held by the call until it is answered: it records the answer in the
/// journal's keys. Dropped unanswered, it records that the call was withdrawn (never sent) or
/// that its transaction went away unsettled (sent: it may yet apply).
pub(crate) struct Ticket {
    index: Arc<KeyIndex>,
    key: IdempotencyKey,
    sent: bool,
    done: bool,
}

impl Ticket {
    /// The key it is the first call of.
    pub(crate) fn key(&self) -> IdempotencyKey {
        self.key
    }

    /// A transaction took its call.
    pub(crate) fn sent(&mut self) {
        self.sent = true;
    }

    /// Its call was answered `result`.
    pub(crate) fn answer(mut self, result: &Result<Appended, JournalWriteError>) {
        self.done = true;
        self.index.settle(self.key, self.sent, Some(result));
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.index.settle(self.key, self.sent, None);
        }
    }
}

/// A digest of an append's records, to tell a call with a key in flight from another call
/// reusing it for other records (the journal's records decide the rest).
pub(crate) fn digest<P: AsRef<[u8]>>(payloads: &[P]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    payloads.len().hash(&mut hasher);
    for payload in payloads {
        payload.as_ref().hash(&mut hasher);
    }
    hasher.finish()
}

/// Waits for what a key's first call came to.
pub(crate) async fn settled(mut receiver: watch::Receiver<Option<Settled>>) -> Settled {
    match receiver.wait_for(Option::is_some).await {
        Ok(settled) => settled.clone().expect("waited for"),
        // The index went with its journal while the call was under way: nothing more will
        // be said of it.
        Err(_) => Settled::Answered(Err(JournalWriteError::Indeterminate)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::EtcdError;

    fn key(id: &str) -> IdempotencyKey {
        IdempotencyKey::new(id)
    }

    fn appended(first_seq: u64) -> Result<Appended, JournalWriteError> {
        Ok(Appended {
            first_seq,
            last_seq: first_seq,
            revision: 7,
        })
    }

    fn first(index: &Arc<KeyIndex>, id: &str) -> Ticket {
        match index.begin(key(id), 1) {
            Begun::First(ticket) => ticket,
            _ => panic!("{id} is new"),
        }
    }

    #[tokio::test]
    async fn a_second_call_waits_for_the_first_and_later_ones_find_where_it_committed() {
        let index = KeyIndex::new(KeyBudget::new(10));
        let ticket = first(&index, "a");
        let Begun::Wait(waiting) = index.begin(key("a"), 1) else {
            panic!("the first is in flight")
        };
        assert!(matches!(index.begin(key("a"), 2), Begun::Reused));
        ticket.answer(&appended(4));
        let Settled::Answered(Ok(told)) = settled(waiting).await else {
            panic!("the first call's answer")
        };
        assert_eq!(told.first_seq, 4);
        assert!(matches!(index.begin(key("a"), 1), Begun::Committed(4)));
        // Another digest too: the journal's records say whether they are the call's.
        assert!(matches!(index.begin(key("a"), 2), Begun::Committed(4)));
        assert!(matches!(
            index.begin_answer(key("a"), 1),
            Answering::Committed(4)
        ));
        assert!(matches!(
            index.begin_answer(key("b"), 1),
            Answering::Nothing
        ));
    }

    #[tokio::test]
    async fn a_key_that_certainly_did_not_apply_is_free_again() {
        let budget = KeyBudget::new(10);
        let index = KeyIndex::new(budget.clone());
        let failed = Err(JournalWriteError::Etcd(EtcdError::no_space("append")));
        let ticket = first(&index, "a");
        let Begun::Wait(waiting) = index.begin(key("a"), 1) else {
            panic!()
        };
        ticket.answer(&failed);
        assert!(matches!(
            settled(waiting).await,
            Settled::Answered(Err(JournalWriteError::Etcd(_)))
        ));
        assert_eq!(budget.used(), 0);
        // Withdrawn before a transaction took it: the waiting call becomes the first.
        let ticket = first(&index, "a");
        let Begun::Wait(waiting) = index.begin(key("a"), 1) else {
            panic!()
        };
        drop(ticket);
        assert!(matches!(settled(waiting).await, Settled::Withdrawn));
        assert!(matches!(index.begin(key("a"), 1), Begun::First(_)));
    }

    #[tokio::test]
    async fn a_key_whose_transaction_may_yet_apply_is_never_sent_again() {
        let index = KeyIndex::new(KeyBudget::new(10));
        let mut ticket = first(&index, "a");
        ticket.sent();
        drop(ticket);
        assert!(matches!(index.begin(key("a"), 1), Begun::Unknown));
        let unknown = EtcdError::timed_out("append", "e", std::time::Duration::from_secs(1));
        let ticket = first(&index, "b");
        ticket.answer(&Err(JournalWriteError::OutcomeUnknown(unknown)));
        assert!(matches!(index.begin(key("b"), 1), Begun::Unknown));
    }

    #[test]
    fn the_stores_budget_bounds_the_keys_of_its_journals_until_they_go() {
        let budget = KeyBudget::new(3);
        let one = KeyIndex::new(budget.clone());
        let two = KeyIndex::new(budget.clone());
        first(&one, "a").answer(&appended(1));
        first(&one, "b").answer(&appended(2));
        let _in_flight = first(&two, "c");
        assert!(matches!(
            two.begin(key("d"), 1),
            Begun::Exhausted { max: 3 }
        ));
        // A key already known is still answered.
        assert!(matches!(one.begin(key("a"), 1), Begun::Committed(1)));
        assert_eq!((one.len(), budget.used()), (2, 3));
        drop(one);
        assert_eq!(budget.used(), 1);
        assert!(matches!(two.begin(key("d"), 1), Begun::First(_)));
    }

    #[test]
    fn the_digest_tells_records_apart() {
        assert_eq!(
            digest(&[b"a", b"b"]),
            digest(&[b"a".to_vec(), b"b".to_vec()])
        );
        assert_ne!(
            digest(&[b"ab".as_slice()]),
            digest(&[b"a".as_slice(), b"b"])
        );
        assert_ne!(digest(&[b"a"]), digest(&[b"b"]));
    }
}
