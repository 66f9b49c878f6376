//! Background work is bounded: closing a store cut off from etcd, with deletes in flight, takes
//! no longer than its bounded revoke, not a retry deadline per task.

mod common;

use std::time::Duration;

use leasehold::Uuid;
use leasehold::testing::FaultProxy;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread")]
async fn close_is_bounded_with_deletes_in_flight() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &etcd.ns, "a", 10).await;
    let mut leases = Vec::new();
    for _ in 0..5 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }

    // --- phase: cut off; the dropped leases' deletes hang in flight
    proxy.blackhole();
    drop(leases);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), store.close())
        .await
        .expect("close finishes");
    let took = started.elapsed();
    println!("close took {took:?} with 5 deletes in flight");
    // The revoke of the node lease is bounded at 3 s; nothing else may wait.
    assert!(took < Duration::from_millis(3_800), "close took {took:?}");
    proxy.heal();
}
