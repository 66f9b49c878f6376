//! A bare store's acquisition meeting a session's move key: a move to another store keeps the
//! session from it ([`AcquireError::Moving`], naming the target) until the move ends; a move to
//! itself is completed by its acquisition, which deletes the move key in the same transaction.

mod common;

use leasehold::{AcquireError, Uuid};

/// A move value as `Admin::move_session` writes it.
fn move_to(target: Uuid) -> String {
    format!("leasehold-move/1 {target} {} asked", Uuid::now_v7())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_in_the_way_stops_every_store_but_its_target_whose_acquisition_ends_it() {
    let etcd = common::Etcd::start().await;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let mut raw = etcd.raw.clone();
    let session = Uuid::new_v4();
    let move_key = etcd.ns.move_key(session);
    let owner_key = etcd.ns.owner_key(session);

    // Moving to b: a is told so, and writes nothing.
    raw.put(move_key.as_str(), move_to(b.id()), None)
        .await
        .unwrap();
    match a.acquire_lease(session).await {
        Err(AcquireError::Moving { session_id, target }) => {
            assert_eq!((session_id, target), (session, b.id()))
        }
        other => panic!("expected Moving to b, got {other:?}"),
    }
    assert_eq!(common::create_revision(&raw, &owner_key).await, 0);

    // b, its target, takes it (the first send compares that there is no move, meets it, and
    // is sent again in its name); the move ends with that transaction.
    let lease = b.acquire_lease(session).await.expect("the target acquires");
    assert_eq!(
        lease.epoch().0,
        common::create_revision(&raw, &owner_key).await as u64
    );
    assert_eq!(
        common::create_revision(&raw, &move_key).await,
        0,
        "the move key is deleted with the acquisition"
    );
    lease.release().await.unwrap();

    // A move this release cannot read names no store of it: no store takes the session.
    raw.put(move_key.as_str(), "leasehold-move/9 ?", None)
        .await
        .unwrap();
    for store in [&a, &b] {
        match store.acquire_lease(session).await {
            Err(AcquireError::Moving { target, .. }) => assert_eq!(target, Uuid::nil()),
            other => panic!("expected Moving to no store, got {other:?}"),
        }
    }
    // Once the move ends, the session is free to all.
    raw.delete(move_key.as_str(), None).await.unwrap();
    let lease = a.acquire_lease(session).await.expect("free again");
    assert!(lease.is_valid());
}
