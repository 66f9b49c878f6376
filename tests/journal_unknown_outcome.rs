//! An append whose reply is lost resolves to the truth: committed or not, even when another
//! owner fenced the journal or a trim removed its first record before the writer could ask;
//! and when nothing is left to tell (the journal deleted meanwhile), it stays unknown, never
//! fenced.

mod common;

use std::time::Duration;

use leasehold::testing::{AppendHistory, check_journal};

async fn writer() -> common::ProxiedJournal {
    common::ProxiedJournal::start(30).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_whose_reply_was_dropped_is_reported_committed() {
    let a = writer().await;
    let mut history = AppendHistory::default();

    a.proxy.drop_replies();
    let pending = a.append("x");
    // It commits; its reply never arrives.
    a.committed(2).await;
    assert!(!pending.is_finished());
    a.proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("resolved as committed");
    assert_eq!(appended.first_seq, 2);
    // Written once: the re-sends while replies were dropped only compared, never re-applied.
    let record = a.etcd.ns.record_key(a.session, 2);
    let written = a.etcd.raw.clone().get(record.as_str(), None).await.unwrap();
    assert_eq!(written.kvs()[0].version(), 1, "the record was put once");
    let result = a.journal.append("y").await;
    history.record(&["y"], &result);
    result.expect("the journal goes on");
    let report = check_journal(&a.store, a.session, &history).await.unwrap();
    assert_eq!(report.events, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_append_that_never_reached_etcd_is_sent_again_and_committed_once() {
    let a = writer().await;
    let mut history = AppendHistory::default();

    a.proxy.blackhole();
    let pending = a.append("x");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The held request is dropped with its connection: it never reached etcd.
    a.proxy.cut();
    a.proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("sent again and committed");
    assert_eq!(appended.first_seq, 2);
    let key = a.etcd.ns.record_key(a.session, 2);
    assert!(common::create_revision(&a.etcd.raw, &key).await > 0);
    let report = check_journal(&a.store, a.session, &history).await.unwrap();
    assert_eq!(report.events, 1, "exactly once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_is_found_even_after_another_owner_fenced_the_journal() {
    let a = writer().await;
    let b = a.etcd.store("b", 30).await;
    let mut history = AppendHistory::default();

    // --- phase: A's append commits; its reply is lost
    a.proxy.drop_replies();
    let pending = a.append("x");
    a.committed(2).await;

    // --- phase: before A can ask, A's ownership ends and B fences the journal
    let mut raw = a.etcd.raw.clone();
    raw.delete(a.lease.owner_key(), None).await.unwrap();
    let lease_b = b.acquire_lease(a.session).await.unwrap();
    let journal_b = b.open_journal(a.session, Some(&lease_b)).await.unwrap();

    // --- phase: A hears back: its re-send's compare fails, and the record it reads is its own
    a.proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("committed, not fenced");
    assert_eq!(appended.first_seq, 2);
    let result = journal_b.append("y").await;
    history.record(&["y"], &result);
    result.unwrap();

    let report = check_journal(&b, a.session, &history).await.unwrap();
    assert_eq!(report.fence_epochs, [a.lease.epoch(), lease_b.epoch()]);
    assert_eq!(report.records, 4, "fence, x, fence, y");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_is_found_even_after_a_trim_removed_its_first_record() {
    let a = writer().await;
    let connection =
        leasehold::Connection::connect(leasehold::ConnectOptions::new([a.etcd.node.endpoint()]))
            .await
            .unwrap();
    let admin = leasehold::Admin::new(connection, a.etcd.ns.clone());
    let mut history = AppendHistory::default();

    // --- phase: A's three-record append (2, 3, 4) commits; its reply is lost
    a.proxy.drop_replies();
    let journal = a.journal.clone();
    let pending = tokio::spawn(async move { journal.append_batch(&["x", "y", "z"]).await });
    a.committed(4).await;

    // --- phase: before A can ask, a trim removes 2 and 3, the append's first records
    let trimmed = admin.trim(a.session, 4).await.unwrap();
    assert_eq!(trimmed.base, 4);

    // --- phase: A hears back: its re-send's compare fails, and its first record is gone
    a.proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x", "y", "z"], &result);
    let appended = result.expect("committed (the tip is its own), not fenced");
    assert_eq!((appended.first_seq, appended.last_seq), (2, 4));
    let result = a.journal.append("after").await;
    history.record(&["after"], &result);
    result.expect("the journal goes on");
    let report = check_journal(&a.store, a.session, &history).await.unwrap();
    assert_eq!(report.records, 2, "z and after: the rest was trimmed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_whose_journal_was_deleted_since_is_unknown_not_fenced() {
    let a = writer().await;

    // --- phase: A's append commits; its reply is lost
    a.proxy.drop_replies();
    let pending = a.append("x");
    a.committed(2).await;

    // --- phase: before A can ask, the whole journal is deleted from outside
    let prefix = a.etcd.ns.journal_prefix(a.session);
    let mut raw = a.etcd.raw.clone();
    let options = etcd_client::DeleteOptions::new().with_prefix();
    let deleted = raw.delete(prefix, Some(options)).await.unwrap();
    assert!(deleted.deleted() >= 3, "fence, x and the tip");

    // --- phase: A hears back: nothing is left to tell whether x committed
    a.proxy.heal();
    let error = pending.await.unwrap().unwrap_err();
    assert!(
        matches!(error, leasehold::JournalWriteError::OutcomeUnknown(_)),
        "unknown, never fenced: {error:?}"
    );
    assert!(a.journal.is_broken());
}
