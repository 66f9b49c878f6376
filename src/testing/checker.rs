//! Checks a journal against the safety invariants, given what its writers were told.

use std::collections::HashMap;

use futures_util::StreamExt as _;
use uuid::Uuid;

use crate::error::JournalWriteError;
use crate::journal::{Appended, Record};
use crate::lease::Epoch;
use crate::store::Store;

/// What the writers of a journal were told about each append, by payload. Payloads must be
/// unique across the history (the checker finds appends by them).
#[derive(Clone, Debug, Default)]
pub struct AppendHistory {
    acknowledged: Vec<Vec<u8>>,
    unknown: Vec<Vec<u8>>,
    failed: Vec<Vec<u8>>,
}

impl AppendHistory {
    /// Records the result of appending `payloads` in one call.
    pub fn record<P: AsRef<[u8]>>(
        &mut self,
        payloads: &[P],
        result: &Result<Appended, JournalWriteError>,
    ) {
        let list = match result {
            Ok(_) => &mut self.acknowledged,
            Err(JournalWriteError::OutcomeUnknown(_)) => &mut self.unknown,
            Err(_) => &mut self.failed,
        };
        list.extend(payloads.iter().map(|p| p.as_ref().to_vec()));
    }

    /// Payloads whose append was acknowledged.
    pub fn acknowledged(&self) -> usize {
        self.acknowledged.len()
    }

    /// Payloads whose append had an unknown outcome.
    pub fn unknown(&self) -> usize {
        self.unknown.len()
    }

    /// Payloads whose append definitely failed.
    pub fn failed(&self) -> usize {
        self.failed.len()
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

/// A journal broke an invariant; each line says which and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("journal of {session} breaks its invariants:\n{}", .violations.join("\n"))]
pub struct InvariantViolation {
    /// The session.
    pub session: Uuid,
    /// What is wrong, one line each.
    pub violations: Vec<String>,
}

/// Replays `session`'s journal and checks the journal safety invariants against `history`:
///
/// 1. one chain: sequence numbers gapless from 1 (and unique: one key per number), each fence
///    naming the record before it as its previous tip;
/// 2. no record of epoch e after a fence of epoch e' > e; stronger: every event carries the
///    epoch of the last fence before it (each writer fences before it writes). Sequence order
///    is commit order here, since the chain is gapless and each append compares the tip;
/// 3. fence epochs strictly increase, and record 1 is a fence;
/// 4. every acknowledged append present exactly once, an outcome-unknown append at most once,
///    and a definitely failed append not at all.
pub async fn check_journal(
    store: &Store,
    session: Uuid,
    history: &AppendHistory,
) -> Result<JournalReport, InvariantViolation> {
    let mut violations = Vec::new();
    let mut replay = store.replay_records(session);
    let (mut records, mut events) = (0u64, 0u64);
    let mut fence_epochs: Vec<Epoch> = Vec::new();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut previous: Option<(u64, Epoch)> = None;
    while let Some(record) = replay.next().await {
        let record = match record {
            Ok(record) => record,
            Err(error) => {
                violations.push(format!("replay failed: {error}"));
                break;
            }
        };
        records += 1;
        if records == 1 && !matches!(record, Record::Fence(_)) {
            violations.push("invariant 3: record 1 is not a fence".to_owned());
        }
        if record.seq() != records {
            violations.push(format!(
                "invariant 1: record {} found where {records} belongs",
                record.seq()
            ));
        }
        if let Some(&fence) = fence_epochs.last()
            && record.epoch() < fence
        {
            violations.push(format!(
                "invariant 2: record {} of epoch {} after a fence of epoch {fence}",
                record.seq(),
                record.epoch()
            ));
        }
        match &record {
            Record::Event(event) if fence_epochs.last() != Some(&event.epoch) => {
                violations.push(format!(
                    "invariant 2: event {} of epoch {} is not under a fence of its epoch (last fence: {:?})",
                    event.seq,
                    event.epoch,
                    fence_epochs.last()
                ));
            }
            Record::Fence(fence)
                if fence.previous.map(|tip| tip.seq) != previous.map(|p: (u64, Epoch)| p.0)
                    || fence.previous.map(|tip| tip.epoch) != previous.map(|p| p.1) =>
            {
                violations.push(format!(
                    "invariant 1: fence {} names previous tip {:?}, but the record before it is {previous:?}",
                    fence.seq,
                    fence.previous.map(|tip| (tip.seq, tip.epoch))
                ));
            }
            _ => {}
        }
        previous = Some((record.seq(), record.epoch()));
        match record {
            Record::Fence(fence) => {
                if let Some(&last) = fence_epochs.last()
                    && fence.epoch <= last
                {
                    violations.push(format!(
                        "invariant 3: fence {} of epoch {} after a fence of epoch {last}",
                        fence.seq, fence.epoch
                    ));
                }
                fence_epochs.push(fence.epoch);
            }
            Record::Event(event) => {
                events += 1;
                *seen.entry(event.payload).or_default() += 1;
            }
        }
    }
    let count = |payload: &Vec<u8>| seen.get(payload).copied().unwrap_or(0);
    let show = |payload: &Vec<u8>| String::from_utf8_lossy(payload).into_owned();
    for payload in &history.acknowledged {
        if count(payload) != 1 {
            violations.push(format!(
                "invariant 4: acknowledged append {:?} present {} times",
                show(payload),
                count(payload)
            ));
        }
    }
    let mut unknown_committed = 0;
    for payload in &history.unknown {
        match count(payload) {
            0 => {}
            1 => unknown_committed += 1,
            n => violations.push(format!(
                "invariant 4: outcome-unknown append {:?} present {n} times",
                show(payload)
            )),
        }
    }
    for payload in &history.failed {
        if count(payload) != 0 {
            violations.push(format!(
                "invariant 4: append {:?} reported failed is present",
                show(payload)
            ));
        }
    }
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
