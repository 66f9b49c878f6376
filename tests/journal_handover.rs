//! Handover under load: the old owner is cut off mid-stream and its ownership revoked; the new
//! one fences at once. The old owner's append in flight reaches etcd only after the fence and
//! is refused, and the old owner learns it is fenced; nothing that was acknowledged is lost,
//! nothing of the old epoch follows the fence.

mod common;

use std::time::Duration;

use leasehold::JournalWriteError;
use leasehold::testing::{AppendHistory, EtcdNode, FaultProxy, check_journal, random_namespace};
use tokio::time::Instant;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_writer_is_fenced_by_its_successor_without_losing_an_acknowledged_append() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store_timeout(&[proxy.endpoint()], &ns, "a", 3, Duration::from_secs(1)).await;
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", 3).await;
    let session = Uuid::new_v4();

    let lease_a = a.acquire_lease(session).await.unwrap();
    let journal_a = a.open_journal(session, Some(&lease_a)).await.unwrap();

    // --- phase: A appends continuously, alternating single events and batches; its history
    // is its own
    let writer = tokio::spawn(async move {
        let mut history = AppendHistory::default();
        for i in 0.. {
            let payloads: Vec<String> = if i % 3 == 0 {
                (0..5).map(|j| format!("a-{i}-{j}")).collect()
            } else {
                vec![format!("a-{i}")]
            };
            let result = journal_a.append_batch(&payloads).await;
            history.record(&payloads, &result);
            let ended = match result {
                Ok(_) => continue,
                Err(JournalWriteError::Fenced(_)) => "fenced",
                Err(JournalWriteError::LeaseLost(_)) => "lease lost",
                Err(JournalWriteError::OutcomeUnknown(_)) => "outcome unknown",
                Err(other) => panic!("unexpected: {other}"),
            };
            return (history, ended, Instant::now());
        }
        unreachable!()
    });
    tokio::time::sleep(Duration::from_millis(800)).await;

    // --- phase: A's appends stop reaching etcd (their connections close before they are
    // forwarded), so one is in flight, re-sent, uncommitted; then A goes deaf
    proxy.reject_requests_containing("a-");
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.drop_replies();

    // --- phase: an operator revokes A's ownership; B, standing by, takes over and fences
    // while A still believes it owns the session
    let mut raw = common::raw(etcd.endpoint()).await;
    raw.delete(ns.owner_key(session), None).await.unwrap();
    let lease_b = b
        .acquire_lease_wait(session, Duration::from_secs(5))
        .await
        .expect("B takes over");
    let journal_b = b.open_journal(session, Some(&lease_b)).await.unwrap();
    let mut history_b = AppendHistory::default();
    for i in 0..20 {
        let payload = [format!("b-{i}")];
        let result = journal_b.append_batch(&payload).await;
        history_b.record(&payload, &result);
        result.expect("B appends");
    }
    // A's re-sends reach etcd again, after B's fence (their replies still lost).
    proxy.clear_request_filter();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(lease_a.is_valid(), "A has heard nothing yet");

    // --- phase: A's link heals; its append in flight reaches etcd after B's fence
    let healed = Instant::now();
    proxy.heal();
    let (history_a, ended, at) = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("A's writer stops")
        .unwrap();
    println!(
        "A stopped {:?} after the heal: {ended}; acknowledged {}, unknown {}, failed {}",
        at - healed,
        history_a.acknowledged(),
        history_a.unknown(),
        history_a.failed()
    );
    assert!(history_a.acknowledged() > 0, "A was writing");
    assert_eq!(ended, "fenced", "A's last append was refused by B's fence");
    assert!(at > healed, "its transaction was in flight across the heal");

    let mut history = history_a;
    history.merge(&history_b);
    let report = check_journal(&b, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.fence_epochs, [lease_a.epoch(), lease_b.epoch()]);
    assert_eq!(report.events as usize, history.acknowledged());
}
