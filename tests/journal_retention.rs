//! Retention: a large journal trimmed to its tail while its owner appends, stale trims refused,
//! journals deleted only by their owner or, once nobody owns them, by an operator.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::admin::Admin;
use leasehold::testing::{AppendHistory, check_journal};
use leasehold::{
    ConnectOptions, Connection, JournalWriteError, Record, RetentionError, Trimmed, Uuid,
};
use tokio::time::Instant;

const RECORDS: u64 = 100_000;
const KEEP: u64 = 1_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_thousand_records_are_trimmed_to_the_last_thousand_while_the_owner_appends() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());
    let history = Arc::new(Mutex::new(AppendHistory::default()));

    // --- phase: fill (the fence is record 1)
    let started = Instant::now();
    let mut tip = 1;
    while tip < RECORDS {
        let n = (RECORDS - tip).min(127);
        let payloads: Vec<String> = (0..n).map(|i| format!("fill {}", tip + i)).collect();
        let result = journal.append_batch(&payloads).await;
        history.lock().unwrap().record(&payloads, &result);
        tip = result.unwrap().last_seq;
    }
    println!("wrote {tip} records in {:?}", started.elapsed());

    // --- phase: trim to the last thousand while another task keeps appending
    let appending = Arc::new(tokio::sync::Notify::new());
    let stop = tokio_util::sync::CancellationToken::new();
    let appender = tokio::spawn({
        let (journal, history, stop, appending) = (
            journal.clone(),
            history.clone(),
            stop.clone(),
            appending.clone(),
        );
        async move {
            let mut n = 0u64;
            while !stop.is_cancelled() {
                let payload = format!("late {n}");
                let invocation = history.lock().unwrap().invoke();
                let result = journal.append(&payload).await;
                history
                    .lock()
                    .unwrap()
                    .complete(invocation, &[&payload], &result);
                result.expect("a trim never fences the writer");
                n += 1;
                appending.notify_one();
            }
            n
        }
    });
    appending.notified().await;
    let started = Instant::now();
    let before = RECORDS - KEEP + 1;
    let trimmed = journal.trim(before).await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        trimmed,
        Trimmed {
            base: before,
            removed: before - 1
        }
    );
    // Idempotent: trimming as far again changes nothing.
    assert_eq!(
        journal.trim(before).await.unwrap(),
        Trimmed {
            base: before,
            removed: 0
        }
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let late = appender.await.unwrap();
    println!(
        "trimmed {} records in {took:?} while {late} appends went on",
        before - 1
    );
    assert!(late > 0, "appends went on during the trim");

    // --- the journal holds exactly the kept tail and every later append
    let records = common::count(&etcd.raw, &etcd.ns.records_prefix(session)).await as u64;
    assert_eq!(records, KEEP + late);
    let mut replay = store.replay_records(session);
    let first = replay.next().await.unwrap().unwrap();
    assert_eq!(first.seq(), before);
    assert_eq!(replay.base(), before);
    let mut last = first.seq();
    while let Some(record) = replay.next().await {
        let record = record.unwrap();
        assert_eq!(record.seq(), last + 1);
        last = record.seq();
    }
    assert_eq!(last, RECORDS + late);
    let history = history.lock().unwrap().clone();
    let report = check_journal(&store, session, &history).await.unwrap();
    assert_eq!(report.records, KEEP + late);

    // --- beyond the tip: refused, typed; the last record is always kept
    let error = journal.trim(last + 1).await.unwrap_err();
    assert!(
        matches!(error, RetentionError::BeyondTip { before, tip } if before == last + 1 && tip == last),
        "{error:?}"
    );
    journal.trim(last).await.unwrap();
    let report = check_journal(&store, session, &history).await.unwrap();
    assert_eq!(report.records, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trim_by_a_stale_epoch_is_refused_and_changes_nothing() {
    let etcd = common::Etcd::start().await;
    let (proxies, endpoints) = etcd.two_ways().await;
    // TTL 3 s, margin 0.5 s: A's keepalive moves to the second way within the TTL when the
    // first one goes silent, so A's lease stays valid while its watch hears nothing.
    let a = common::store(&endpoints, &etcd.ns, "a", 3).await;
    let session = Uuid::new_v4();
    let lease = a.acquire_lease(session).await.unwrap();
    let journal = a.open_journal(session, Some(&lease)).await.unwrap();
    let payloads: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
    journal.append_batch(&payloads).await.unwrap();

    // --- phase: A's first way goes silent (its watch with it); B takes the session over
    proxies[0].blackhole();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(lease.is_valid(), "A's keepalive moved to the second way");
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    let b = etcd.store("b", 10).await;
    let b_lease = b.acquire_lease(session).await.unwrap();
    assert!(lease.is_valid(), "A has not heard of it");

    // --- A's trim reads and compares the owner key: refused, typed, nothing changed
    let error = journal.trim(10).await.unwrap_err();
    match error {
        RetentionError::NotOwner {
            session: s,
            epoch,
            owner,
        } => {
            assert_eq!(
                (s, epoch, owner),
                (session, lease.epoch(), Some(b_lease.epoch()))
            );
        }
        // The watch may have heard after all (the blackhole holds bytes, it does not lose
        // them), but then the refusal must still be typed and nothing trimmed.
        RetentionError::LeaseLost(_) => panic!("A heard of the loss before trimming: {error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        common::create_revision(&etcd.raw, &etcd.ns.base_key(session)).await,
        0,
        "no base written"
    );
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.records_prefix(session)).await,
        21
    );
    proxies[0].heal();

    // --- and once A knows, it refuses locally
    tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("A learns of the loss");
    let error = journal.trim(10).await.unwrap_err();
    assert!(matches!(error, RetentionError::LeaseLost(_)), "{error:?}");
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.records_prefix(session)).await,
        21
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn journals_are_deleted_by_their_owner_or_by_an_operator_once_nobody_owns_them() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    let admin = Admin::new(connection, etcd.ns.clone());

    // --- an operator trims without a lease, and cannot delete an owned session's journal
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let payloads: Vec<String> = (0..30).map(|i| format!("e{i}")).collect();
    journal.append_batch(&payloads).await.unwrap();
    assert_eq!(
        admin.trim(session, 11).await.unwrap(),
        Trimmed {
            base: 11,
            removed: 10
        }
    );
    let info = admin.journal(session).await.unwrap();
    assert_eq!(
        (info.base, info.tip.map(|t| t.seq), info.len()),
        (11, Some(31), 21)
    );
    journal.append("after the trim").await.unwrap();
    let error = admin.delete_journal(session).await.unwrap_err();
    assert!(
        matches!(error, RetentionError::Owned { owner, .. } if owner == lease.epoch()),
        "{error:?}"
    );

    // --- the owner deletes it: every key, and its own journal is fenced by it
    let deleted = store.delete_journal(session, &lease).await.unwrap();
    assert_eq!(deleted.keys, 22 + 2, "records, tip and base");
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.journal_prefix(session)).await,
        0
    );
    let error = journal.append("after the delete").await.unwrap_err();
    assert!(matches!(error, JournalWriteError::Fenced(_)), "{error:?}");
    assert_eq!(store.delete_journal(session, &lease).await.unwrap().keys, 0);
    lease.release().await.unwrap();

    // --- a finished session: the operator deletes it; a new owner starts afresh at 1
    let finished = Uuid::new_v4();
    let lease = store.acquire_lease(finished).await.unwrap();
    let journal = store.open_journal(finished, Some(&lease)).await.unwrap();
    journal.append("done").await.unwrap();
    drop(journal);
    lease.release().await.unwrap();
    assert_eq!(admin.delete_journal(finished).await.unwrap().keys, 3);
    let lease = store.acquire_lease(finished).await.unwrap();
    let journal = store.open_journal(finished, Some(&lease)).await.unwrap();
    assert_eq!(journal.append("again").await.unwrap().first_seq, 2);
    let records: Vec<Record> = store
        .replay_records(finished)
        .map(Result::unwrap)
        .collect()
        .await;
    assert!(matches!(&records[0], Record::Fence(f) if f.previous.is_none()));
    assert_eq!(records.len(), 2);
}
