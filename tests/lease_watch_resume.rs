//! A watch that was down while its session was deleted and etcd compacted the history still
//! finds out: every restart re-reads the owner keys before following them again.

mod common;

use std::time::Duration;

use leasehold::LossReason;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace};
use tokio::time::timeout;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_delete_hidden_by_a_compaction_is_found_on_restart() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    // A long TTL: the node lease outlives the outage; only the watch can tell.
    let store = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let (deleted, kept) = (
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
    );

    // --- phase: the store is cut off; meanwhile its key is deleted and history compacted
    proxy.reject();
    let mut raw = common::raw(etcd.endpoint()).await;
    raw.delete(deleted.owner_key(), None).await.unwrap();
    raw.put(format!("{}filler", ns.prefix()), "x", None)
        .await
        .unwrap();
    let revision = raw
        .get("x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    raw.compact(revision, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(deleted.is_valid(), "nothing told the store yet");

    // --- phase: back online, the restarted watch reconciles
    proxy.heal();
    let reason = timeout(Duration::from_secs(5), deleted.lost())
        .await
        .expect("found on the watch's restart");
    assert_eq!(reason, LossReason::Revoked);
    assert!(kept.is_valid(), "the other lease is untouched");
    assert_eq!(kept.loss_reason(), None);
}
