//! Replay streams a large journal page by page at one snapshot revision, while appends go on;
//! a corrupt value is a typed error naming its key.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use etcd_client::GetOptions;
use futures_util::StreamExt as _;
use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{Record, ReplayError, ReplayOptions};
use tokio::time::Instant;
use uuid::Uuid;

const RECORDS: u64 = 100_000;
const PAGE: usize = 1_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_thousand_records_stream_consistently_while_appends_continue() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());

    // --- phase: fill (the fence is record 1)
    let started = Instant::now();
    let mut written = 1;
    while written < RECORDS {
        let n = (RECORDS - written).min(127);
        let payloads: Vec<String> = (0..n)
            .map(|i| format!("event {:>8}", written + i))
            .collect();
        written = journal.append_batch(&payloads).await.unwrap().last_seq;
    }
    println!("wrote {written} records in {:?}", started.elapsed());

    // --- phase: replay while another task keeps appending
    let stop = Arc::new(AtomicBool::new(false));
    let appender = tokio::spawn({
        let (journal, stop) = (journal.clone(), stop.clone());
        async move {
            let mut appended = 0u64;
            while !stop.load(Ordering::Relaxed) {
                journal.append(format!("late {appended}")).await.unwrap();
                appended += 1;
            }
            appended
        }
    });
    let started = Instant::now();
    let mut replay = store.replay_with(
        session,
        ReplayOptions::default()
            .with_page_records(PAGE)
            .with_page_bytes(2 * 1024 * 1024),
    );
    let mut expected = 1;
    while let Some(record) = replay.next().await {
        let record = record.unwrap();
        assert_eq!(record.seq(), expected, "gapless, in order");
        expected += 1;
    }
    let replayed = expected - 1;
    stop.store(true, Ordering::Relaxed);
    let late = appender.await.unwrap();
    println!(
        "replayed {replayed} records in {} pages in {:?} while {late} appends went on",
        replay.pages(),
        started.elapsed()
    );

    // Consistent: exactly the journal as of the snapshot revision.
    let at_snapshot = raw
        .clone()
        .get(
            ns.tip_key(session),
            Some(GetOptions::new().with_revision(replay.revision())),
        )
        .await
        .unwrap();
    let tip = at_snapshot.kvs().first().expect("a tip at the snapshot");
    let tip_seq = u64::from_be_bytes(tip.value()[1..9].try_into().unwrap());
    assert_eq!(
        replayed, tip_seq,
        "nothing after the snapshot, nothing missing"
    );
    assert!(replayed >= RECORDS);
    // Bounded: one page at a time, never more than PAGE records.
    assert!(
        replay.pages() as u64 >= replayed / PAGE as u64,
        "{} pages",
        replay.pages()
    );
    assert!(late > 0, "appends went on during the replay");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_record_is_a_typed_error_naming_its_key() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    journal.append("fine").await.unwrap();

    let key = ns.record_key(session, 3);
    raw.put(key.as_str(), &b"\x01\x00garbage"[..], None)
        .await
        .unwrap();
    let results: Vec<_> = store.replay_records(session).collect().await;
    assert!(matches!(results[0], Ok(Record::Fence(_))));
    assert!(matches!(results[1], Ok(Record::Event(_))));
    match &results[2] {
        Err(ReplayError::Decode(error)) => {
            assert_eq!(error.key, key);
            assert!(error.to_string().contains(&key));
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    assert_eq!(results.len(), 3, "the replay stops at the error");

    // A key under r/ that is no record key at all is named too.
    let stray = format!("{}not-a-seq", ns.records_prefix(session));
    raw.delete(key.as_str(), None).await.unwrap();
    raw.put(stray.as_str(), "x", None).await.unwrap();
    let results: Vec<_> = store.replay(session).collect().await;
    match results.last() {
        Some(Err(ReplayError::Decode(error))) => assert_eq!(error.key, stray),
        other => panic!("expected a decode error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_shrink_to_fit_large_records() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    // Small records first, so that pages are sized for them; then ten 600 KiB events: a page
    // sized for the small ones takes them all, far over etcd-client's 4 MiB reply limit, and
    // must be read again, smaller.
    let mut sizes = Vec::new();
    for i in 0..20u8 {
        journal.append(vec![i; 100]).await.unwrap();
        sizes.push(100);
    }
    for i in 0..10u8 {
        journal.append(vec![b'a' + i; 600 * 1024]).await.unwrap();
        sizes.push(600 * 1024);
    }
    let mut replay = store.replay_records(session);
    let mut seqs = Vec::new();
    let mut events = Vec::new();
    while let Some(record) = replay.next().await {
        let record = record.expect("pages shrink instead of failing");
        seqs.push(record.seq());
        if let Record::Event(event) = record {
            events.push(event.payload.len());
        }
    }
    assert_eq!(seqs, (1..=31).collect::<Vec<u64>>());
    assert_eq!(events, sizes);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_whose_snapshot_is_compacted_away_is_a_typed_error() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    for i in 0..10 {
        journal.append(format!("event {i}")).await.unwrap();
    }
    let mut replay = store.replay_with(session, ReplayOptions::default().with_page_records(2));
    // The first page fixes the snapshot.
    replay.next().await.unwrap().unwrap();
    let snapshot = replay.revision();
    assert!(snapshot > 0);
    // The history moves on and is compacted past the snapshot.
    journal.append("later").await.unwrap();
    let now = common::revision(&raw).await;
    raw.clone()
        .compact(
            now,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .unwrap();
    let mut read = 1;
    let error = loop {
        match replay.next().await {
            Some(Ok(_)) => read += 1,
            Some(Err(error)) => break error,
            None => panic!("the replay ended after {read} records without noticing"),
        }
    };
    match error {
        ReplayError::Compacted { revision } => assert_eq!(revision, snapshot),
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(replay.next().await.is_none(), "the replay ends there");
    // A new replay reads the current state.
    let records = store.replay_records(session).count().await;
    assert_eq!(records, 12);
}
