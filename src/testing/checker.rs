//! Checks a journal against the safety invariants, given what its writers were told.

use std::collections::HashMap;
use std::fmt;

use etcd_client::GetOptions;
use futures_util::StreamExt as _;
use uuid::Uuid;

use crate::error::JournalWriteError;
use crate::journal::{Appended, Record, decode_tip};
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

    fn push<P: AsRef<[u8]>>(&mut self, payloads: &[P], told: Told, invoked: u64) {
        let completed = self.tick();
        let payloads = payloads.iter().map(|p| p.as_ref().to_vec()).collect();
        self.calls.push(Call {
            payloads,
            told,
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
        self.push(payloads, told(result), invoked);
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
        self.push(payloads, told(result), invocation.0);
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
        self.push(payloads, Told::Unknown, invoked);
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

/// One way a journal breaks an invariant (the numbers of DESIGN's §6).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// The replay itself failed.
    Replay(String),
    /// 1: the record at position `expected` holds sequence number `found` (a gap or a
    /// duplicate).
    Gap {
        /// The position.
        expected: u64,
        /// The sequence number found there.
        found: u64,
    },
    /// 1: a fence names a previous tip that is not the record before it: two writers wrote
    /// from different tips (a fork).
    Fork {
        /// The fence's sequence number.
        fence: u64,
        /// The (seq, epoch) the fence names.
        names: Option<(u64, Epoch)>,
        /// The (seq, epoch) of the record before it.
        before: Option<(u64, Epoch)>,
    },
    /// 1: the tip is not the last record (its seq, epoch and nonce).
    TipMismatch {
        /// The tip's (seq, epoch), `None` if absent or undecodable.
        tip: Option<(u64, Epoch)>,
        /// The last record's (seq, epoch).
        last: Option<(u64, Epoch)>,
    },
    /// 2: a record of an older epoch after a fence of a newer one.
    StaleRecord {
        /// The record.
        seq: u64,
        /// Its epoch.
        epoch: Epoch,
        /// The epoch of the last fence before it.
        fence: Epoch,
    },
    /// 2: an event whose epoch is not that of the last fence before it (its writer did not
    /// fence first).
    Unfenced {
        /// The event.
        seq: u64,
        /// Its epoch.
        epoch: Epoch,
        /// The last fence's epoch before it, if any.
        fence: Option<Epoch>,
    },
    /// 3: the first record is not a fence.
    FirstNotFence,
    /// 3: a fence whose epoch is not above the fence before it.
    FenceNotIncreasing {
        /// The fence.
        seq: u64,
        /// Its epoch.
        epoch: Epoch,
        /// The epoch of the fence before it.
        previous: Epoch,
    },
    /// 4: an acknowledged append is missing, or present more than once.
    Acknowledged {
        /// The payload.
        payload: String,
        /// How often it is present.
        present: u32,
    },
    /// 4: an outcome-unknown append is present more than once.
    UnknownRepeated {
        /// The payload.
        payload: String,
        /// How often it is present.
        present: u32,
    },
    /// 4: an append reported as failed is present.
    FailedPresent {
        /// The payload.
        payload: String,
    },
    /// 4: an append call is present in part (all or nothing), or its records are not one
    /// contiguous run written by one transaction.
    Torn {
        /// The call's first payload.
        first: String,
        /// How many of its payloads are present.
        present: usize,
        /// How many it had.
        of: usize,
    },
    /// 4: an acknowledged append comes after one of its epoch that started only after it was
    /// acknowledged.
    OutOfOrder {
        /// The one acknowledged first.
        earlier: String,
        /// The one acknowledged later, found before it.
        later: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Replay(error) => write!(f, "replay failed: {error}"),
            Violation::Gap { expected, found } => {
                write!(
                    f,
                    "invariant 1: record {found} found where {expected} belongs"
                )
            }
            Violation::Fork {
                fence,
                names,
                before,
            } => write!(
                f,
                "invariant 1: fence {fence} names previous tip {names:?}, but the record before it is {before:?}"
            ),
            Violation::TipMismatch { tip, last } => write!(
                f,
                "invariant 1: the tip {tip:?} is not the last record {last:?}"
            ),
            Violation::StaleRecord { seq, epoch, fence } => write!(
                f,
                "invariant 2: record {seq} of epoch {epoch} after a fence of epoch {fence}"
            ),
            Violation::Unfenced { seq, epoch, fence } => write!(
                f,
                "invariant 2: event {seq} of epoch {epoch} is not under a fence of its epoch (last fence: {fence:?})"
            ),
            Violation::FirstNotFence => f.write_str("invariant 3: record 1 is not a fence"),
            Violation::FenceNotIncreasing {
                seq,
                epoch,
                previous,
            } => write!(
                f,
                "invariant 3: fence {seq} of epoch {epoch} after a fence of epoch {previous}"
            ),
            Violation::Acknowledged { payload, present } => write!(
                f,
                "invariant 4: acknowledged append {payload:?} present {present} times"
            ),
            Violation::UnknownRepeated { payload, present } => write!(
                f,
                "invariant 4: outcome-unknown append {payload:?} present {present} times"
            ),
            Violation::FailedPresent { payload } => {
                write!(
                    f,
                    "invariant 4: append {payload:?} reported failed is present"
                )
            }
            Violation::Torn { first, present, of } => write!(
                f,
                "invariant 4: the append of {first:?} is present in part or split ({present} of {of})"
            ),
            Violation::OutOfOrder { earlier, later } => write!(
                f,
                "invariant 4: {later:?}, acknowledged after {earlier:?}, comes before it"
            ),
        }
    }
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

/// Replays `session`'s journal at one revision, reads its tip at that revision, and checks the
/// journal invariants against `history`:
///
/// 1. one chain: sequence numbers gapless from 1 (and unique: one key per number), each fence
///    naming the record before it as its previous tip, and the tip naming the last record;
/// 2. no record of epoch e after a fence of epoch e' > e; stronger: every event carries the
///    epoch of the last fence before it (each writer fences before it writes). Sequence order
///    is commit order here, since the chain is gapless and each append compares the tip;
/// 3. fence epochs strictly increase, and record 1 is a fence;
/// 4. every acknowledged append present exactly once, an outcome-unknown append at most once,
///    a definitely failed append not at all; each append call all or nothing, as one
///    contiguous run of one transaction (one nonce); an acknowledged append before every
///    append of its epoch that started after it was acknowledged.
pub async fn check_journal(
    store: &Store,
    session: Uuid,
    history: &AppendHistory,
) -> Result<JournalReport, InvariantViolation> {
    let mut violations = Vec::new();
    let mut replay = store.replay_records(session);
    let (mut records, mut events) = (0u64, 0u64);
    let mut fence_epochs: Vec<Epoch> = Vec::new();
    let mut placed: HashMap<Vec<u8>, Vec<Placed>> = HashMap::new();
    let mut previous: Option<(u64, Epoch, Uuid)> = None;
    while let Some(record) = replay.next().await {
        let record = match record {
            Ok(record) => record,
            Err(error) => {
                violations.push(Violation::Replay(error.to_string()));
                break;
            }
        };
        records += 1;
        if records == 1 && !matches!(record, Record::Fence(_)) {
            violations.push(Violation::FirstNotFence);
        }
        if record.seq() != records {
            violations.push(Violation::Gap {
                expected: records,
                found: record.seq(),
            });
        }
        if let Some(&fence) = fence_epochs.last()
            && record.epoch() < fence
        {
            violations.push(Violation::StaleRecord {
                seq: record.seq(),
                epoch: record.epoch(),
                fence,
            });
        }
        let before = previous.map(|(seq, epoch, _)| (seq, epoch));
        match &record {
            Record::Event(event) if fence_epochs.last() != Some(&event.epoch) => {
                violations.push(Violation::Unfenced {
                    seq: event.seq,
                    epoch: event.epoch,
                    fence: fence_epochs.last().copied(),
                });
            }
            Record::Fence(fence) => {
                let names = fence.previous.map(|tip| (tip.seq, tip.epoch));
                if names != before {
                    violations.push(Violation::Fork {
                        fence: fence.seq,
                        names,
                        before,
                    });
                }
            }
            _ => {}
        }
        previous = Some((record.seq(), record.epoch(), record.nonce()));
        match record {
            Record::Fence(fence) => {
                if let Some(&last) = fence_epochs.last()
                    && fence.epoch <= last
                {
                    violations.push(Violation::FenceNotIncreasing {
                        seq: fence.seq,
                        epoch: fence.epoch,
                        previous: last,
                    });
                }
                fence_epochs.push(fence.epoch);
            }
            Record::Event(event) => {
                events += 1;
                placed.entry(event.payload).or_default().push(Placed {
                    position: records,
                    epoch: event.epoch,
                    nonce: event.nonce,
                });
            }
        }
    }
    if !violations.iter().any(|v| matches!(v, Violation::Replay(_))) {
        check_tip(store, session, replay.revision(), previous, &mut violations).await;
    }
    let unknown_committed = check_history(history, &placed, &mut violations);
    if violations.is_empty() {
        Ok(JournalReport {
            records,
            events,
            fence_epochs,
            unknown_committed,
        })
    } else {
        Err(InvariantViolation {
            session,
            violations,
        })
    }
}

/// The tip at the replay's revision must name the last record (seq, epoch and nonce).
async fn check_tip(
    store: &Store,
    session: Uuid,
    revision: i64,
    last: Option<(u64, Epoch, Uuid)>,
    violations: &mut Vec<Violation>,
) {
    let key = store.namespace().tip_key(session);
    let read = store
        .connection()
        .read("check tip", |mut client, _| {
            let options = (revision > 0).then(|| GetOptions::new().with_revision(revision));
            let key = key.clone();
            async move { client.get(key, options).await }
        })
        .await;
    let tip = match read {
        Ok(response) => response
            .kvs()
            .first()
            .and_then(|kv| decode_tip(kv.key(), kv.value()).ok()),
        Err(error) => {
            violations.push(Violation::Replay(error.to_string()));
            return;
        }
    };
    if tip.map(|tip| (tip.seq, tip.epoch, tip.nonce)) != last {
        violations.push(Violation::TipMismatch {
            tip: tip.map(|tip| (tip.seq, tip.epoch)),
            last: last.map(|(seq, epoch, _)| (seq, epoch)),
        });
    }
}

/// Checks invariant 4 against the history; returns how many unknown-outcome appends committed.
fn check_history(
    history: &AppendHistory,
    placed: &HashMap<Vec<u8>, Vec<Placed>>,
    violations: &mut Vec<Violation>,
) -> usize {
    let present = |payload: &Vec<u8>| placed.get(payload).map_or(0, Vec::len) as u32;
    let mut unknown_committed = 0;
    // Acknowledged calls, per epoch: (place of the first record, call), for the order check.
    let mut acknowledged: HashMap<Epoch, Vec<(u64, &Call)>> = HashMap::new();
    for call in &history.calls {
        let (payloads, told) = (&call.payloads, &call.told);
        for payload in payloads {
            match (told, present(payload)) {
                (Told::Acknowledged, 1) | (Told::Unknown, 0 | 1) | (Told::Failed, 0) => {}
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
        let whole = places.len() == payloads.len()
            && places
                .windows(2)
                .all(|w| w[1].position == w[0].position + 1 && w[1].nonce == w[0].nonce);
        if !places.is_empty() && !whole {
            violations.push(Violation::Torn {
                first: show(&payloads[0]),
                present: places.len(),
                of: payloads.len(),
            });
        }
        if *told == Told::Unknown && whole {
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
