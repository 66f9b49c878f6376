//! Closing a store loses all its leases and leaves no owner keys behind.

mod common;

use std::time::Duration;

use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{AcquireError, LossReason};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn closing_a_store_loses_its_leases_and_deletes_their_keys() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let raw = common::raw(etcd.endpoint()).await;
    let mut leases = Vec::new();
    for _ in 0..10 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }
    assert_eq!(common::count(&raw, &ns.owners_prefix()).await, 10);

    tokio::time::timeout(Duration::from_secs(10), store.close())
        .await
        .expect("close finishes");
    for lease in &leases {
        assert_eq!(lease.lost().await, LossReason::StoreClosed);
        assert!(!lease.is_valid());
    }
    assert_eq!(common::count(&raw, &ns.owners_prefix()).await, 0);
    store.close().await; // idempotent
    assert!(matches!(
        store.acquire_lease(Uuid::new_v4()).await,
        Err(AcquireError::StoreClosed)
    ));
    // Releasing after the close is harmless.
    for lease in &leases {
        lease.release().await.unwrap();
    }
}
