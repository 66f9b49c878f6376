//! Epochs are owner-key create_revisions and strictly increase across handovers.

mod common;

use leasehold::{AcquireError, Epoch, LeaseHeldError};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn the_epoch_is_the_owner_keys_create_revision_and_held_errors_name_the_holder() {
    let etcd = common::Etcd::start().await;
    let ns = &etcd.ns;
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let raw = &etcd.raw;
    let session = Uuid::new_v4();

    let lease = a.acquire_lease(session).await.expect("free session");
    let key = ns.owner_key(session);
    assert_eq!(lease.owner_key(), key);
    assert_eq!(
        lease.epoch(),
        Epoch(common::create_revision(raw, &key).await as u64)
    );
    assert!(lease.is_valid());

    match b.acquire_lease(session).await {
        Err(AcquireError::Held(LeaseHeldError {
            session_id,
            holder_epoch,
        })) => {
            assert_eq!(session_id, session);
            assert_eq!(holder_epoch, lease.epoch());
        }
        other => panic!("expected LeaseHeldError, got {other:?}"),
    }
    // The same store cannot hold a session twice either.
    assert!(matches!(
        a.acquire_lease(session).await,
        Err(AcquireError::Held(_))
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn epochs_strictly_increase_over_twenty_handovers_among_three_stores() {
    let etcd = common::Etcd::start().await;
    let mut stores = Vec::new();
    for node in ["a", "b", "c"] {
        stores.push(etcd.store(node, 10).await);
    }
    let session = Uuid::new_v4();
    let mut epochs = Vec::new();
    for handover in 0..21 {
        let store = &stores[handover % stores.len()];
        let lease = store
            .acquire_lease(session)
            .await
            .expect("free after release");
        epochs.push(lease.epoch());
        lease.release().await.expect("released");
    }
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs strictly increase: {epochs:?}"
    );
}
