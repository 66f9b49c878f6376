//! Object GC deletes only while the session is owned.

mod common;

use leasehold::Rig;
use leasehold::rig::GcError;
use leasehold::testing::{EtcdNode, random_namespace};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_gc_delete_succeeds_while_owning_and_is_refused_after_the_loss() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let rig = Rig::open(&store, session, "ws").await.unwrap();
    let gc = rig.gc_view();
    assert_eq!((gc.session_id(), gc.epoch()), (session, rig.epoch()));

    let (garbage, kept) = (
        format!("{}objects/garbage", ns.prefix()),
        format!("{}objects/kept", ns.prefix()),
    );
    raw.put(garbage.as_str(), "x", None).await.unwrap();
    raw.put(kept.as_str(), "x", None).await.unwrap();
    gc.delete(garbage.as_str()).await.expect("owning: deleted");
    assert_eq!(common::create_revision(&raw, &garbage).await, 0);

    // --- the session is lost: GC is refused, and the object stays
    raw.delete(ns.owner_key(session), None).await.unwrap();
    gc.lost().await;
    match gc.delete(kept.as_str()).await {
        Err(GcError::LeaseLost(error)) => assert_eq!(error.session_id, session),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(
        common::create_revision(&raw, &kept).await > 0,
        "not deleted"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gc_delete_sent_after_the_owner_key_is_gone_is_refused_at_etcd() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let ns = random_namespace();
    let store = common::store(&[proxy.endpoint()], &ns, "a", 10).await;
    let mut raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();
    let rig = Rig::open(&store, session, "ws").await.unwrap();
    let gc = rig.gc_view();
    let kept = format!("{}objects/kept", ns.prefix());
    raw.put(kept.as_str(), "x", None).await.unwrap();

    // --- phase: the store hears nothing; its owner key goes; its GC delete reaches etcd
    proxy.drop_replies();
    raw.delete(ns.owner_key(session), None).await.unwrap();
    assert!(gc.is_valid(), "it has not heard");
    let pending = tokio::spawn({
        let (gc, kept) = (gc.clone(), kept.clone());
        async move { gc.delete(kept).await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(
        common::create_revision(&raw, &kept).await > 0,
        "the guard refused it at etcd"
    );
    proxy.heal();
    let result = pending.await.unwrap();
    assert!(
        matches!(result, Err(GcError::NotOwner { .. } | GcError::Etcd(_))),
        "{result:?}"
    );
    assert!(
        common::create_revision(&raw, &kept).await > 0,
        "not deleted"
    );
}
