//! Handover under load: the old owner is cut off mid-stream, the new one fences; nothing that
//! was acknowledged is lost, nothing of the old epoch follows the fence.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::JournalWriteError;
use leasehold::testing::{AppendHistory, EtcdNode, FaultProxy, check_journal, random_namespace};
use tokio::sync::Mutex;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_blackholed_writer_is_fenced_by_its_successor_without_losing_an_acknowledged_append() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store_timeout(&[proxy.endpoint()], &ns, "a", 3, Duration::from_secs(1)).await;
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", 3).await;
    let session = Uuid::new_v4();
    let history = Arc::new(Mutex::new(AppendHistory::default()));

    let lease_a = a.acquire_lease(session).await.unwrap();
    let journal_a = a.open_journal(session, Some(&lease_a)).await.unwrap();

    // --- phase: A appends continuously, alternating single events and batches
    let writer = tokio::spawn({
        let history = history.clone();
        async move {
            for i in 0.. {
                let payloads: Vec<String> = if i % 3 == 0 {
                    (0..5).map(|j| format!("a-{i}-{j}")).collect()
                } else {
                    vec![format!("a-{i}")]
                };
                let result = journal_a.append_batch(&payloads).await;
                history.lock().await.record(&payloads, &result);
                match result {
                    Ok(_) => {}
                    Err(JournalWriteError::LeaseLost(_)) => return (i, "lease lost"),
                    Err(JournalWriteError::Fenced(_)) => return (i, "fenced"),
                    Err(JournalWriteError::OutcomeUnknown(_)) => {}
                    Err(JournalWriteError::Indeterminate) => return (i, "indeterminate"),
                    Err(other) => panic!("unexpected: {other}"),
                }
            }
            unreachable!()
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;

    // --- phase: A is cut off; B stands by, takes over and fences
    proxy.blackhole();
    let lease_b = b
        .acquire_lease_wait(session, Duration::from_secs(30))
        .await
        .expect("B takes over");
    let journal_b = b.open_journal(session, Some(&lease_b)).await.unwrap();
    for i in 0..20 {
        let payload = [format!("b-{i}")];
        let result = journal_b.append_batch(&payload).await;
        history.lock().await.record(&payload, &result);
        result.expect("B appends");
    }

    // --- phase: A's partition heals; whatever it had in flight resolves
    proxy.heal();
    let (appends, ended) = tokio::time::timeout(Duration::from_secs(30), writer)
        .await
        .expect("A's writer stops")
        .unwrap();
    let history = history.lock().await.clone();
    println!(
        "A made {appends} append calls and stopped: {ended}; acknowledged {}, unknown {}, failed {}",
        history.acknowledged(),
        history.unknown(),
        history.failed()
    );
    assert!(history.acknowledged() > 20, "A was under load");

    let report = check_journal(&b, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.fence_epochs, [lease_a.epoch(), lease_b.epoch()]);
    println!("{report:?}");
}
