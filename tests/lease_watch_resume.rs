//! A watch that was down while its session was deleted and etcd compacted the history still
//! finds out: every restart re-reads the owner keys, page by page, before following them
//! again; and a key of the store's own that nothing adopted, found by that read, is deleted.

mod common;

use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::LossReason;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace, wait_for};
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

/// Deletes `key` and compacts the history while the store behind `proxy` is cut off, then
/// lets it back: only a re-read of the owner keys can tell it.
async fn behind_its_back(
    proxy: &FaultProxy,
    raw: &mut etcd_client::Client,
    ns: &str,
    change: impl std::future::Future<Output = ()>,
) {
    proxy.reject();
    change.await;
    raw.put(format!("{ns}filler"), "x", None).await.unwrap();
    let revision = common::revision(raw).await;
    raw.compact(revision, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_reads_every_page_of_owner_keys() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let store = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    // More owner keys than one page of the re-read holds (1000).
    let mut leases: Vec<leasehold::Lease> = futures_util::stream::iter(0..1200)
        .map(|_| store.acquire_lease(Uuid::new_v4()))
        .buffer_unordered(64)
        .map(|lease| lease.unwrap())
        .collect()
        .await;
    // The last key in key order lies on the second page.
    leases.sort_by(|a, b| a.owner_key().cmp(b.owner_key()));
    let last = leases.pop().unwrap();

    let mut raw = common::raw(etcd.endpoint()).await;
    let deleting = raw.clone();
    let key = last.owner_key().to_owned();
    behind_its_back(&proxy, &mut raw, &ns.prefix(), async move {
        deleting.clone().delete(key, None).await.unwrap();
    })
    .await;
    let reason = timeout(Duration::from_secs(10), last.lost())
        .await
        .expect("found on the second page of the restart's read");
    assert_eq!(reason, LossReason::Revoked);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lost = leases.iter().filter(|lease| !lease.is_valid()).count();
    assert_eq!(lost, 0, "every other lease, on either page, is untouched");
    assert_eq!(store.held_sessions(), 1199);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_written_while_the_watch_was_down_is_deleted_on_restart() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let store = common::store(&[proxy.endpoint()], &ns, "a", 30).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let held = store.acquire_lease(Uuid::new_v4()).await.unwrap();
    let orphan = ns.owner_key(Uuid::new_v4());
    let orphan_value = common::orphan_value(&raw, &held).await;
    let node_lease = store.node_lease_id().unwrap();

    // What a late commit of an abandoned acquisition leaves, written while the watch was down.
    let writing = raw.clone();
    let key = orphan.clone();
    behind_its_back(&proxy, &mut raw, &ns.prefix(), async move {
        writing
            .clone()
            .put(
                key,
                orphan_value,
                Some(etcd_client::PutOptions::new().with_lease(node_lease)),
            )
            .await
            .unwrap();
    })
    .await;
    wait_for("the orphan deleted", Duration::from_secs(10), || async {
        (common::create_revision(&raw, &orphan).await == 0).then_some(())
    })
    .await
    .unwrap();
    assert!(held.is_valid());
}
