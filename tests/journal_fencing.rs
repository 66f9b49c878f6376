//! A newer owner's fence stops an older writer, even one whose lease still looks valid to it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{AppendHistory, EtcdNode, FaultProxy, check_journal, random_namespace};
use leasehold::{AppendError, JournalWriteError};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_second_open_fences_the_first_journal_for_good() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", 30).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let mut history = AppendHistory::default();

    let lease_a = a.acquire_lease(session).await.unwrap();
    let journal_a = Arc::new(a.open_journal(session, Some(&lease_a)).await.unwrap());
    let result = journal_a.append("a-1").await;
    history.record(&["a-1"], &result);
    result.unwrap();

    // --- phase: A cannot hear etcd; its ownership ends there, and B takes over and fences
    proxy.blackhole();
    raw.delete(lease_a.owner_key(), None).await.unwrap();
    let lease_b = b.acquire_lease(session).await.unwrap();
    let journal_b = b.open_journal(session, Some(&lease_b)).await.unwrap();
    assert!(lease_a.is_valid(), "A's lease still looks valid to A");

    // --- phase: A appends: the local check passes, etcd's compare does not
    let pending = tokio::spawn({
        let journal_a = journal_a.clone();
        async move { journal_a.append("a-2").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    let result = pending.await.unwrap();
    history.record(&["a-2"], &result);
    assert!(
        matches!(
            &result,
            Err(JournalWriteError::Fenced(AppendError { session_id, epoch }))
                if *session_id == session && *epoch == lease_a.epoch()
        ),
        "{result:?}"
    );

    // --- phase: fenced for good
    let result = journal_a.append("a-3").await;
    history.record(&["a-3"], &result);
    assert!(
        matches!(result, Err(JournalWriteError::Fenced(_))),
        "{result:?}"
    );
    let result = journal_b.append("b-1").await;
    history.record(&["b-1"], &result);
    result.unwrap();

    let report = check_journal(&b, session, &history).await.unwrap();
    assert_eq!(report.fence_epochs, [lease_a.epoch(), lease_b.epoch()]);
    assert_eq!(report.events, 2);
}
