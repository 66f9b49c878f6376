//! A standby acquisition wakes on the holder's release, and gives up at its deadline.

mod common;

use std::time::Duration;

use leasehold::AcquireError;
use tokio::time::Instant;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_wakes_on_release_and_acquires() {
    let etcd = common::Etcd::start().await;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let session = Uuid::new_v4();
    let held = a.acquire_lease(session).await.unwrap();

    let standby = tokio::spawn(async move {
        let lease = b.acquire_lease_wait(session, Duration::from_secs(30)).await;
        (lease, Instant::now(), b)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!standby.is_finished(), "stands by while held");
    let released = Instant::now();
    held.release().await.unwrap();
    let (lease, acquired, _b) = standby.await.unwrap();
    let lease = lease.expect("acquired after the release");
    let handover = acquired - released;
    println!("graceful handover took {handover:?}");
    assert!(lease.epoch() > held.epoch());
    // The backstop re-check runs every 5 s: this fast, it was the watch event.
    assert!(handover < Duration::from_secs(2), "{handover:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_gives_up_cleanly_at_its_deadline() {
    let etcd = common::Etcd::start().await;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let session = Uuid::new_v4();
    let held = a.acquire_lease(session).await.unwrap();

    let started = Instant::now();
    let result = b.acquire_lease_wait(session, Duration::from_secs(2)).await;
    let waited = started.elapsed();
    match result {
        Err(AcquireError::TimedOut { session_id, waited }) => {
            assert_eq!(session_id, session);
            assert_eq!(waited, Duration::from_secs(2));
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(4));
    assert_eq!(b.held_sessions(), 0);
    // Cancellation by drop leaves nothing behind either.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        b.acquire_lease_wait(session, Duration::from_secs(60)),
    )
    .await;
    assert!(cancelled.is_err());
    assert_eq!(b.held_sessions(), 0);

    // --- and once A lets go, no owner key of B's ever appears: nothing stood by on
    let key = held.owner_key().to_owned();
    let mut history = etcd.raw.clone().watch(key.as_str(), None).await.unwrap();
    held.release().await.unwrap();
    let puts = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let response = history.message().await.unwrap().unwrap();
            if response
                .events()
                .iter()
                .any(|e| e.event_type() == etcd_client::EventType::Put)
            {
                return;
            }
        }
    })
    .await;
    assert!(puts.is_err(), "B acquired after its standby ended");
    assert_eq!(common::create_revision(&etcd.raw, &key).await, 0);
}

/// The standby's backstop against a lost watch event is a read of the owner key: while the key
/// is held, re-checks send no transaction (each would be a raft proposal, even when its compare
/// fails); once the key is gone, the acquisition goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_standbys_recheck_reads_and_sends_no_transaction_while_the_key_is_held() {
    let etcd = common::Etcd::start().await;
    let a = etcd.store("a", 10).await;
    let options = leasehold::StoreOptions::new([etcd.node.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("b")
        .with_ttl(Duration::from_secs(10), Duration::from_secs(1))
        .with_standby_recheck(Duration::from_millis(100));
    let b = leasehold::Store::connect(options).await.unwrap();
    let session = Uuid::new_v4();
    let held = a.acquire_lease(session).await.unwrap();

    // --- phase: 2 s of standing by, some 20 re-checks: one transaction, the first attempt
    let before = common::txns(etcd.node.endpoint()).await;
    let waited = b.acquire_lease_wait(session, Duration::from_secs(2)).await;
    assert!(
        matches!(waited, Err(AcquireError::TimedOut { .. })),
        "{waited:?}"
    );
    let sent = common::txns(etcd.node.endpoint()).await - before;
    assert_eq!(sent, 1.0, "the first attempt only; the re-checks read");

    // --- phase: released: the standby acquires
    let standby = tokio::spawn(async move {
        let lease = b.acquire_lease_wait(session, Duration::from_secs(10)).await;
        (lease.map(|lease| lease.epoch()), b)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    let (epoch, b) = standby.await.unwrap();
    assert!(epoch.unwrap() > held.epoch());
    a.close().await;
    b.close().await;
}
