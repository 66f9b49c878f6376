//! Group commit: concurrent appends to one journal share transactions, and each caller is
//! still answered on its own: its own sequence numbers, in the journal in real-time order; and
//! when a shared transaction's reply is lost, or another owner fences the journal under it,
//! every caller in it learns the same truth.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::testing::{AppendHistory, check_journal};
use leasehold::{Appended, Journal, JournalWriteError, Record, Uuid};

/// Writers hold it for reading during each call: the test pauses them all by taking it for
/// writing.
type Gate = Arc<tokio::sync::RwLock<()>>;

/// Each call of one writer: its payloads and its result.
type Calls = Vec<(Vec<String>, Result<Appended, JournalWriteError>)>;

/// `writers` tasks append to `journal` until `stop` (or their first error), each call noted in
/// the shared history; every fifth call of a writer is a batch of three.
fn writers(
    journal: &Arc<Journal>,
    history: &Arc<Mutex<AppendHistory>>,
    writers: usize,
    calls: Option<usize>,
    stop: &leasehold::CancellationToken,
    gate: &Gate,
) -> Vec<tokio::task::JoinHandle<Calls>> {
    (0..writers)
        .map(|w| {
            let (journal, history, stop) = (journal.clone(), history.clone(), stop.clone());
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut results = Vec::new();
                let mut n = 0;
                while calls.is_none_or(|calls| n < calls) && !stop.is_cancelled() {
                    let _open = gate.read().await;
                    let payloads: Vec<String> = (0..if n % 5 == 4 { 3 } else { 1 })
                        .map(|i| format!("{}-w{w}-{n}-{i}", journal.epoch()))
                        .collect();
                    n += 1;
                    let call = history.lock().unwrap().invoke();
                    let result = journal.append_batch(&payloads).await;
                    history.lock().unwrap().complete(call, &payloads, &result);
                    let failed = result.is_err();
                    results.push((payloads, result));
                    if failed {
                        break;
                    }
                }
                results
            })
        })
        .collect()
}

/// The distinct transactions (nonces) of the journal's events, and the events.
async fn transactions(store: &leasehold::Store, session: Uuid) -> (usize, usize) {
    let mut nonces = HashSet::new();
    let mut events = 0;
    let mut replay = store.replay_records(session);
    while let Some(record) = replay.next().await {
        let record = record.unwrap();
        if let Record::Event(_) = record {
            nonces.insert(record.nonce());
            events += 1;
        }
    }
    (nonces.len(), events)
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_concurrent_appenders_share_transactions_and_keep_their_own_numbers() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());
    let history = Arc::new(Mutex::new(AppendHistory::default()));
    let stop = leasehold::CancellationToken::new();

    let mut calls = Vec::new();
    for task in writers(&journal, &history, 64, Some(25), &stop, &Gate::default()) {
        calls.extend(task.await.unwrap());
    }
    // Each call its own numbers: together they cover 2.. (after the fence) exactly once, a
    // batch's records contiguous.
    let mut seqs = Vec::new();
    for (payloads, result) in &calls {
        let appended = result.as_ref().expect("every append commits");
        assert_eq!(
            appended.last_seq - appended.first_seq + 1,
            payloads.len() as u64
        );
        seqs.extend(appended.first_seq..=appended.last_seq);
    }
    seqs.sort_unstable();
    let records = seqs.len() as u64;
    if let Some((seq, expected)) = seqs
        .iter()
        .zip(2..)
        .find(|(seq, expected)| **seq != *expected)
    {
        panic!("sequence number {expected} was given as {seq}: numbers overlap or skip");
    }

    let history = history.lock().unwrap().clone();
    let report = check_journal(&store, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.events, records);
    let (txns, events) = transactions(&store, session).await;
    println!(
        "{} calls, {events} records in {txns} transactions ({:.1} calls per transaction)",
        calls.len(),
        calls.len() as f64 / txns as f64
    );
    assert!(
        txns * 4 < calls.len(),
        "appends that wait for a transaction in flight share the next one"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_transactions_whose_replies_are_lost_resolve_to_the_truth_for_every_caller() {
    let a = common::ProxiedJournal::start(30).await;
    let history = Arc::new(Mutex::new(AppendHistory::default()));
    let stop = leasehold::CancellationToken::new();
    let tasks = writers(&a.journal, &history, 32, None, &stop, &Gate::default());

    // With 32 writers a shared transaction is always in flight: each loss of replies hits one.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.proxy.drop_replies();
        tokio::time::sleep(Duration::from_millis(700)).await;
        a.proxy.heal();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let mut calls = 0;
    for task in tasks {
        for (_, result) in task.await.unwrap() {
            result.expect("resolved as committed, never left unknown or failed");
            calls += 1;
        }
    }
    let history = history.lock().unwrap().clone();
    assert_eq!(history.unknown() + history.failed(), 0);
    let report = check_journal(&a.store, a.session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    let (txns, _) = transactions(&a.store, a.session).await;
    println!(
        "{calls} calls in {txns} transactions, {} records, across 4 losses of replies",
        report.events
    );
    assert!(txns * 2 < calls, "transactions were shared");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_takeover_under_shared_transactions_fences_every_caller_in_them() {
    let a = common::ProxiedJournal::start(30).await;
    let b = a.etcd.store("b", 30).await;
    let history_a = Arc::new(Mutex::new(AppendHistory::default()));
    let stop = leasehold::CancellationToken::new();
    let gate = Gate::default();
    let tasks = writers(&a.journal, &history_a, 32, None, &stop, &gate);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Pause the writers, cut a off from etcd, and let them all go at once: one transaction
    // goes out (and is held), the rest queue behind it. a still believes it owns the session.
    let paused = gate.write().await;
    a.proxy.blackhole();
    drop(paused);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // An admin hands the session to b, whose fence goes in; then a hears etcd again.
    a.etcd
        .raw
        .clone()
        .delete(a.lease.owner_key(), None)
        .await
        .unwrap();
    let lease_b = b.acquire_lease(a.session).await.unwrap();
    let journal_b = b.open_journal(a.session, Some(&lease_b)).await.unwrap();
    assert!(a.lease.is_valid(), "a does not know yet");
    a.proxy.heal();

    let fence_b = journal_b_fence_revision(&a).await;
    let mut fenced = 0;
    for task in tasks {
        for (_, result) in task.await.unwrap() {
            match result {
                Ok(appended) => assert!(appended.revision < fence_b),
                Err(JournalWriteError::Fenced(error)) => {
                    assert_eq!(error.epoch, a.lease.epoch());
                    fenced += 1;
                }
                Err(other) => panic!("a's appends end fenced, not {other:?}"),
            }
        }
    }
    // The transaction in flight failed its compare; the calls queued behind it share its
    // fate, none is sent.
    println!("{fenced} of a's callers fenced");
    assert_eq!(fenced, 32, "every caller waiting at the takeover is fenced");
    assert!(a.journal.is_broken());

    let mut history = history_a.lock().unwrap().clone();
    let result = journal_b.append("b-1").await;
    history.record(&["b-1"], &result);
    result.unwrap();
    let report = check_journal(&b, a.session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.fence_epochs, [a.lease.epoch(), lease_b.epoch()]);
}

/// The revision at which b's fence (the journal's second fence) committed.
async fn journal_b_fence_revision(a: &common::ProxiedJournal) -> i64 {
    let mut replay = a.store.replay_records(a.session);
    let mut fences = 0;
    while let Some(record) = replay.next().await {
        if let Record::Fence(fence) = record.unwrap() {
            fences += 1;
            if fences == 2 {
                let key = a.etcd.ns.record_key(a.session, fence.seq);
                let kv = a.etcd.raw.clone().get(key, None).await.unwrap();
                return kv.kvs()[0].create_revision();
            }
        }
    }
    panic!("b's fence is in the journal")
}
