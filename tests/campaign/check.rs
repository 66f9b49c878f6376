//! The checker: what is finally in etcd, against the history.
//!
//! Per session:
//! - invariants 1–4 with `leasehold::testing::check_journal` (one chain, no stale record after
//!   a newer fence, fence epochs increasing, every acknowledged append present exactly once,
//!   an outcome-unknown one at most once, a failed one not at all, all or nothing, in order);
//! - invariant 2 in revision order, from the records' own revisions: a record of epoch `e`
//!   committed before any later epoch of its session was created (epochs are revisions), and
//!   before the delete that revoked `e`, if one did;
//! - invariant 5: no owner saw its lease valid after a later epoch of its session was
//!   acquired, unless the earlier one was revoked from outside (an owner learns of a revoke
//!   only from its watch, so that window is not the margin's to close). A host node's owner
//!   sees its lease valid through `Rig::is_valid`; a sidecar's client through `Validate`, from
//!   when it sent the call (the sidecar's read behind a `current` answer came after that).
//!
//! Invariants 6 and 7 (progress within the bound after every heal) are checked while the run
//! goes on; 8 (no panic) by a panic hook.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use etcd_client::GetOptions;
use futures_util::StreamExt as _;
use leasehold::testing::check_journal;
use leasehold::{Epoch, IdempotencyKey, Record, Store, Uuid};

use crate::history::{Entry, History};

/// A violation, with the session it concerns (if one).
pub(crate) struct Finding {
    pub(crate) session: Option<Uuid>,
    pub(crate) what: String,
}

pub(crate) async fn check(
    store: &Store,
    raw: &etcd_client::Client,
    sessions: &[Uuid],
    history: &Arc<History>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let entries = history.entries();
    for &session in sessions {
        let appends = history.appends_of(session);
        let appends = appends.lock().unwrap().clone();
        if let Err(broken) = check_journal(store, session, &appends).await {
            for violation in broken.violations {
                findings.push(Finding {
                    session: Some(session),
                    what: violation.to_string(),
                });
            }
        }
        for what in revision_order(store, raw, session, &entries).await {
            findings.push(Finding {
                session: Some(session),
                what,
            });
        }
    }
    for what in request_ids(store, sessions, history).await {
        findings.push(Finding {
            session: None,
            what,
        });
    }
    for what in validity(history, &entries) {
        findings.push(Finding {
            session: None,
            what,
        });
    }
    findings
}

/// Invariant 2 in revision order (see the module docs).
async fn revision_order(
    store: &Store,
    raw: &etcd_client::Client,
    session: Uuid,
    entries: &[Entry],
) -> Vec<String> {
    let namespace = store.namespace();
    // Every epoch of the session: acquired by a node, or fencing the journal.
    let mut epochs: Vec<Epoch> = entries
        .iter()
        .filter_map(|entry| match entry {
            Entry::Acquired {
                session: s, epoch, ..
            } if *s == session => Some(*epoch),
            _ => None,
        })
        .collect();
    let mut revoked: HashMap<Epoch, i64> = HashMap::new();
    for entry in entries {
        if let Entry::Revoked {
            session: s,
            epoch,
            revision,
            ..
        } = entry
            && *s == session
        {
            revoked.insert(*epoch, *revision);
        }
    }
    // seq → epoch, from a replay; seq → revision, from the keys.
    let mut epoch_of: BTreeMap<u64, Epoch> = BTreeMap::new();
    let mut replay = store.replay_records(session);
    while let Some(record) = replay.next().await {
        match record {
            Ok(record) => {
                if let Record::Fence(fence) = &record {
                    epochs.push(fence.epoch);
                }
                epoch_of.insert(record.seq(), record.epoch());
            }
            Err(error) => return vec![format!("replay failed: {error}")],
        }
    }
    epochs.sort();
    epochs.dedup();
    let prefix = namespace.records_prefix(session);
    let keys = match record_keys(raw, &prefix).await {
        Ok(keys) => keys,
        Err(error) => return vec![format!("reading the record keys failed: {error}")],
    };
    let mut found = Vec::new();
    for kv in keys.kvs() {
        let seq = kv
            .key_str()
            .ok()
            .and_then(|key| key.rsplit('/').next())
            .and_then(|seq| seq.parse::<u64>().ok());
        let (Some(seq), revision) = (seq, kv.create_revision()) else {
            continue;
        };
        let Some(&epoch) = epoch_of.get(&seq) else {
            continue;
        };
        if let Some(&later) = epochs.iter().find(|later| **later > epoch)
            && revision >= later.0 as i64
        {
            found.push(format!(
                "invariant 2: record {seq} of epoch {epoch} committed at revision {revision}, after epoch {later} began"
            ));
        }
        if let Some(&deleted) = revoked.get(&epoch)
            && revision > deleted
        {
            found.push(format!(
                "invariant 2: record {seq} of epoch {epoch} committed at revision {revision}, after its owner key was deleted at {deleted}"
            ));
        }
    }
    found
}

/// Invariant 4 for a sidecar's clients, by request id: every request id is in the journal at
/// most once (one append's records), and every acknowledged one exactly once, where it was told
/// (unless trimmed away).
async fn request_ids(store: &Store, sessions: &[Uuid], history: &History) -> Vec<String> {
    let mut found = Vec::new();
    for &session in sessions {
        let requests = history.requests_of(session);
        if requests.is_empty() {
            continue;
        }
        let mut appended: HashMap<IdempotencyKey, BTreeSet<(u64, u64)>> = HashMap::new();
        let mut replay = store.replay_records(session);
        while let Some(record) = replay.next().await {
            match record {
                Ok(Record::Event(event)) => {
                    if let (Some(key), Some(range)) =
                        (event.idempotency_key(), event.keyed_append())
                    {
                        appended.entry(key).or_default().insert(range);
                    }
                }
                Ok(Record::Fence(_)) => {}
                Err(error) => return vec![format!("{session}: replay failed: {error}")],
            }
        }
        let base = replay.base();
        for (key, ranges) in &appended {
            if ranges.len() > 1 {
                found.push(format!(
                    "invariant 4: session {session} holds request id {key} more than once: {ranges:?}"
                ));
            }
        }
        for (key, told) in requests {
            let Some((first, last)) = told else { continue };
            if last < base {
                continue;
            }
            match appended.get(&key) {
                None => found.push(format!(
                    "invariant 4: session {session}'s acknowledged request id {key} (told {first}..={last}) is not in the journal"
                )),
                Some(ranges) if !ranges.contains(&(first, last)) => found.push(format!(
                    "invariant 4: session {session}'s request id {key} was told {first}..={last}; the journal has it at {ranges:?}"
                )),
                Some(_) => {}
            }
        }
    }
    found
}

/// Invariant 5 (see the module docs).
fn validity(history: &History, entries: &[Entry]) -> Vec<String> {
    let mut acquired: HashMap<Uuid, Vec<(Epoch, usize, tokio::time::Instant)>> = HashMap::new();
    let mut revoked: Vec<(Uuid, Epoch)> = Vec::new();
    for entry in entries {
        match entry {
            Entry::Acquired {
                at,
                node,
                session,
                epoch,
            } => acquired
                .entry(*session)
                .or_default()
                .push((*epoch, *node, *at)),
            Entry::Revoked { session, epoch, .. } => revoked.push((*session, *epoch)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for ((session, epoch), (node, seen)) in history.valid_seen() {
        if revoked.contains(&(session, epoch)) {
            continue;
        }
        let Some(later) = acquired.get(&session) else {
            continue;
        };
        for &(newer, by, at) in later {
            if newer > epoch && seen > at {
                found.push(format!(
                    "invariant 5: node-{node} saw session {session} valid at epoch {epoch} at {:.3}s, after node-{by} acquired epoch {newer} at {:.3}s",
                    history.secs(seen),
                    history.secs(at),
                ));
            }
        }
    }
    found
}

/// The keys under `prefix` (keys only). etcd-client balances one channel over every member and
/// never fails over, so a member still down or just restarted after the campaign's last fault
/// fails about one read in three: the read is tried again, on whichever member answers, for up
/// to 10 s.
async fn record_keys(
    raw: &etcd_client::Client,
    prefix: &str,
) -> Result<etcd_client::GetResponse, etcd_client::Error> {
    let options = || Some(GetOptions::new().with_prefix().with_keys_only());
    let mut tries = 0;
    loop {
        match raw.clone().get(prefix, options()).await {
            Ok(keys) => return Ok(keys),
            Err(error) if tries >= 40 => return Err(error),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
        }
    }
}
