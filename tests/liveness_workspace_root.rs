//! A workspace root that committed while every reply to it was lost never blocks the session:
//! another store's `Rig::open` of the session succeeds within TTL + 2 s.

mod common;

use std::time::Duration;

use leasehold::rig::RigError;
use leasehold::testing::{FaultProxy, wait_for};
use leasehold::{Rig, Uuid};
use tokio::time::Instant;

const TTL: u64 = 10;

#[tokio::test(flavor = "multi_thread")]
async fn a_root_committed_unseen_does_not_block_the_next_owner() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    // Short attempts, so that many of them fall inside the fault.
    let a = common::store_timeout(
        &[proxy.endpoint()],
        &etcd.ns,
        "a",
        TTL,
        Duration::from_millis(300),
    )
    .await;
    let b = etcd.store("b", TTL).await;
    let session = Uuid::new_v4();
    let root = etcd.ns.workspace_key("ws-1");
    let lease = a.acquire_lease(session).await.unwrap();

    // --- phase: A takes the workspace root; it commits, every reply is lost
    proxy.drop_replies();
    let opening = tokio::spawn({
        let a_store = a;
        async move {
            let opened = Rig::with_lease(&a_store, lease, "ws-1").await;
            (opened, a_store)
        }
    });
    wait_for("the root to commit", Duration::from_secs(5), || async {
        (common::create_revision(&etcd.raw, &root).await > 0).then_some(())
    })
    .await
    .unwrap();

    // --- phase: meanwhile an operator revokes A's ownership; the replies stay lost a while
    let revoked = Instant::now();
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.heal();

    // --- B opens the session within TTL + 2 s
    let opened = wait_for("B's rig to open", Duration::from_secs(TTL + 2), || async {
        match Rig::open(&b, session, "ws-1").await {
            Ok(rig) => Some(rig),
            Err(RigError::WorkspaceHeld(_) | RigError::Acquire(_)) => None,
            Err(error) => panic!("unexpected: {error:?}"),
        }
    })
    .await
    .unwrap();
    println!(
        "B opened the session {:?} after the revoke",
        revoked.elapsed()
    );
    let (a_opened, _a) = opening.await.unwrap();
    assert!(a_opened.is_err(), "A's rig cannot open without its lease");
    opened.shutdown().await.unwrap();
}
