//! `Store::connect_with_client`: a store on an `etcd_client::Client` the user built (here with
//! TLS and a user of its own) does everything a store does: acquire, fence, append, replay,
//! and lose its lease when the owner key is deleted from outside.

use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::testing::{EtcdNode, TestCertificates, random_namespace};
use leasehold::{LossReason, Record, Store, StoreError, StoreOptions, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn a_store_on_the_users_own_client_works_end_to_end() {
    let certificates = TestCertificates::generate().unwrap();
    let etcd = EtcdNode::builder()
        .tls(certificates.clone())
        .auth("root-pw")
        .start()
        .await
        .expect("etcd with TLS and auth starts");
    let ns = random_namespace();
    etcd.add_prefix_user("tenant", "tenant-pw", ns.as_str())
        .await
        .unwrap();

    let (cert, key) = certificates.client_pem();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(certificates.ca_pem()))
        .identity(etcd_client::Identity::from_pem(cert, key));
    let client = etcd_client::Client::connect(
        [etcd.endpoint()],
        Some(
            etcd_client::ConnectOptions::new()
                .with_tls(tls)
                .with_user("tenant", "tenant-pw"),
        ),
    )
    .await
    .expect("the user's client connects");

    let options = StoreOptions::new(Vec::<String>::new())
        .with_namespace(ns.clone())
        .with_node("own-client")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500));
    let store = Store::connect_with_client(client, options)
        .await
        .expect("the store connects through the user's client");

    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    for i in 0..5 {
        journal.append(format!("event {i}")).await.unwrap();
    }
    let records: Vec<Record> = store
        .replay_records(session)
        .map(|record| record.unwrap())
        .collect()
        .await;
    assert_eq!(records.len(), 6, "the fence and five events");
    assert!(matches!(records[0], Record::Fence(_)));

    // A renewal or two past the TTL: the keepalive runs on the user's client.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lease.is_valid(), "renewed through the user's client");

    // The watch runs on it too: a delete from outside is noticed at once.
    let mut raw = etcd.raw_client().await.unwrap();
    raw.delete(lease.owner_key(), None).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the watch noticed the delete");
    assert_eq!(reason, LossReason::Revoked);
    store.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_reaches_nothing_fails_to_connect_typed() {
    // Dials lazily: the connect succeeds, the store's first request does not.
    let client = etcd_client::Client::connect(["http://127.0.0.1:9"], None)
        .await
        .unwrap();
    let mut options = StoreOptions::new(Vec::<String>::new());
    options.retry = options.retry.with_deadline(Duration::from_secs(2));
    let started = tokio::time::Instant::now();
    let error = Store::connect_with_client(client, options)
        .await
        .expect_err("nothing answers");
    assert!(
        matches!(error, StoreError::Connect(_)),
        "a connect error: {error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "bounded");
}
