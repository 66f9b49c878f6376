//! When the workspace root's delete fails at shutdown (or a rig is dropped), the rest of the
//! shutdown happens in the background in the same order: etcd's history shows the workspace
//! root deleted before the owner key.

mod common;

use std::time::Duration;

use etcd_client::{WatchOptions, WatchStream};
use leasehold::rig::RigError;
use leasehold::testing::{FaultProxy, wait_for};
use leasehold::{Rig, Uuid};

/// Sets up a rig on store A through a proxy, and a watch from outside on the namespace.
async fn rig_with_history(
    etcd: &common::Etcd,
    proxy: &FaultProxy,
) -> (Rig, leasehold::Store, WatchStream) {
    // A short request timeout bounds how long shutdown waits in the foreground.
    let store = common::store_timeout(
        &[proxy.endpoint()],
        &etcd.ns,
        "a",
        10,
        Duration::from_millis(500),
    )
    .await;
    let rig = Rig::open(&store, Uuid::new_v4(), "ws-1").await.unwrap();
    let last = rig.journal().append("last").await.unwrap();
    let history = etcd
        .raw
        .clone()
        .watch(
            etcd.ns.prefix(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last.revision),
            ),
        )
        .await
        .unwrap();
    (rig, store, history)
}

/// The owner key stays while the workspace root's deletes are refused, and goes after it.
async fn owner_key_waits_for_the_root(
    etcd: &common::Etcd,
    proxy: &FaultProxy,
    owner_key: &str,
    root: &str,
    history: &mut WatchStream,
) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        common::create_revision(&etcd.raw, owner_key).await > 0,
        "the owner key must not go before the workspace root"
    );
    assert!(common::create_revision(&etcd.raw, root).await > 0);
    proxy.clear_request_filter();
    let deleted = common::delete_revisions(history, &[root, owner_key]).await;
    let (root_deleted, owner_deleted) = (deleted[0], deleted[1]);
    println!("workspace root deleted at {root_deleted}, owner key at {owner_deleted}");
    assert!(root_deleted < owner_deleted);
    wait_for("both keys gone", Duration::from_secs(5), || async {
        (common::create_revision(&etcd.raw, owner_key).await == 0
            && common::create_revision(&etcd.raw, root).await == 0)
            .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_workspace_delete_keeps_the_order_in_the_background() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let (rig, _store, mut history) = rig_with_history(&etcd, &proxy).await;
    let owner_key = etcd.ns.owner_key(rig.session_id());
    let root = rig.workspace_key().to_owned();

    // --- phase: every request that names the workspace root is refused
    proxy.reject_requests_containing(root.as_bytes());
    let shutdown = rig.shutdown().await;
    assert!(
        matches!(shutdown, Err(RigError::Workspace(_))),
        "the root's delete cannot be confirmed: {shutdown:?}"
    );
    owner_key_waits_for_the_root(&etcd, &proxy, &owner_key, &root, &mut history).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_rig_releases_in_order_in_the_background() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let (rig, _store, mut history) = rig_with_history(&etcd, &proxy).await;
    let owner_key = etcd.ns.owner_key(rig.session_id());
    let root = rig.workspace_key().to_owned();

    proxy.reject_requests_containing(root.as_bytes());
    drop(rig);
    owner_key_waits_for_the_root(&etcd, &proxy, &owner_key, &root, &mut history).await;
}
