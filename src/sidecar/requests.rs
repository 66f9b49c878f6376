//! Exactly-once appends by request id: what a session's appends under one epoch came to, for
//! the last [`REMEMBERED`] request ids.
//!
//! A call with a request id the epoch has seen is the first call's retry: it waits for the
//! first call if that is still in flight, then answers what it came to. An outcome left
//! unknown is settled by reading the record at the call's place in etcd. After a refusal that
//! certainly appended nothing and may go through later (etcd unavailable), the next call with
//! the id is sent anew, and takes the entry over: a copy of an earlier call that arrives late
//! (held up on the way) finds it, and is answered, never appended. A request id older than the
//! last [`REMEMBERED`] is forgotten: its retry is appended again.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash as _, Hasher as _};
use std::sync::Mutex;

use tokio::sync::watch;

use super::proto::AppendResponse;
use super::refusal::Refusal;

/// How many request ids of one session and epoch are remembered.
pub const REMEMBERED: usize = 1_000;

/// What an append came to, as remembered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    Appended(AppendResponse),
    /// Maybe committed, at these sequence numbers (first, last); settled by reading etcd.
    Unknown {
        first_seq: u64,
        last_seq: u64,
    },
    Refused(Refusal),
}

/// A request id's entry: a digest of its records (a reuse for other records is refused) and
/// its outcome, `None` while the first call is in flight.
struct Entry {
    digest: u64,
    outcome: watch::Receiver<Option<Outcome>>,
}

/// The remembered request ids of one session and epoch.
#[derive(Default)]
pub(crate) struct Requests {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    order: VecDeque<String>,
    entries: HashMap<String, Entry>,
}

/// What [`Requests::begin`] found.
pub(crate) enum Begun {
    /// A new request id: the caller appends, then [`Requests::finish`]es with this sender.
    First(watch::Sender<Option<Outcome>>),
    /// A retry: wait for the first call's outcome here.
    Retry(watch::Receiver<Option<Outcome>>),
    /// The id was used for other records.
    Reused,
}

impl Requests {
    /// Looks `request_id` up for a call with records of `digest`, and registers it if new.
    pub(crate) fn begin(&self, request_id: &str, digest: u64) -> Begun {
        let mut inner = self.lock();
        if let Some(entry) = inner.entries.get_mut(request_id) {
            if entry.digest != digest {
                return Begun::Reused;
            }
            let refused_unapplied = matches!(
                &*entry.outcome.borrow(),
                Some(Outcome::Refused(refusal)) if refusal.retry_sends_again()
            );
            if !refused_unapplied {
                return Begun::Retry(entry.outcome.clone());
            }
            // Sent anew, under the same entry.
            let (sender, outcome) = watch::channel(None);
            entry.outcome = outcome;
            return Begun::First(sender);
        }
        let (sender, outcome) = watch::channel(None);
        inner
            .entries
            .insert(request_id.to_owned(), Entry { digest, outcome });
        inner.order.push_back(request_id.to_owned());
        while inner.order.len() > REMEMBERED {
            if let Some(oldest) = inner.order.pop_front() {
                inner.entries.remove(&oldest);
            }
        }
        Begun::First(sender)
    }

    /// Records what the call of `request_id` came to, and answers its retries waiting.
    pub(crate) fn finish(&self, sender: &watch::Sender<Option<Outcome>>, outcome: Outcome) {
        sender.send_replace(Some(outcome));
    }

    /// Replaces an unknown outcome with what settling it found (when final).
    pub(crate) fn settled(&self, request_id: &str, outcome: Outcome) {
        if let Some(entry) = self.lock().entries.get_mut(request_id) {
            // The first call's sender is gone: a fresh channel holds the settled outcome.
            entry.outcome = watch::channel(Some(outcome)).1;
        }
    }

    /// How many request ids are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A digest of an append's records: a request id reused for other records is refused.
pub(crate) fn digest(payloads: &[Vec<u8>]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    payloads.hash(&mut hasher);
    hasher.finish()
}

/// Waits for the first call's outcome.
pub(crate) async fn outcome_of(mut receiver: watch::Receiver<Option<Outcome>>) -> Option<Outcome> {
    let seen = receiver.wait_for(Option::is_some).await.ok()?;
    seen.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appended(seq: u64) -> Outcome {
        Outcome::Appended(AppendResponse {
            first_seq: seq,
            last_seq: seq,
            revision: 7,
        })
    }

    #[tokio::test]
    async fn a_retry_answers_what_the_first_call_came_to_even_while_it_is_in_flight() {
        let requests = Requests::default();
        let Begun::First(sender) = requests.begin("a", 1) else {
            panic!("a new id is a first call")
        };
        let Begun::Retry(waiting) = requests.begin("a", 1) else {
            panic!("the same id is a retry")
        };
        let retry = tokio::spawn(outcome_of(waiting));
        requests.finish(&sender, appended(3));
        assert_eq!(retry.await.unwrap(), Some(appended(3)));
        let Begun::Retry(later) = requests.begin("a", 1) else {
            panic!("still remembered")
        };
        assert_eq!(outcome_of(later).await, Some(appended(3)));
    }

    #[test]
    fn an_id_reused_for_other_records_is_refused() {
        let requests = Requests::default();
        assert!(matches!(requests.begin("a", 1), Begun::First(_)));
        assert!(matches!(requests.begin("a", 2), Begun::Reused));
    }

    #[test]
    fn after_a_refusal_that_appended_nothing_the_retry_is_sent_again_and_a_late_copy_waits_for_it()
    {
        let requests = Requests::default();
        let Begun::First(sender) = requests.begin("a", 1) else {
            panic!()
        };
        let unavailable = Refusal::etcd(&crate::etcd::EtcdError::no_space("append"));
        assert!(unavailable.retry_sends_again());
        requests.finish(&sender, Outcome::Refused(unavailable));
        let Begun::First(again) = requests.begin("a", 1) else {
            panic!("the retry is sent anew")
        };
        // A copy of the first call, held up on the way, arrives while the retry is in flight:
        // it waits for the retry's outcome, and is never sent.
        let Begun::Retry(late) = requests.begin("a", 1) else {
            panic!("a late copy is a retry")
        };
        requests.finish(&again, appended(9));
        assert_eq!(late.borrow().clone(), Some(appended(9)));
        assert!(matches!(requests.begin("a", 1), Begun::Retry(_)));
        // A fenced call is remembered: its retry is answered the same, and sends nothing.
        let Begun::First(sender) = requests.begin("b", 1) else {
            panic!()
        };
        let fenced = Refusal::fenced(uuid::Uuid::nil(), crate::lease::Epoch(3), None);
        requests.finish(&sender, Outcome::Refused(fenced.clone()));
        let Begun::Retry(outcome) = requests.begin("b", 1) else {
            panic!()
        };
        assert_eq!(outcome.borrow().clone(), Some(Outcome::Refused(fenced)));
    }

    #[test]
    fn the_last_thousand_ids_are_remembered_and_older_ones_forgotten() {
        let requests = Requests::default();
        for i in 0..REMEMBERED + 10 {
            let Begun::First(sender) = requests.begin(&i.to_string(), 1) else {
                panic!()
            };
            requests.finish(&sender, appended(i as u64));
        }
        assert_eq!(requests.len(), REMEMBERED);
        assert!(matches!(requests.begin("10", 1), Begun::Retry(_)));
        assert!(matches!(requests.begin("9", 1), Begun::First(_)));
    }

    #[test]
    fn a_settled_outcome_replaces_the_unknown_one() {
        let requests = Requests::default();
        let Begun::First(sender) = requests.begin("a", 1) else {
            panic!()
        };
        requests.finish(
            &sender,
            Outcome::Unknown {
                first_seq: 4,
                last_seq: 4,
            },
        );
        drop(sender);
        requests.settled("a", appended(4));
        let Begun::Retry(outcome) = requests.begin("a", 1) else {
            panic!()
        };
        assert_eq!(outcome.borrow().clone(), Some(appended(4)));
    }
}
