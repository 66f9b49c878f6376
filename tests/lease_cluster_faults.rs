//! Leases ride out the loss of etcd's leader and a partitioned member: no false loss, and
//! keepalive and watch recover through the other members.

mod common;

use std::time::Duration;

use leasehold::testing::{EtcdCluster, random_namespace};
use leasehold::{Lease, LossReason};
use tokio::time::{Instant, timeout};
use uuid::Uuid;

/// TTL 9 s, margin 1 s: a lease survives 5 s without a renewal (2·TTL/3 − margin).
///
/// For the leader's crash: no member renews a lease until a new leader is elected, which
/// takes one to two election timeouts (1 s each) on an idle machine and has taken over 4 s on
/// this one under load. Renewals resume as soon as a new leader answers (1.0–1.6 s after the
/// crash, measured).
///
/// For the partitioned member: the renewal it holds is given up after half an interval and
/// the stream opened again on another member. At TTL 6 s that left 2 s for the new stream's
/// first answer, which a machine loaded by the rest of the suite once exceeded (the lease
/// expired); at 9 s it leaves 3.5 s.
const TTL: u64 = 9;

/// Samples every lease every 20 ms for `period`; panics at the first invalid one.
async fn stay_valid(leases: &[Lease], period: Duration, phase: &str) {
    let until = Instant::now() + period;
    while Instant::now() < until {
        for lease in leases {
            assert!(
                lease.is_valid(),
                "{phase}: false loss of {} ({:?})",
                lease.session_id(),
                lease.loss_reason()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Proves the watch works: an owner key deleted through `endpoint` is noticed at once.
async fn watch_notices_a_delete(lease: &Lease, endpoint: &str) {
    let mut raw = common::raw(endpoint).await;
    raw.delete(lease.owner_key(), None).await.unwrap();
    let reason = timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the watch recovered");
    assert_eq!(reason, LossReason::Revoked);
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_leader_causes_no_false_loss() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let ns = random_namespace();
    // The store prefers the first endpoint, where its keepalive and watch streams go: make
    // that member the leader, so that the crash takes the streams with it.
    if cluster.leader().await.unwrap() != 0 {
        cluster.move_leader(0).await.unwrap();
    }
    let store = common::store(&cluster.endpoints(), &ns, "a", TTL).await;
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }

    // --- phase: the leader crashes, under the store's streams
    let leader = cluster.leader().await.unwrap();
    assert_eq!(leader, 0);
    cluster.kill(leader).await.unwrap();
    stay_valid(&leases, Duration::from_secs(2 * TTL), "leader killed").await;

    // --- phase: the watch still works, through a surviving member
    let survivor = (leader + 1) % cluster.len();
    let probe = leases.pop().unwrap();
    watch_notices_a_delete(&probe, cluster.endpoint(survivor)).await;
    stay_valid(&leases, Duration::from_secs(1), "after the probe").await;

    // --- phase: the member comes back; nothing changes for the leases
    cluster.restart(leader).await.unwrap();
    stay_valid(&leases, Duration::from_secs(TTL), "member restarted").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_member_causes_no_false_loss() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let ns = random_namespace();
    // The store prefers the first endpoint: partition that member, under its streams.
    let store = common::store(&cluster.endpoints(), &ns, "a", TTL).await;
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.unwrap());
    }
    if cluster.leader().await.unwrap() == 0 {
        // Keep the leader elsewhere so that member 0, under the streams, is a follower.
        cluster.move_leader(1).await.unwrap();
    }
    let cut = 0;

    // --- phase: member 0 is cut off from its peers; clients still reach it
    cluster.partition(cut).await.unwrap();
    stay_valid(&leases, Duration::from_secs(2 * TTL), "member partitioned").await;
    let probe = leases.pop().unwrap();
    watch_notices_a_delete(&probe, cluster.endpoint(1)).await;

    // --- phase: healed
    cluster.heal(cut).await.unwrap();
    stay_valid(&leases, Duration::from_secs(TTL), "member healed").await;
}
