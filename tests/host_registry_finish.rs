//! A finished session is never acquired again through `Store::acquire_registered`, which
//! compares the session's registry key in its transaction (session hosts that follow the
//! registry acquire its sessions that way): nothing is written for a session out of the
//! registry, so a late acquisition cannot fence the journal a finish deletes.

mod common;

use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::{AcquireError, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn a_session_out_of_the_registry_is_not_acquired_through_it() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("a", 10).await;
    let admin = Admin::new(store.connection().clone(), etcd.ns.clone());
    let session = Uuid::new_v4();
    // Never created.
    match store.acquire_registered(session).await {
        Err(AcquireError::NotRegistered { session_id }) => assert_eq!(session_id, session),
        other => panic!("expected NotRegistered, got {other:?}"),
    }
    admin.create_session(session, b"").await.unwrap();
    let lease = store.acquire_registered(session).await.unwrap();
    lease.release().await.unwrap();
    admin
        .finish_session(session, Duration::from_secs(5))
        .await
        .unwrap();
    let error = store.acquire_registered(session).await.unwrap_err();
    assert!(
        matches!(error, AcquireError::NotRegistered { .. }),
        "{error}"
    );
    assert!(!error.is_transient());
    let owner = etcd.raw.clone().get(etcd.ns.owner_key(session), None).await;
    assert!(owner.unwrap().kvs().is_empty(), "nothing was written");
    // The plain acquisition does not look at the registry.
    store
        .acquire_lease(session)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
