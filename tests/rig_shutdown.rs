//! The composition root's shutdown order, as etcd itself recorded it.

mod common;

use etcd_client::WatchOptions;
use leasehold::rig::{RigError, WorkspaceHeldError};
use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{LossReason, Rig};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_releases_the_workspace_before_the_lease_after_the_last_append() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let mut raw = common::raw(etcd.endpoint()).await;
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
    let mut events = raw
        .watch(
            ns.prefix(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(last.revision),
            ),
        )
        .await
        .unwrap();
    let deleted = common::delete_revisions(&mut events, &[&workspace_key, &owner_key]).await;
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
