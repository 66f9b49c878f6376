//! The watch tells a holder of a loss long before the next keepalive would.

mod common;

use std::time::Duration;

use leasehold::LossReason;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

/// With a 30 s TTL, renewals go out every 10 s: anything faster came from the watch.
const TTL: u64 = 30;
const WATCH_BOUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_owner_key_from_outside_revokes_the_lease_at_once() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", TTL).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let lease = store.acquire_lease(Uuid::new_v4()).await.unwrap();

    let deleted = Instant::now();
    raw.delete(lease.owner_key(), None).await.unwrap();
    let reason = timeout(WATCH_BOUND, lease.lost())
        .await
        .expect("watch-driven");
    println!("lost after {:?}", deleted.elapsed());
    assert_eq!(reason, LossReason::Revoked);
    assert!(!lease.is_valid());
}

#[tokio::test(flavor = "multi_thread")]
async fn revoking_the_node_lease_from_outside_revokes_every_lease_at_once() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", TTL).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let leases = [
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
    ];

    let revoked = Instant::now();
    raw.lease_revoke(store.node_lease_id().unwrap())
        .await
        .unwrap();
    for lease in &leases {
        let reason = timeout(WATCH_BOUND, lease.lost())
            .await
            .expect("watch-driven");
        assert_eq!(reason, LossReason::Revoked);
    }
    println!("both lost after {:?}", revoked.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_created_anew_while_the_watch_was_down_overtakes_the_lease() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let store = common::store(&[proxy.endpoint()], &ns, "a", TTL).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let lease = store.acquire_lease(Uuid::new_v4()).await.unwrap();

    // --- phase: the store hears nothing; meanwhile its key is deleted and created anew, and
    // etcd's history of it compacted away
    proxy.drop_replies();
    let key = lease.owner_key().to_owned();
    raw.delete(key.as_str(), None).await.unwrap();
    let put = raw.put(key.as_str(), "someone else", None).await.unwrap();
    let revision = put.header().unwrap().revision();
    raw.compact(revision, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(lease.loss_reason().is_none(), "it heard nothing yet");

    // --- the watch comes back and finds the key created anew: overtaken, not revoked
    let healed = Instant::now();
    proxy.heal();
    let reason = timeout(WATCH_BOUND, lease.lost())
        .await
        .expect("found when the watch restarts");
    println!("lost after {:?}", healed.elapsed());
    assert_eq!(reason, LossReason::Overtaken);
}
