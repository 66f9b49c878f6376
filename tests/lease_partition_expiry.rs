//! A node cut off from etcd stops being valid before anyone else can own its sessions.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::testing::{EtcdNode, FaultProxy, random_namespace};
use leasehold::{LossReason, Ownership};
use tokio::time::Instant;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_blackholed_holder_expires_before_a_standby_takes_over() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let ns = random_namespace();
    let a = common::store(&[proxy.endpoint()], &ns, "a", 3).await;
    let b = common::store(&[etcd.endpoint().to_owned()], &ns, "b", 3).await;
    let session = Uuid::new_v4();
    let held = a.acquire_lease(session).await.unwrap();
    let view_a = held.ownership();

    // --- phase: B stands by, a sampler watches both every 10 ms
    let view_b: Arc<Mutex<Option<Ownership>>> = Arc::default();
    let standby = {
        let view_b = view_b.clone();
        tokio::spawn(async move {
            let lease = b
                .acquire_lease_wait(session, Duration::from_secs(30))
                .await
                .expect("B takes over");
            *view_b.lock().unwrap() = Some(lease.ownership());
            (lease, Instant::now(), b)
        })
    };
    let sampler = {
        let (view_a, view_b) = (view_a.clone(), view_b.clone());
        tokio::spawn(async move {
            let (mut samples, mut both_valid, mut a_invalid_at) = (0u32, 0u32, None);
            loop {
                let a_valid = view_a.is_valid();
                let b = view_b.lock().unwrap().clone();
                let b_valid = b.as_ref().is_some_and(|b| b.is_valid());
                samples += 1;
                if a_valid && b_valid {
                    both_valid += 1;
                }
                if !a_valid && a_invalid_at.is_none() {
                    a_invalid_at = Some(Instant::now());
                }
                if b_valid {
                    return (samples, both_valid, a_invalid_at);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(view_a.is_valid(), "A holds while connected");

    // --- phase: A is cut off from etcd; B is not
    let cut = Instant::now();
    proxy.blackhole();
    let reason = held.lost().await;
    let a_lost_at = Instant::now();
    assert!(
        matches!(reason, LossReason::Expired | LossReason::KeepaliveFailed),
        "{reason:?}"
    );
    let (_lease_b, b_acquired_at, _b) = standby.await.unwrap();
    let (samples, both_valid, a_invalid_at) = sampler.await.unwrap();
    println!(
        "A invalid after {:?}, lost after {:?}; B acquired after {:?}; {samples} samples",
        a_invalid_at.unwrap() - cut,
        a_lost_at - cut,
        b_acquired_at - cut
    );
    assert!(a_lost_at < b_acquired_at, "A knew before B owned");
    assert!(a_invalid_at.unwrap() < b_acquired_at);
    assert_eq!(both_valid, 0, "never two valid holders");
    proxy.heal();
}
