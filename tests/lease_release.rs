//! Release is idempotent, resolves lost() first, frees the session for a higher epoch, and a
//! release left to the background lands once etcd takes it.

mod common;

use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{LossReason, Store, StoreOptions, WritePolicy};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn release_three_times_is_ok_and_hands_over_to_a_higher_epoch() {
    let etcd = common::Etcd::start().await;
    let ns = &etcd.ns;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let raw = &etcd.raw;
    let session = Uuid::new_v4();
    let lease = a.acquire_lease(session).await.unwrap();
    let lost = lease.lost();
    let view = lease.ownership();

    for _ in 0..3 {
        lease.release().await.expect("release is idempotent");
    }
    assert_eq!(lost.await, LossReason::Released);
    assert_eq!(lease.lost().await, LossReason::Released);
    assert!(!lease.is_valid());
    assert!(!view.is_valid(), "the ownership view sees the release");
    assert_eq!(
        common::create_revision(raw, &ns.owner_key(session)).await,
        0
    );

    let next = b.acquire_lease(session).await.expect("free after release");
    assert!(next.epoch() > lease.epoch());
    assert_eq!(a.held_sessions(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_lease_releases_it_in_the_background() {
    let etcd = common::Etcd::start().await;
    let ns = &etcd.ns;
    let a = etcd.store("a", 10).await;
    let raw = &etcd.raw;
    let session = Uuid::new_v4();
    let lease = a.acquire_lease(session).await.unwrap();
    let view = lease.ownership();
    drop(lease);
    assert_eq!(view.lost().await, LossReason::Released);
    let key = ns.owner_key(session);
    wait_for(
        "the dropped lease's key to go",
        Duration::from_secs(5),
        || async { (common::create_revision(raw, &key).await == 0).then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_release_never_deletes_the_successors_key() {
    let etcd = common::Etcd::start().await;
    let ns = &etcd.ns;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let raw = &etcd.raw;
    let session = Uuid::new_v4();
    let key = ns.owner_key(session);
    let stale = a.acquire_lease(session).await.unwrap();

    // An admin takes the session from a; b owns it at once.
    raw.clone().delete(key.as_str(), None).await.unwrap();
    let successor = b.acquire_lease(session).await.unwrap();
    assert!(successor.epoch() > stale.epoch());

    // a's release still sends its delete (its node lease is alive): etcd refuses it, since
    // the key it names was created at a's epoch and that key is gone.
    stale
        .release()
        .await
        .expect("a release that finds nothing of its own is fine");
    assert_eq!(
        common::create_revision(raw, &key).await,
        successor.epoch().0 as i64,
        "b's key stands"
    );
    let alive = tokio::time::timeout(Duration::from_secs(1), successor.lost()).await;
    assert!(alive.is_err(), "b keeps its lease: {alive:?}");
    assert!(successor.is_valid());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_release_rides_out_an_outage() {
    let etcd = common::Etcd::start().await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.node.endpoint())
        .await
        .unwrap();
    let a = common::store(&[proxy.endpoint()], &etcd.ns, "a", 10).await;
    let session = Uuid::new_v4();
    let key = etcd.ns.owner_key(session);
    let lease = a.acquire_lease(session).await.unwrap();

    // The release is refused on its way to etcd (its connection closed, the streams' left
    // alone: no watch restart tidies up after it); it is sent again until it lands.
    proxy.reject_requests_containing(key.clone());
    drop(lease);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(common::create_revision(&etcd.raw, &key).await > 0);
    proxy.clear_request_filter();
    wait_for("the release to land", Duration::from_secs(5), || async {
        (common::create_revision(&etcd.raw, &key).await == 0).then_some(())
    })
    .await
    .unwrap();
    assert!(a.is_node_lease_valid(), "the node lease lived through it");
}

/// A background release cut off for longer than the write's deadline is not abandoned: the
/// node lease lives, so the owner key must go, and the job sends its guarded delete again
/// until it lands.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_release_outlasting_the_write_deadline_is_sent_again() {
    const DEADLINE: Duration = Duration::from_secs(2);
    let etcd = common::Etcd::start().await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.node.endpoint())
        .await
        .unwrap();
    let options = StoreOptions::new([proxy.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(10), Duration::from_secs(1))
        .with_write_policy(WritePolicy::default().with_deadline(DEADLINE));
    let a = Store::connect(options).await.expect("store connects");
    let session = Uuid::new_v4();
    let key = etcd.ns.owner_key(session);
    let lease = a.acquire_lease(session).await.unwrap();

    // Every send of the release is cut before etcd sees it, for three write deadlines.
    proxy.reject_requests_containing(key.clone());
    drop(lease);
    tokio::time::sleep(DEADLINE * 3).await;
    assert!(common::create_revision(&etcd.raw, &key).await > 0);
    proxy.clear_request_filter();
    wait_for("the release to land", Duration::from_secs(10), || async {
        (common::create_revision(&etcd.raw, &key).await == 0).then_some(())
    })
    .await
    .unwrap();
    assert!(a.is_node_lease_valid(), "the node lease lived through it");
}

/// A background release ends with its node lease: once the lease its owner key is attached to
/// is gone (revoked here, which deletes the key), nothing is left to delete, and the job stops
/// sending.
#[tokio::test(flavor = "multi_thread")]
async fn a_background_release_stops_sending_once_its_node_lease_is_lost() {
    let etcd = common::Etcd::start().await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.node.endpoint())
        .await
        .unwrap();
    let a = common::store(&[proxy.endpoint()], &etcd.ns, "a", 3).await;
    let session = Uuid::new_v4();
    let key = etcd.ns.owner_key(session);
    let lease = a.acquire_lease(session).await.unwrap();
    let mut raw = etcd.raw.clone();
    let node_lease = raw.get(key.as_str(), None).await.unwrap().kvs()[0].lease();

    // Every send of the release is cut before etcd sees it; the job sends it again and again.
    proxy.reject_requests_containing(key.clone());
    drop(lease);
    wait_for(
        "the release to be sent",
        Duration::from_secs(10),
        || async { (proxy.requests_rejected() >= 2).then_some(()) },
    )
    .await
    .unwrap();

    // The node lease ends under it: its keys go with it, the store's keepalive sees it gone.
    raw.lease_revoke(node_lease).await.unwrap();
    assert_eq!(common::create_revision(&raw, &key).await, 0);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_the_loss = proxy.requests_rejected();
    // A job that went on would send again within this time, however its pauses grew.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        proxy.requests_rejected(),
        after_the_loss,
        "a release whose node lease is lost is not sent again"
    );
    assert!(
        a.is_node_lease_valid(),
        "the store goes on, on a new node lease"
    );
}
