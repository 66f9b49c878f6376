//! The composition root's shutdown order, as etcd itself recorded it: the append in flight
//! first, then the workspace root, then the lease; and the workspace root goes with a lost
//! session too.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::rig::{RigError, WorkspaceHeldError};
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace, wait_for};
use leasehold::{JournalWriteError, LossReason, Rig};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_releases_the_workspace_before_the_lease_after_the_last_append() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let raw = common::raw(etcd.endpoint()).await;
    let session = Uuid::new_v4();

    let rig = Rig::open(&store, session, "ws-1").await.expect("rig opens");
    let owner_key = ns.owner_key(session);
    let workspace_key = rig.workspace_key().to_owned();
    assert_eq!(workspace_key, ns.workspace_key("ws-1"));
    let mut last = None;
    for i in 0..5 {
        last = Some(rig.journal().append(format!("work {i}")).await.unwrap());
    }
    let last = last.unwrap();
    let lost = rig.lost();

    rig.shutdown().await.expect("clean shutdown");
    assert_eq!(lost.await, LossReason::Released);

    // Read the deletes back from etcd's history.
    let deleted = common::deletes_since(
        &raw,
        &ns.prefix(),
        last.revision,
        &[&workspace_key, &owner_key],
    )
    .await;
    let (workspace_deleted, owner_deleted) = (deleted[0], deleted[1]);
    println!(
        "last append at {}, workspace root deleted at {workspace_deleted}, owner key at {owner_deleted}",
        last.revision
    );
    assert!(last.revision < workspace_deleted);
    assert!(workspace_deleted < owner_deleted);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_owned_by_another_session_is_a_typed_error() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
    let rig = Rig::open(&store, first, "shared").await.unwrap();
    match Rig::open(&store, second, "shared").await {
        Err(RigError::WorkspaceHeld(WorkspaceHeldError { workspace, holder })) => {
            assert_eq!(workspace, "shared");
            assert!(holder.starts_with(&first.to_string()), "{holder}");
        }
        other => panic!("expected WorkspaceHeld, got {other:?}"),
    }
    assert_eq!(
        store.held_sessions(),
        1,
        "the second session's lease was let go"
    );
    assert!(matches!(
        Rig::open(&store, second, "bad/id").await,
        Err(RigError::InvalidWorkspace(_))
    ));
    rig.shutdown().await.unwrap();
    Rig::open(&store, second, "shared")
        .await
        .expect("free once the first shut down");
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_waits_for_the_append_in_flight_then_refuses_appends() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = common::store(&[proxy.endpoint()], &etcd.ns, "a", 10).await;
    let raw = &etcd.raw;
    let session = Uuid::new_v4();
    let rig = Arc::new(Rig::open(&store, session, "ws-1").await.unwrap());
    let (owner_key, workspace_key) = (etcd.ns.owner_key(session), rig.workspace_key().to_owned());

    // The append (record 2, after the fence) cannot reach etcd until the filter is lifted.
    proxy.reject_requests_containing(etcd.ns.record_key(session, 2));
    let append = {
        let rig = rig.clone();
        tokio::spawn(async move { rig.journal().append("the last event").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let shutdown = {
        let rig = rig.clone();
        tokio::spawn(async move { rig.shutdown().await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!append.is_finished() && !shutdown.is_finished());
    assert!(
        common::create_revision(raw, &workspace_key).await > 0
            && common::create_revision(raw, &owner_key).await > 0,
        "nothing is released while an append is in flight"
    );

    proxy.clear_request_filter();
    let appended = append.await.unwrap().expect("the append in flight commits");
    shutdown.await.unwrap().expect("then the rig shuts down");
    assert!(matches!(
        rig.journal().append("too late").await,
        Err(JournalWriteError::Closed)
    ));
    let deleted = common::deletes_since(
        raw,
        &etcd.ns.prefix(),
        appended.revision,
        &[&workspace_key, &owner_key],
    )
    .await;
    assert!(appended.revision < deleted[0] && deleted[0] < deleted[1]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_session_releases_its_workspace_root() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let raw = &etcd.raw;
    let session = Uuid::new_v4();
    let rig = Rig::open(&store, session, "ws-1").await.unwrap();
    let workspace_key = rig.workspace_key().to_owned();
    assert!(common::create_revision(raw, &workspace_key).await > 0);

    // An admin takes the session: the rig is lost, and its workspace root goes.
    raw.clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    assert_eq!(rig.lost().await, LossReason::Revoked);
    wait_for(
        "the workspace root deleted",
        Duration::from_secs(5),
        || async { (common::create_revision(raw, &workspace_key).await == 0).then_some(()) },
    )
    .await
    .unwrap();
    // The session and its workspace are free for the next owner.
    let next = Rig::open(&store, session, "ws-1")
        .await
        .expect("free again");
    next.shutdown().await.unwrap();
}
