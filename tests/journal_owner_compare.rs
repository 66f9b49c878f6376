//! The owner-key compare of an append refuses it at etcd on its own: the tip is unchanged, the
//! record key is free, and the writer has not heard that its owner key is gone, yet nothing is
//! written.

mod common;

use std::time::Duration;

use leasehold::testing::{AppendHistory, FaultProxy, check_journal};
use leasehold::{JournalWriteError, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn an_append_after_the_owner_key_is_gone_is_refused_by_its_owner_compare() {
    let common::ProxiedJournal {
        journal,
        lease: _lease,
        store,
        session,
        proxy,
        etcd,
    } = common::ProxiedJournal::start(3).await;
    let mut history = AppendHistory::default();
    let result = journal.append("before").await;
    history.record(&["before"], &result);
    result.unwrap();

    // --- phase: A hears nothing back (its watch is silent); its owner key goes
    proxy.drop_replies();
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.append("stale").await }
    });

    // --- its sends reach etcd, with the tip and record 3 as A expects: only the owner compare
    // can refuse them
    tokio::time::sleep(Duration::from_secs(1)).await;
    let record = etcd.ns.record_key(session, 3);
    assert_eq!(
        common::create_revision(&etcd.raw, &record).await,
        0,
        "the stale append was refused at etcd"
    );
    let result = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("settled once the lease expires")
        .unwrap();
    history.record(&["stale"], &result);
    assert!(
        matches!(
            result,
            Err(JournalWriteError::OutcomeUnknown(_) | JournalWriteError::Fenced(_))
        ),
        "{result:?}"
    );
    proxy.heal();
    assert_eq!(common::create_revision(&etcd.raw, &record).await, 0);
    let report = check_journal(&store, session, &history).await.unwrap();
    assert_eq!(report.events, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fence_sent_after_the_owner_key_is_gone_is_refused_by_its_owner_compare() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &etcd.ns, "a", 3).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let record = etcd.ns.record_key(session, 1);

    // --- phase: the open reads the owner key (still A's); its fence is held back
    proxy.reject_requests_containing(record.as_bytes());
    let opening = tokio::spawn({
        let store_lease = (store, lease);
        async move {
            let (store, lease) = store_lease;
            let opened = store.open_journal(session, Some(&lease)).await;
            (opened.map(|_| ()), store, lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // --- phase: A goes deaf, its owner key goes, and its fence is let through
    proxy.drop_replies();
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    proxy.clear_request_filter();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        common::create_revision(&etcd.raw, &record).await,
        0,
        "the fence was refused at etcd"
    );
    let (opened, _store, _lease) = tokio::time::timeout(Duration::from_secs(10), opening)
        .await
        .expect("settled once the lease expires")
        .unwrap();
    assert!(opened.is_err(), "{opened:?}");
    proxy.heal();
    assert_eq!(common::create_revision(&etcd.raw, &record).await, 0);
}
