//! The keepalive driver on its own: a stalled stream is re-opened on another member before the
//! deadline, an opening that one member holds does not keep another member from answering,
//! and etcd saying the node lease is gone loses it at once, with nothing else to tell.

mod common;

use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{LossReason, Uuid};
use tokio::time::Instant;

/// Samples the store's node lease every 20 ms for `period`; panics at the first invalid one.
async fn stays_valid(store: &leasehold::Store, period: Duration, why: &str) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        assert!(
            store.is_node_lease_valid(),
            "the node lease stayed valid: {why}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_keepalive_stream_moves_to_another_member_before_the_deadline() {
    let etcd = common::Etcd::start().await;
    // Two ways to the same member; one of them carries the keepalive stream at any time.
    let (proxies, endpoints) = etcd.two_ways().await;
    // TTL 3 s, margin 0.5 s: renewals every second, the deadline 2.5 s after the last one
    // answered. A stream left stalled would lose the lease within 2.5 s.
    let store = common::store(&endpoints, &etcd.ns, "a", 3).await;
    let node_lease = store.node_lease_id();
    let lease = store.acquire_lease(Uuid::new_v4()).await.unwrap();

    // Silence each way in turn for longer than the TTL: whichever carries the stream stalls.
    for proxy in &proxies {
        proxy.blackhole();
        stays_valid(&store, Duration::from_secs(4), "the stream moved").await;
        proxy.heal();
    }
    assert_eq!(lease.loss_reason(), None);
    assert!(lease.is_valid());
    assert_eq!(
        store.node_lease_id(),
        node_lease,
        "the same node lease throughout"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_opening_held_by_one_member_does_not_keep_another_from_renewing() {
    let etcd = common::Etcd::start().await;
    // Three ways to the same member: the stream's way, one that holds every opening (as an
    // etcd follower does while it still forwards renewals to a dead leader), one that answers.
    let way = || leasehold::testing::FaultProxy::start(etcd.node.endpoint());
    let (stream_way, holding, answering) = (
        way().await.unwrap(),
        way().await.unwrap(),
        way().await.unwrap(),
    );
    let endpoints = [&stream_way, &holding, &answering].map(|p| p.endpoint());
    // TTL 3 s, margin 0.8 s: renewals every second, the deadline 2.2 s after the last answered
    // one was sent. The renewal after it goes unanswered on the stream's way, is given up half
    // an interval later (1.5 s), and the stream re-opened on the holding way first. Waiting out
    // that opening (a renewal interval) before trying the answering way would renew at 2.5 s,
    // past the deadline; sending the next opening a moment later renews before it.
    let options = leasehold::StoreOptions::new(endpoints)
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(800));
    let store = leasehold::Store::connect(options).await.unwrap();
    let node_lease = store.node_lease_id();
    assert!(node_lease.is_some());
    // The keepalive stream opens on the first way and renews there.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    holding.drop_replies();
    stream_way.blackhole();
    let why = "a later opening went to the answering way";
    stays_valid(&store, Duration::from_secs(4), why).await;
    assert_eq!(
        store.node_lease_id(),
        node_lease,
        "the same node lease throughout"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_lease_gone_at_etcd_is_lost_at_the_next_renewal() {
    let etcd = common::Etcd::start().await;
    let raw = &etcd.raw;
    // TTL 9 s, margin 1 s: renewals every 3 s, the deadline up to 8 s away.
    let store = etcd.store("a", 9).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let node_lease = store.node_lease_id().unwrap();

    // Detach the owner key from the node lease (same value, same create_revision: the watch
    // sees nothing that ends ownership), then revoke the node lease: it deletes nothing, so
    // only the keepalive can tell.
    let key = etcd.ns.owner_key(session);
    let value = raw.clone().get(key.as_str(), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    raw.clone().put(key.as_str(), value, None).await.unwrap();
    let revoked = Instant::now();
    raw.clone().lease_revoke(node_lease).await.unwrap();
    // Meanwhile an acquisition sends its transaction with the dead node lease: etcd refuses
    // it, and the caller is told to try again, not given an etcd error.
    assert!(store.is_node_lease_valid(), "the store does not know yet");
    match store.acquire_lease(Uuid::new_v4()).await {
        Err(error @ leasehold::AcquireError::NodeLeaseInvalid) => assert!(error.is_transient()),
        other => panic!("expected NodeLeaseInvalid, got {other:?}"),
    }

    let reason = tokio::time::timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("lost");
    let after = revoked.elapsed();
    println!("lost after {after:?}: {reason}");
    assert_eq!(reason, LossReason::KeepaliveFailed);
    assert!(
        after < Duration::from_millis(4500),
        "at the next renewal (every 3 s), not at the deadline (5 s or more): {after:?}"
    );
    // A fresh node lease replaces it.
    wait_for("a fresh node lease", Duration::from_secs(5), || async {
        store
            .node_lease_id()
            .filter(|&id| id != node_lease && store.is_node_lease_valid())
    })
    .await
    .unwrap();
}
