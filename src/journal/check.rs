//! The journal invariants, checked on what a journal holds (for operators and tests alike).
//!
//! [`check`] replays a journal at one revision, reads its tip at that same revision, and
//! checks (the numbers are those of the safety invariants):
//!
//! 1. one chain: sequence numbers gapless from the base (and unique: one key per number), each
//!    fence naming the record before it as its previous tip, the tip naming the last record
//!    (a tip behind it is told apart: no owner can open that journal, its next fence's record
//!    key being taken);
//! 2. no record of epoch e after a fence of epoch e' > e; stronger: every event carries the
//!    epoch of the last fence before it (each writer fences before it writes);
//! 3. fence epochs strictly increase, and record 1 is a fence.
//!
//! A trimmed journal starts at its base: a gap below it is a trim, not a loss. Records before
//! the first fence kept are checked for one epoch among them (their fence was trimmed), and
//! the first kept fence may name the record just below the base.

use std::fmt;

use etcd_client::{GetOptions, KvClient};
use futures_util::StreamExt as _;
use uuid::Uuid;

use super::record::{Tip, decode_tip};
use super::{Event, Record, Replay, ReplayOptions};
use crate::etcd::Connection;
use crate::journal::ReplayError;
use crate::keys::Namespace;
use crate::lease::Epoch;

/// What a journal holds, and how it breaks the invariants if it does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalCheck {
    /// The session.
    pub session: Uuid,
    /// The revision the journal was read at.
    pub revision: i64,
    /// The first sequence number kept (1 unless trimmed).
    pub base: u64,
    /// Records read, fences included.
    pub records: u64,
    /// Events read.
    pub events: u64,
    /// The epochs of the fences, in order.
    pub fence_epochs: Vec<Epoch>,
    /// The tip at that revision, if any.
    pub tip: Option<Tip>,
    /// What is wrong; empty for a sound journal.
    pub violations: Vec<Violation>,
}

impl JournalCheck {
    /// Whether the journal holds every invariant checked.
    pub fn is_sound(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One way a journal breaks an invariant (the numbers of the safety invariants).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// The replay itself failed.
    Replay(String),
    /// A record could not be decoded.
    Undecodable {
        /// Its key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
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
    /// 1: the tip names a record before the last one. The next fence goes to the record after
    /// the tip, whose key exists already: no owner can open the journal (a
    /// [`SessionHost`](crate::SessionHost) quarantines the session) until the tip is repaired.
    TipBehind {
        /// The tip's (seq, epoch).
        tip: (u64, Epoch),
        /// The last record's (seq, epoch).
        last: (u64, Epoch),
    },
    /// 1: the tip is not the last record (its seq, epoch and nonce), other than by naming an
    /// earlier one ([`TipBehind`](Self::TipBehind)).
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

impl Violation {
    /// The sequence number of the offending record, where there is one.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Violation::Gap { found, .. } => Some(*found),
            Violation::Fork { fence, .. } => Some(*fence),
            Violation::TipBehind { tip: (seq, _), .. } => Some(*seq),
            Violation::TipMismatch { tip, .. } => tip.map(|(seq, _)| seq),
            Violation::StaleRecord { seq, .. }
            | Violation::Unfenced { seq, .. }
            | Violation::FenceNotIncreasing { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Replay(error) => write!(f, "replay failed: {error}"),
            Violation::Undecodable { key, reason } => write!(f, "cannot decode {key}: {reason}"),
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
            Violation::TipBehind { tip, last } => write!(
                f,
                "invariant 1: the tip {tip:?} is behind the last record {last:?}: no owner can open the journal (its fence would go to record {}, which exists)",
                tip.0.saturating_add(1)
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

/// Walks a journal's records in order and notes what breaks invariants 1 to 3. Pure: the
/// records come from a replay, the tip from a read at the replay's revision.
#[derive(Debug)]
pub(crate) struct Walker {
    base: u64,
    expected: u64,
    /// The last record's (seq, epoch, nonce).
    previous: Option<(u64, Epoch, Uuid)>,
    /// The epoch of the records before the first fence kept (of a trimmed journal).
    unfenced_epoch: Option<Epoch>,
    pub(crate) fence_epochs: Vec<Epoch>,
    pub(crate) records: u64,
    pub(crate) events: u64,
    pub(crate) violations: Vec<Violation>,
}

impl Walker {
    pub(crate) fn new(base: u64) -> Self {
        Self {
            base,
            expected: base,
            previous: None,
            unfenced_epoch: None,
            fence_epochs: Vec::new(),
            records: 0,
            events: 0,
            violations: Vec::new(),
        }
    }

    pub(crate) fn step(&mut self, record: &Record) {
        let seq = record.seq();
        if self.records == 0 && self.base == 1 && !matches!(record, Record::Fence(_)) {
            self.violations.push(Violation::FirstNotFence);
        }
        self.records += 1;
        if seq != self.expected {
            self.violations.push(Violation::Gap {
                expected: self.expected,
                found: seq,
            });
        }
        self.expected = seq.saturating_add(1);
        let last_fence = self.fence_epochs.last().copied();
        if let Some(fence) = last_fence
            && record.epoch() < fence
        {
            self.violations.push(Violation::StaleRecord {
                seq,
                epoch: record.epoch(),
                fence,
            });
        }
        let before = self.previous.map(|(seq, epoch, _)| (seq, epoch));
        match record {
            Record::Event(event) => {
                self.events += 1;
                let fenced_by = last_fence.or_else(|| {
                    // Its fence was trimmed: the records before the first fence kept are of
                    // one epoch.
                    (self.base > 1).then(|| *self.unfenced_epoch.get_or_insert(event.epoch))
                });
                if fenced_by != Some(event.epoch) {
                    self.violations.push(Violation::Unfenced {
                        seq: event.seq,
                        epoch: event.epoch,
                        fence: last_fence,
                    });
                }
            }
            Record::Fence(fence) => {
                let names = fence.previous.map(|tip| (tip.seq, tip.epoch));
                // The first fence kept may name the record just below the base.
                let below_base = before.is_none()
                    && self.base > 1
                    && names.is_some_and(|(seq, _)| seq == self.base - 1);
                if names != before && !below_base {
                    self.violations.push(Violation::Fork {
                        fence: fence.seq,
                        names,
                        before,
                    });
                }
                let floor = last_fence.or(self.unfenced_epoch);
                if let Some(previous) = floor
                    && fence.epoch <= previous
                {
                    self.violations.push(Violation::FenceNotIncreasing {
                        seq: fence.seq,
                        epoch: fence.epoch,
                        previous,
                    });
                }
                self.fence_epochs.push(fence.epoch);
            }
        }
        self.previous = Some((seq, record.epoch(), record.nonce()));
    }

    /// The tip at the replay's revision must name the last record (seq, epoch and nonce).
    pub(crate) fn finish(&mut self, tip: Option<Tip>) {
        if let (Some(tip), Some((seq, epoch, _))) = (tip, self.previous)
            && tip.seq < seq
        {
            self.violations.push(Violation::TipBehind {
                tip: (tip.seq, tip.epoch),
                last: (seq, epoch),
            });
        } else if tip.map(|tip| (tip.seq, tip.epoch, tip.nonce)) != self.previous {
            self.violations.push(Violation::TipMismatch {
                tip: tip.map(|tip| (tip.seq, tip.epoch)),
                last: self.previous.map(|(seq, epoch, _)| (seq, epoch)),
            });
        }
    }
}

/// Checks `session`'s journal (see the module docs); `on_event` sees every event in order.
/// Fails only when etcd does (or the snapshot is compacted mid-read); an undecodable record
/// is a violation.
pub(crate) async fn check(
    connection: &Connection,
    namespace: &Namespace,
    session: Uuid,
    mut on_event: impl FnMut(&Event),
) -> Result<JournalCheck, ReplayError> {
    let mut replay = Replay::new(
        connection.clone(),
        namespace.records_prefix(session),
        namespace.base_key(session),
        ReplayOptions::default(),
    );
    let mut walker: Option<Walker> = None;
    let mut undecodable = None;
    while let Some(record) = replay.next().await {
        let walker = walker.get_or_insert_with(|| Walker::new(replay.base()));
        match record {
            Ok(record) => {
                walker.step(&record);
                if let Record::Event(event) = &record {
                    on_event(event);
                }
            }
            Err(ReplayError::Decode(error)) => {
                undecodable = Some(Violation::Undecodable {
                    key: error.key,
                    reason: error.reason,
                });
                break;
            }
            Err(error) => return Err(error),
        }
    }
    let mut walker = walker.unwrap_or_else(|| Walker::new(replay.base()));
    let revision = replay.revision();
    let tip = read_tip(connection, namespace, session, revision).await?;
    match undecodable {
        Some(violation) => walker.violations.push(violation),
        None => walker.finish(tip.as_ref().and_then(|tip| tip.as_ref().ok().copied())),
    }
    if let Some(Err(error)) = &tip {
        walker.violations.push(Violation::Undecodable {
            key: error.key.clone(),
            reason: error.reason.clone(),
        });
    }
    Ok(JournalCheck {
        session,
        revision,
        base: walker.base,
        records: walker.records,
        events: walker.events,
        fence_epochs: walker.fence_epochs,
        tip: tip.and_then(Result::ok),
        violations: walker.violations,
    })
}

/// Checks every journal under `namespace` (see the module docs) in one pass over its
/// `journals/` keys at one revision, in pages: each journal's base key, records and tip come in
/// that order (`base` < `r/` < `tip`), so each is checked as its keys stream by, and the pass
/// costs requests by bytes read, not by journals. `progress` sees the journals checked so far,
/// after each page. Journals in session order; fails only when etcd does.
pub(crate) async fn check_all(
    connection: &Connection,
    namespace: &Namespace,
    options: &ReplayOptions,
    mut progress: impl FnMut(usize),
) -> Result<Vec<JournalCheck>, ReplayError> {
    let prefix = namespace.journals_prefix();
    let range_end = crate::keys::prefix_end(&prefix);
    let mut from = prefix.clone().into_bytes();
    let (mut revision, mut largest, mut cap) = (0, None, options.page_records.max(1));
    let mut checks = Vec::new();
    let mut current: Option<Scanned> = None;
    loop {
        let limit =
            super::replay::etcd_limit(super::replay::page_limit(largest, options.page_bytes, cap));
        let read = connection
            .read("check journals", |mut client: KvClient, _| {
                let mut options = GetOptions::new()
                    .with_range(range_end.clone())
                    .with_limit(limit);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let from = from.clone();
                async move { client.get(from, Some(options)).await }
            })
            .await;
        let response = match read {
            // Larger than etcd-client decodes: the same page again, smaller.
            Err(error) if error.is_reply_too_large() && limit > 1 => {
                cap = (limit as usize / 2).max(1);
                continue;
            }
            read => read.map_err(ReplayError::reading_at(revision))?,
        };
        if revision == 0 {
            revision = response.header().map_or(0, |h| h.revision());
        }
        for kv in response.kvs() {
            largest = Some(largest.unwrap_or(0).max(kv.key().len() + kv.value().len()));
            let Some((session, rest)) = split_journal_key(&prefix, kv.key()) else {
                continue;
            };
            if current
                .as_ref()
                .is_some_and(|scanned| scanned.session != session)
            {
                checks.extend(current.take().map(|scanned| scanned.finish(revision)));
            }
            current
                .get_or_insert_with(|| Scanned::new(session))
                .take(rest, kv.key(), kv.value());
        }
        progress(checks.len());
        match response.kvs().last() {
            Some(last) if response.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    checks.extend(current.take().map(|scanned| scanned.finish(revision)));
    progress(checks.len());
    Ok(checks)
}

/// `key`'s session and what follows it (`base`, `tip`, `r/…`), if it is a journal's key under
/// `prefix` (`{ns}/journals/`).
fn split_journal_key<'k>(prefix: &str, key: &'k [u8]) -> Option<(Uuid, &'k [u8])> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    let slash = rest.iter().position(|&b| b == b'/')?;
    let session = Uuid::try_parse_ascii(&rest[..slash]).ok()?;
    Some((session, &rest[slash + 1..]))
}

/// One journal being checked as [`check_all`] reads its keys.
struct Scanned {
    session: Uuid,
    /// The base key's value, if it came (before any record).
    base: Option<u64>,
    walker: Option<Walker>,
    tip: Option<Result<Tip, super::DecodeError>>,
    /// The first undecodable key: the records after it are not checked.
    undecodable: Option<Violation>,
}

impl Scanned {
    fn new(session: Uuid) -> Self {
        Self {
            session,
            base: None,
            walker: None,
            tip: None,
            undecodable: None,
        }
    }

    fn undecodable(&mut self, error: super::DecodeError) {
        self.undecodable.get_or_insert(Violation::Undecodable {
            key: error.key,
            reason: error.reason,
        });
    }

    /// One of the journal's keys: `rest` is what follows its session. After an undecodable
    /// key only the tip is taken (as [`check`] reads it whatever the records hold).
    fn take(&mut self, rest: &[u8], key: &[u8], value: &[u8]) {
        match rest {
            b"tip" => self.tip = Some(decode_tip(key, value)),
            _ if self.undecodable.is_some() => {}
            b"base" => match super::record::decode_base(key, value) {
                Ok(base) => self.base = Some(base),
                Err(error) => self.undecodable(error),
            },
            _ if rest.starts_with(b"r/") => {
                let seq = super::seq_of_key(key);
                let record = match super::decode_record(key, seq, value) {
                    Ok(record) => record,
                    Err(error) => return self.undecodable(error),
                };
                let walker = match &mut self.walker {
                    Some(walker) => walker,
                    // The first record: without a base key, the journal starts there (see
                    // `base_of`).
                    None => self
                        .walker
                        .insert(Walker::new(self.base.unwrap_or(record.seq()))),
                };
                walker.step(&record);
            }
            // Nothing else lives under a journal's prefix: not the journal's, skipped.
            _ => {}
        }
    }

    fn finish(self, revision: i64) -> JournalCheck {
        let base = self.base.unwrap_or(1);
        let mut walker = self.walker.unwrap_or_else(|| Walker::new(base));
        match self.undecodable {
            Some(violation) => walker.violations.push(violation),
            None => walker.finish(self.tip.as_ref().and_then(|tip| tip.as_ref().ok().copied())),
        }
        if let Some(Err(error)) = &self.tip {
            walker.violations.push(Violation::Undecodable {
                key: error.key.clone(),
                reason: error.reason.clone(),
            });
        }
        JournalCheck {
            session: self.session,
            revision,
            base: walker.base,
            records: walker.records,
            events: walker.events,
            fence_epochs: walker.fence_epochs,
            tip: self.tip.and_then(Result::ok),
            violations: walker.violations,
        }
    }
}

async fn read_tip(
    connection: &Connection,
    namespace: &Namespace,
    session: Uuid,
    revision: i64,
) -> Result<Option<Result<Tip, super::DecodeError>>, ReplayError> {
    let key = namespace.tip_key(session);
    let response = connection
        .read("check tip", |mut client: KvClient, _| {
            let options = (revision > 0).then(|| GetOptions::new().with_revision(revision));
            let key = key.clone();
            async move { client.get(key, options).await }
        })
        .await
        .map_err(ReplayError::reading_at(revision))?;
    Ok(response
        .kvs()
        .first()
        .map(|kv| decode_tip(kv.key(), kv.value())))
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
