//! After a node's deadline passes in a partition and the partition heals, its old owner keys do
//! not linger: the lost node lease is never renewed again, and it is revoked.

mod common;

use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold::LossReason;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace, wait_for};
use tokio::time::Instant;
use uuid::Uuid;

const TTL: u64 = 5;

#[tokio::test(flavor = "multi_thread")]
async fn a_healed_node_leaves_no_zombie_ownership() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    // A large margin: A's local deadline passes ~2 s before etcd would expire the lease, so the
    // partition heals while etcd still holds it.
    let a = leasehold::Store::connect(
        leasehold::StoreOptions::new([proxy.endpoint()])
            .with_namespace(ns.clone())
            .with_node("a")
            .with_ttl(Duration::from_secs(TTL), Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", TTL).await;
    let sessions: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
    let mut leases = Vec::new();
    for session in &sessions {
        leases.push(a.acquire_lease(*session).await.unwrap());
    }
    let old_node_lease = a.node_lease_id().unwrap();

    // --- phase: partitioned until A's local deadline passes
    proxy.blackhole();
    for lease in &leases {
        assert_eq!(lease.lost().await, LossReason::Expired);
    }
    // --- phase: healed while etcd still holds the old node lease
    proxy.heal();
    let healed = Instant::now();
    let taken = try_join_all(
        sessions
            .iter()
            .map(|session| b.acquire_lease_wait(*session, Duration::from_secs(TTL + 3))),
    )
    .await
    .expect("every session can be taken over within TTL + 3 s");
    let took = healed.elapsed();
    println!(
        "all {} sessions taken over {took:?} after the heal",
        taken.len()
    );
    // etcd would expire the old lease only ~2 s after the heal (TTL 5 s, margin 2 s): a
    // takeover this soon means A revoked it.
    assert!(
        took < Duration::from_secs(1),
        "taken over only after {took:?}: the old node lease was not revoked"
    );
    for (old, new) in leases.iter().zip(&taken) {
        assert!(new.epoch() > old.epoch());
    }

    // A replaced its node lease and never renewed the old one.
    wait_for("A's fresh node lease", Duration::from_secs(10), || async {
        a.node_lease_id()
            .filter(|id| *id != old_node_lease && a.is_node_lease_valid())
    })
    .await
    .unwrap();
    let raw = common::raw(etcd.endpoint()).await;
    let old = raw
        .clone()
        .lease_time_to_live(old_node_lease, None)
        .await
        .unwrap();
    assert!(
        old.ttl() <= 0,
        "the old node lease is gone (ttl {})",
        old.ttl()
    );
}
