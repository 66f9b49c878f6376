//! Checks a journal against the safety invariants, given what its writers were told.

use std::collections::HashMap;

use uuid::Uuid;

pub use crate::journal::Violation;
use crate::journal::{Appended, JournalWriteError};
use crate::lease::Epoch;
use crate::store::Store;

/// What one append call came to, as its writer was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Told {
    Acknowledged,
    Unknown,
    Failed,
}

/// What the writers of a journal were told about each append call, and when: the order of
/// calls and results. Payloads must be unique across the history (the checker finds appends by
/// them).
///
/// A writer that appends one call at a time records each call when its result arrives
/// ([`record`](Self::record)). Concurrent callers of one journal note each call before it
/// starts ([`invoke`](Self::invoke)) and record it with that stamp
/// ([`complete`](Self::complete)), e.g. through a shared `Mutex<AppendHistory>`. The checker
/// then expects an acknowledged append before every append of the same epoch that started
/// after it was acknowledged (real-time order); calls that overlapped may be in either order.
#[derive(Clone, Debug, Default)]
pub struct AppendHistory {
    calls: Vec<Call>,
    /// Ticks once per invocation and per result.
    clock: u64,
}

#[derive(Clone, Debug)]
struct Call {
    payloads: Vec<Vec<u8>>,
    told: Told,
    /// The sequence numbers an acknowledged call was told.
    seqs: Option<(u64, u64)>,
    invoked: u64,
    completed: u64,
}

/// When an append call started, on its history's clock; see [`AppendHistory::invoke`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "record the call's result with AppendHistory::complete"]
pub struct Invocation(u64);

fn told(result: &Result<Appended, JournalWriteError>) -> Told {
    match result {
        Ok(_) => Told::Acknowledged,
        Err(JournalWriteError::OutcomeUnknown(_)) => Told::Unknown,
        Err(_) => Told::Failed,
    }
}

impl AppendHistory {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn push<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        result: Option<&Result<Appended, JournalWriteError>>,
        invoked: u64,
    ) {
        let completed = self.tick();
        let payloads = payloads.iter().map(|p| p.as_ref().to_vec()).collect();
        self.calls.push(Call {
            payloads,
            told: result.map_or(Told::Unknown, told),
            seqs: result.and_then(|result| {
                let appended = result.as_ref().ok()?;
                Some((appended.first_seq, appended.last_seq))
            }),
            invoked,
            completed,
        });
    }

    /// Records the result of appending `payloads` in one call, made by a writer that makes
    /// one call at a time: the call started after every result recorded before it.
    pub fn record<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        result: &Result<Appended, JournalWriteError>,
    ) {
        let invoked = self.tick();
        self.push(payloads, Some(result), invoked);
    }

    /// Notes that an append call starts now; record its result with
    /// [`complete`](Self::complete).
    pub fn invoke(&mut self) -> Invocation {
        Invocation(self.tick())
    }

    /// Records the result of a call noted by [`invoke`](Self::invoke).
    pub fn complete<P: AsRef<[u8]>>(
        &mut self,
        invocation: Invocation,
        payloads: &[P],
        result: &Result<Appended, JournalWriteError>,
    ) {
        self.push(payloads, Some(result), invocation.0);
    }

    /// Records that a call noted by [`invoke`](Self::invoke) never learnt its outcome (a
    /// client that gave up retrying it).
    pub fn complete_unknown<P: AsRef<[u8]>>(&mut self, invocation: Invocation, payloads: &[P]) {
        self.push(payloads, None, invocation.0);
    }

    /// Appends another writer's history to this one (e.g. the old owner's, then the new
    /// one's): its calls count as started after every result recorded here.
    pub fn merge(&mut self, other: &AppendHistory) {
        let offset = self.clock;
        self.calls.extend(other.calls.iter().map(|call| Call {
            invoked: call.invoked + offset,
            completed: call.completed + offset,
            ..call.clone()
        }));
        self.clock += other.clock;
    }

    /// Records a call whose outcome stayed unknown, e.g. of a writer that crashed while its
    /// append was in flight.
    pub fn record_unknown<P: AsRef<[u8]>>(&mut self, payloads: &[P]) {
        let invoked = self.tick();
        self.push(payloads, None, invoked);
    }

    fn count(&self, told: Told) -> usize {
        self.calls
            .iter()
            .filter(|call| call.told == told)
            .map(|call| call.payloads.len())
            .sum()
    }

    /// Payloads whose append was acknowledged.
    pub fn acknowledged(&self) -> usize {
        self.count(Told::Acknowledged)
    }

    /// Payloads whose append had an unknown outcome.
    pub fn unknown(&self) -> usize {
        self.count(Told::Unknown)
    }

    /// Payloads whose append definitely failed.
    pub fn failed(&self) -> usize {
        self.count(Told::Failed)
    }
}

/// What a journal that passed the check holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalReport {
    /// All records, fences included.
    pub records: u64,
    /// Events.
    pub events: u64,
    /// The epochs of the fences, in order.
    pub fence_epochs: Vec<Epoch>,
    /// Unknown-outcome appends that did commit.
    pub unknown_committed: usize,
}

/// A journal broke an invariant; each violation says which and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("journal of {session} breaks its invariants:\n{}", .violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct InvariantViolation {
    /// The session.
    pub session: Uuid,
    /// What is wrong.
    pub violations: Vec<Violation>,
}

/// Where an event lies in the journal.
#[derive(Clone, Copy)]
struct Placed {
    position: u64,
    epoch: Epoch,
    nonce: Uuid,
}

fn show(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// Checks `session`'s journal against the invariants of [`JournalCheck`](crate::journal::JournalCheck)
/// (what the journal holds: one chain from its base, fences before events, fence epochs
/// increasing, the tip naming the last record), and against `history` (invariant 4): every
/// acknowledged append present exactly once (or trimmed: below the journal's base), an
/// outcome-unknown append at most once, a definitely failed append not at all; each append
/// call all or nothing, as one contiguous run of one transaction (one nonce); an acknowledged
/// append before every append of its epoch that started after it was acknowledged.
pub async fn check_journal(
    store: &Store,
    session: Uuid,
    history: &AppendHistory,
) -> Result<JournalReport, InvariantViolation> {
    let mut placed: HashMap<Vec<u8>, Vec<Placed>> = HashMap::new();
    let checked = crate::journal::check(store.connection(), store.namespace(), session, |event| {
        placed
            .entry(event.payload.clone())
            .or_default()
            .push(Placed {
                position: event.seq,
                epoch: event.epoch,
                nonce: event.nonce,
            });
    })
    .await;
    let checked = match checked {
        Ok(checked) => checked,
        Err(error) => {
            return Err(InvariantViolation {
                session,
                violations: vec![Violation::Replay(error.to_string())],
            });
        }
    };
    let mut violations = checked.violations;
    let unknown_committed = check_history(history, &placed, checked.base, &mut violations);
    if violations.is_empty() {
        Ok(JournalReport {
            records: checked.records,
            events: checked.events,
            fence_epochs: checked.fence_epochs,
            unknown_committed,
        })
    } else {
        Err(InvariantViolation {
            session,
            violations,
        })
    }
}

/// Checks invariant 4 against the history; returns how many unknown-outcome appends committed.
fn check_history(
    history: &AppendHistory,
    placed: &HashMap<Vec<u8>, Vec<Placed>>,
    base: u64,
    violations: &mut Vec<Violation>,
) -> usize {
    let present = |payload: &Vec<u8>| placed.get(payload).map_or(0, Vec::len) as u32;
    let mut unknown_committed = 0;
    // Acknowledged calls, per epoch: (place of the first record, call), for the order check.
    let mut acknowledged: HashMap<Epoch, Vec<(u64, &Call)>> = HashMap::new();
    for call in &history.calls {
        let (payloads, told) = (&call.payloads, &call.told);
        // How many of an acknowledged call's records lie below the base: trimmed, not lost.
        let trimmed = call.seqs.map_or(0, |(first, last)| {
            if base == 1 || first >= base {
                0
            } else {
                (last.min(base - 1) - first + 1) as usize
            }
        });
        for (i, payload) in payloads.iter().enumerate() {
            match (told, present(payload)) {
                (Told::Acknowledged, 1) | (Told::Unknown, 0 | 1) | (Told::Failed, 0) => {}
                (Told::Acknowledged, 0) if i < trimmed => {}
                (Told::Acknowledged, n) => violations.push(Violation::Acknowledged {
                    payload: show(payload),
                    present: n,
                }),
                (Told::Unknown, n) => violations.push(Violation::UnknownRepeated {
                    payload: show(payload),
                    present: n,
                }),
                (Told::Failed, _) => violations.push(Violation::FailedPresent {
                    payload: show(payload),
                }),
            }
        }
        // All or nothing, one contiguous run of one transaction.
        let places: Vec<Placed> = payloads
            .iter()
            .filter_map(|p| placed.get(p).and_then(|v| v.first().copied()))
            .collect();
        let contiguous = places.windows(2).all(|w| {
            w[0].position.checked_add(1) == Some(w[1].position) && w[1].nonce == w[0].nonce
        });
        // A call cut by a trim keeps its tail, from the base on.
        let cut_at_base = base > 1
            && places.first().is_some_and(|first| first.position == base)
            && payloads[payloads.len() - places.len()..]
                .iter()
                .all(|p| placed.contains_key(p));
        let whole = contiguous && (places.len() == payloads.len() || cut_at_base);
        if !places.is_empty() && !whole {
            violations.push(Violation::Torn {
                first: show(&payloads[0]),
                present: places.len(),
                of: payloads.len(),
            });
        }
        if *told == Told::Unknown && whole && !places.is_empty() {
            unknown_committed += 1;
        }
        if *told == Told::Acknowledged
            && let Some(first) = places.first()
        {
            acknowledged
                .entry(first.epoch)
                .or_default()
                .push((first.position, call));
        }
    }
    // Real-time order: an append acknowledged before another started comes before it. Walking
    // each epoch's appends from the journal's end, keep the earliest result among those
    // placed later; a call that started after it is out of order.
    for calls in acknowledged.values_mut() {
        calls.sort_by_key(|&(position, _)| position);
        let mut earliest_later: Option<&Call> = None;
        for &(_, call) in calls.iter().rev() {
            if let Some(later) = earliest_later
                && later.completed < call.invoked
            {
                violations.push(Violation::OutOfOrder {
                    earlier: show(&later.payloads[0]),
                    later: show(&call.payloads[0]),
                });
            }
            if earliest_later.is_none_or(|later| call.completed < later.completed) {
                earliest_later = Some(call);
            }
        }
    }
    unknown_committed
}
