//! The sidecar's `Owner` and `WatchOwners`: the owner directory for clients in any language.
//! `Owner` names a session's owner with its advertised address, as of the revision it sends;
//! `WatchOwners` streams every owner, the snapshot's revision, then each change as it happens.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{OwnerChange, OwnerRequest, WatchOwnersRequest, owner_change};
use leasehold::sidecar::{Sidecar, SidecarOptions};
use leasehold::{Store, StoreOptions, Uuid};
use tonic::Code;

async fn next(changes: &mut tonic::Streaming<OwnerChange>) -> owner_change::Change {
    tokio::time::timeout(Duration::from_secs(10), changes.message())
        .await
        .expect("a change in time")
        .expect("the stream goes on")
        .expect("not ended")
        .change
        .expect("a change")
}

#[tokio::test(flavor = "multi_thread")]
async fn owner_and_watch_owners_serve_the_directory() {
    let etcd = common::Etcd::start().await;
    let options = |node: &str, port: u16| {
        StoreOptions::new([etcd.node.endpoint()])
            .with_namespace(etcd.ns.clone())
            .with_node(node)
            .with_advertise(format!("http://127.0.0.1:{port}"))
    };
    let sidecar_store = Store::connect(options("sidecar", 31601)).await.unwrap();
    let sidecar = Sidecar::new(Arc::new(sidecar_store), SidecarOptions::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn({
        let (sidecar, stop) = (sidecar.clone(), stop.clone());
        async move {
            sidecar
                .serve_tcp(listener, None, stop.cancelled_owned())
                .await
                .unwrap();
        }
    });
    let mut client = LeaseholdClient::connect(address).await.unwrap();
    let other = Store::connect(options("other", 31602)).await.unwrap();
    let held = other.acquire_lease(Uuid::new_v4()).await.unwrap();

    // --- Owner: the owner with its address, as of a revision
    let answer = client
        .owner(OwnerRequest {
            session: held.session_id().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let owner = answer.owner.expect("owned");
    assert_eq!(
        (owner.node.as_str(), owner.advertise.as_str(), owner.epoch),
        ("other", "http://127.0.0.1:31602", held.epoch().get())
    );
    assert_eq!(owner.store, other.id().to_string());
    assert!(owner.host_alive);
    assert!(answer.revision >= held.epoch().get());
    let nobody = client
        .owner(OwnerRequest {
            session: Uuid::new_v4().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(nobody.owner.is_none() && nobody.revision >= answer.revision);
    let malformed = client
        .owner(OwnerRequest {
            session: "not a uuid".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);

    // --- WatchOwners: the owners, the snapshot, then each change
    let mut changes = client
        .watch_owners(WatchOwnersRequest {})
        .await
        .unwrap()
        .into_inner();
    match next(&mut changes).await {
        owner_change::Change::Owner(owner) => {
            assert_eq!(owner.session, held.session_id().to_string())
        }
        other => panic!("{other:?}"),
    }
    let snapshot = match next(&mut changes).await {
        owner_change::Change::Snapshot(revision) => revision,
        other => panic!("{other:?}"),
    };
    assert!(snapshot >= held.epoch().get());
    let second = other.acquire_lease(Uuid::new_v4()).await.unwrap();
    match next(&mut changes).await {
        owner_change::Change::Acquired(owner) => {
            assert_eq!(owner.session, second.session_id().to_string());
            assert_eq!(owner.revision, second.epoch().get());
        }
        other => panic!("{other:?}"),
    }
    held.release().await.unwrap();
    match next(&mut changes).await {
        owner_change::Change::Released(released) => {
            assert_eq!(
                released.owner.unwrap().session,
                held.session_id().to_string()
            );
            assert!(released.revision > second.epoch().get());
        }
        other => panic!("{other:?}"),
    }
    // The other store closes: its node lease is revoked, its key goes with it.
    other.close().await;
    match next(&mut changes).await {
        owner_change::Change::Released(released) => {
            assert_eq!(
                released.owner.unwrap().session,
                second.session_id().to_string()
            );
        }
        other => panic!("{other:?}"),
    }
    drop(changes);
    stop.cancel();
    served.await.unwrap();
    sidecar.store().close().await;
}
