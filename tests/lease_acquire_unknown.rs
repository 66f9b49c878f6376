//! An acquisition whose reply is lost is sent again and settled by its nonce: the caller gets
//! the lease its first send created, written once. An owner key of this store that no lease
//! adopted (what a late commit leaves behind) is deleted.

mod common;

use std::time::Duration;

use leasehold::testing::{FaultProxy, wait_for};
use leasehold::{LossReason, Uuid};

/// etcd, a proxy to it, store "a" connected through the proxy, and a new session with its
/// owner key.
async fn through_a_proxy() -> (common::Etcd, FaultProxy, leasehold::Store, Uuid, String) {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &etcd.ns, "a", 10).await;
    let session = Uuid::new_v4();
    let key = etcd.ns.owner_key(session);
    (etcd, proxy, store, session, key)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acquisition_whose_reply_was_dropped_adopts_its_own_key_written_once() {
    let (etcd, proxy, store, session, key) = through_a_proxy().await;

    proxy.drop_replies();
    let pending = {
        let store = std::sync::Arc::new(store);
        let acquiring = store.clone();
        (
            tokio::spawn(async move { acquiring.acquire_lease(session).await }),
            store,
        )
    };
    let (pending, store) = pending;
    // The first send commits; its reply, and those of the re-sends, never arrive.
    let created = wait_for(
        "the acquisition to commit",
        Duration::from_secs(5),
        || async { Some(common::create_revision(&etcd.raw, &key).await).filter(|&r| r > 0) },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!pending.is_finished(), "nothing answered yet");
    proxy.heal();

    let lease = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("settles once replies flow")
        .unwrap()
        .expect("its own key is adopted, not reported held");
    assert_eq!(lease.epoch().0, created as u64);
    let kv = etcd.raw.clone().get(key.as_str(), None).await.unwrap();
    let kv = &kv.kvs()[0];
    assert_eq!(kv.version(), 1, "written once: the re-sends only compared");
    assert_eq!(common::count(&etcd.raw, &etcd.ns.owners_prefix()).await, 1);
    assert!(lease.is_valid());
    assert_eq!(store.held_sessions(), 1);
    lease.release().await.unwrap();
    assert_eq!(common::create_revision(&etcd.raw, &key).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_owner_key_of_ours_that_no_lease_adopted_is_deleted() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let raw = &etcd.raw;

    let held = store.acquire_lease(Uuid::new_v4()).await.unwrap();

    // What a late commit of an abandoned acquisition leaves: a key of this store, on its node
    // lease, with a nonce no lease of it holds.
    let orphan_session = Uuid::new_v4();
    let orphan_key = etcd.ns.owner_key(orphan_session);
    let orphan_value = common::orphan_value(raw, &held).await;
    let node_lease = store.node_lease_id().expect("a node lease");
    raw.clone()
        .put(
            orphan_key.as_str(),
            orphan_value,
            Some(etcd_client::PutOptions::new().with_lease(node_lease)),
        )
        .await
        .unwrap();

    // The node lease lives on, so only the store's own cleanup can remove it.
    wait_for("the orphan key deleted", Duration::from_secs(5), || async {
        (common::create_revision(raw, &orphan_key).await == 0).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(store.held_sessions(), 1);
    assert!(held.is_valid(), "the held lease is untouched");
    assert_eq!(held.loss_reason(), None::<LossReason>);
    // The session is free: the store acquires it like any other.
    let next = store.acquire_lease(orphan_session).await.unwrap();
    assert!(next.is_valid());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_acquisition_by_the_same_store_is_refused_as_held() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let session = Uuid::new_v4();
    let held = store.acquire_lease(session).await.unwrap();
    // Its key carries this store's identity, but not this acquisition's nonce: not adopted.
    match store.acquire_lease(session).await {
        Err(leasehold::AcquireError::Held(error)) => {
            assert_eq!(error.holder_epoch, held.epoch())
        }
        other => panic!("expected Held, got {other:?}"),
    }
    // Two at once: exactly one gets it.
    let other = Uuid::new_v4();
    let (first, second) = tokio::join!(store.acquire_lease(other), store.acquire_lease(other));
    assert_eq!(
        [first.is_ok(), second.is_ok()]
            .iter()
            .filter(|ok| **ok)
            .count(),
        1,
        "{first:?} {second:?}"
    );
    assert!(held.is_valid());
    assert_eq!(store.held_sessions(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_etcd_refuses_acquisitions_with_an_etcd_error_not_a_lost_node_lease() {
    use etcd_client::{AlarmAction, AlarmOptions, AlarmType};
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let mut raw = etcd.raw.clone();
    let member = raw.status().await.unwrap().header().unwrap().member_id();
    let mut options = AlarmOptions::new();
    options.with_member(member);
    // etcd's quota alarm: writes are refused ("database space exceeded") until it is cleared.
    raw.alarm(
        AlarmAction::Activate,
        AlarmType::Nospace,
        Some(options.clone()),
    )
    .await
    .unwrap();
    match store.acquire_lease(Uuid::new_v4()).await {
        Err(error @ leasehold::AcquireError::Etcd(_)) => {
            assert!(!error.is_transient(), "{error:?}");
        }
        other => panic!("expected an etcd error, got {other:?}"),
    }
    assert!(store.is_node_lease_valid(), "the node lease is fine");
    assert!(*store.nospace_alarm().borrow(), "the store says NOSPACE");
    raw.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
        .await
        .unwrap();
    store
        .acquire_lease(Uuid::new_v4())
        .await
        .expect("writes go through once the alarm is cleared");
    assert!(
        !*store.nospace_alarm().borrow(),
        "and no longer says NOSPACE"
    );
}

/// An acquisition whose caller goes away while its transaction is in flight (its reply is
/// lost, and the caller gives up) leaves no owner key behind: the key it committed is one no
/// handle adopts, and the store deletes it once its watch sees it.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquisition_dropped_in_flight_leaves_no_owner_key_behind() {
    let (etcd, proxy, store, session, key) = through_a_proxy().await;

    proxy.drop_replies();
    let attempt = tokio::time::timeout(Duration::from_millis(300), store.acquire_lease(session));
    assert!(
        attempt.await.is_err(),
        "no reply, so no lease: the caller gives up"
    );
    // The request went through; only its reply was lost.
    wait_for(
        "the abandoned acquisition's key",
        Duration::from_secs(5),
        || async { (common::create_revision(&etcd.raw, &key).await > 0).then_some(()) },
    )
    .await
    .unwrap();
    proxy.heal();

    wait_for(
        "the abandoned key deleted",
        Duration::from_secs(10),
        || async { (common::create_revision(&etcd.raw, &key).await == 0).then_some(()) },
    )
    .await
    .unwrap();
    assert_eq!(store.held_sessions(), 0);
    // The session is free: the store acquires it like any other.
    let lease = store.acquire_lease(session).await.unwrap();
    assert!(lease.is_valid());
}
