//! The sidecar's writes besides `Append`: `Trim` (the holder's, with its token) and `Delete` (a
//! journal nobody owns); and a release in order: the journal closed, its appends under way
//! finished, before the lease goes.

mod common;

use std::time::Duration;

use common::sidecar::{Attached, Served, acquired, append, events, reason, replay};
use leasehold::Uuid;
use leasehold::sidecar::proto::{DeleteRequest, TrimRequest, attach_response};
use tonic::Code;

fn trim(owned: &leasehold::sidecar::proto::Acquired, token: &[u8], before: u64) -> TrimRequest {
    TrimRequest {
        session: owned.session.clone(),
        epoch: owned.epoch,
        token: token.to_vec(),
        before,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_holder_trims_and_a_journal_nobody_owns_is_deleted() {
    let etcd = common::Etcd::start().await;
    let mut served = Served::start(etcd.store("sidecar", 10).await).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;
    for i in 0..10 {
        client
            .append(append(&owned, &[&format!("e{i}")], &format!("r{i}")))
            .await
            .unwrap();
    }

    // --- phase: only the holder trims; past the last record is refused
    let not_holder = client.trim(trim(&owned, &[7; 16], 6)).await.unwrap_err();
    assert_eq!(not_holder.code(), Code::PermissionDenied);
    assert_eq!(reason(&not_holder).0, "NOT_HOLDER");
    let trimmed = client
        .trim(trim(&owned, &owned.token, 6))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((trimmed.base, trimmed.removed), (6, 5));
    let again = client
        .trim(trim(&owned, &owned.token, 6))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.base, again.removed), (6, 0), "idempotent");
    let beyond = client
        .trim(trim(&owned, &owned.token, 12))
        .await
        .unwrap_err();
    assert_eq!(beyond.code(), Code::OutOfRange);
    assert_eq!(reason(&beyond).0, "BEYOND_TIP");
    let kept = events(&replay(client, &session, false).await);
    assert_eq!(kept.first(), Some(&(6, "e4".to_owned())));
    assert_eq!(kept.len(), 6);

    // --- phase: a delete while it is owned is refused; once released, it goes
    let owned_now = client
        .delete(DeleteRequest {
            session: session.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(owned_now.code(), Code::FailedPrecondition);
    assert_eq!(reason(&owned_now).0, "OWNED");
    attached.release(&session).await;
    let stale = client
        .trim(trim(&owned, &owned.token, 8))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    let deleted = client
        .delete(DeleteRequest {
            session: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.keys, 6 + 2, "six records, the tip and the base");
    assert!(replay(client, &session, true).await.is_empty());
    let nothing = client
        .delete(DeleteRequest { session })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nothing.keys, 0, "idempotent");
    served.shutdown().await;
}

/// A stream that ends while an append is under way (etcd out of reach for a while): the
/// journal is closed first, so the append goes on while the lease is valid and is answered
/// committed; only then is the lease released, after the record.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_finishes_the_appends_under_way_before_it_lets_the_lease_go() {
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = Served::behind_proxy(&etcd, 10).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let mut client = served.client().await;

    // --- phase: an append held on its way; the stream asks for the release meanwhile
    proxy.blackhole();
    let request = append(&owned, &["under way"], "u1");
    let under_way = tokio::spawn(async move { client.append(request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    attached
        .send(leasehold::sidecar::proto::attach_request::Request::Release(
            leasehold::sidecar::proto::Release {
                session: session.clone(),
            },
        ))
        .await;
    // Past several attempts' timeouts, well within the lease's validity.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!under_way.is_finished(), "the append waits for etcd");
    proxy.heal();

    // --- phase: the append is answered committed, then the session is released
    let answered = tokio::time::timeout(Duration::from_secs(10), under_way)
        .await
        .expect("answered once etcd is back")
        .unwrap()
        .expect("committed: the lease stayed until the append was done")
        .into_inner();
    assert!(matches!(
        attached.next().await,
        attach_response::Event::Released(_)
    ));
    // In etcd's history, the record comes before the owner key's delete.
    let id: Uuid = session.parse().unwrap();
    let (owner_key, record_key) = (
        etcd.ns.owner_key(id).into_bytes(),
        etcd.ns.record_key(id, answered.first_seq).into_bytes(),
    );
    let history = common::history(&etcd.raw, 1, common::revision(&etcd.raw).await).await;
    let put = history.iter().position(|change| change.key == record_key);
    let deleted = history
        .iter()
        .position(|change| change.key == owner_key && !change.put);
    assert!(
        matches!((put, deleted), (Some(put), Some(deleted)) if put < deleted),
        "the record's put at {put:?}, the owner key's delete at {deleted:?}"
    );
    let mut client = served.client().await;
    assert_eq!(
        events(&replay(&mut client, &session, false).await),
        [(2, "under way".to_owned())]
    );
    served.shutdown().await;
}
