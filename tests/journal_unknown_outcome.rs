//! An append whose reply is lost resolves to the truth: committed or not, and even when
//! another owner fenced the journal before the writer could ask.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{
    AppendHistory, EtcdNode, FaultProxy, check_journal, random_namespace, wait_for,
};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_whose_reply_was_dropped_is_reported_committed() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease = a.acquire_lease(session).await.unwrap();
    let journal = Arc::new(a.open_journal(session, Some(&lease)).await.unwrap());
    let mut history = AppendHistory::default();

    proxy.drop_replies();
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.append("x").await }
    });
    // It commits; its reply never arrives.
    let key = ns.record_key(session, 2);
    wait_for("the append to commit", Duration::from_secs(5), || async {
        (common::create_revision(&raw, &key).await > 0).then_some(())
    })
    .await
    .unwrap();
    assert!(!pending.is_finished());
    proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("resolved as committed");
    assert_eq!(appended.first_seq, 2);
    let result = journal.append("y").await;
    history.record(&["y"], &result);
    result.expect("the journal goes on");
    let report = check_journal(&a, session, &history).await.unwrap();
    assert_eq!(report.events, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_append_that_never_reached_etcd_is_sent_again_and_committed_once() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease = a.acquire_lease(session).await.unwrap();
    let journal = Arc::new(a.open_journal(session, Some(&lease)).await.unwrap());
    let mut history = AppendHistory::default();

    proxy.blackhole();
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.append("x").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The held request is dropped with its connection: it never reached etcd.
    proxy.cut();
    proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("sent again and committed");
    assert_eq!(appended.first_seq, 2);
    assert!(common::create_revision(&raw, &ns.record_key(session, 2)).await > 0);
    let report = check_journal(&a, session, &history).await.unwrap();
    assert_eq!(report.events, 1, "exactly once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_committed_append_is_found_even_after_another_owner_fenced_the_journal() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", 30).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let lease_a = a.acquire_lease(session).await.unwrap();
    let journal_a = Arc::new(a.open_journal(session, Some(&lease_a)).await.unwrap());
    let mut history = AppendHistory::default();

    // --- phase: A's append commits; its reply is lost
    proxy.drop_replies();
    let pending = tokio::spawn({
        let journal = journal_a.clone();
        async move { journal.append("x").await }
    });
    let key = ns.record_key(session, 2);
    wait_for("the append to commit", Duration::from_secs(5), || async {
        (common::create_revision(&raw, &key).await > 0).then_some(())
    })
    .await
    .unwrap();

    // --- phase: before A can ask, A's ownership ends and B fences the journal
    raw.delete(lease_a.owner_key(), None).await.unwrap();
    let lease_b = b.acquire_lease(session).await.unwrap();
    let journal_b = b.open_journal(session, Some(&lease_b)).await.unwrap();

    // --- phase: A hears back: its re-send's compare fails, and the record it reads is its own
    proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["x"], &result);
    let appended = result.expect("committed, not fenced");
    assert_eq!(appended.first_seq, 2);
    let result = journal_b.append("y").await;
    history.record(&["y"], &result);
    result.unwrap();

    let report = check_journal(&b, session, &history).await.unwrap();
    assert_eq!(report.fence_epochs, [lease_a.epoch(), lease_b.epoch()]);
    assert_eq!(report.records, 4, "fence, x, fence, y");
}
