//! `Store::connect_with_client`: a store on an `etcd_client::Client` the user built (here with
//! TLS and a user of its own) does everything a store does: acquire, fence, append, replay,
//! and lose its lease when the owner key is deleted from outside; and every request it makes
//! through that client is bounded, though the client has no timeout of its own.

use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::admin::Admin;
use leasehold::testing::{EtcdNode, FaultProxy, TestCertificates, random_namespace};
use leasehold::{LossReason, Record, RetryPolicy, Store, StoreError, StoreOptions, Uuid};

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

/// A client built with no request timeout of its own, as `Connection::from_client` advises,
/// whose member goes silent (a blackhole: connections stay open, nothing answers): every
/// request leasehold makes through it still ends, within the retry deadline plus one request
/// timeout, with an etcd error. Without leasehold's own bound each of these would wait forever.
#[tokio::test(flavor = "multi_thread")]
async fn every_request_through_a_client_without_a_timeout_ends_when_its_member_goes_silent() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let client = etcd_client::Client::connect([proxy.endpoint()], None)
        .await
        .expect("the user's client connects");
    let ns = random_namespace();
    let options = StoreOptions::new(Vec::<String>::new())
        .with_namespace(ns.clone())
        .with_node("own-client")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500))
        .with_request_timeout(Duration::from_secs(1))
        .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(2)));
    let store = Store::connect_with_client(client, options)
        .await
        .expect("the store connects through the user's client");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    journal.append("before the silence").await.unwrap();
    // A lease whose journal is opened while nothing answers.
    let unopened = store.acquire_lease(Uuid::new_v4()).await.unwrap();
    let admin = Admin::new(store.connection().clone(), ns.clone());

    proxy.blackhole();
    // Reads: the retry deadline (2 s) plus one request timeout (1 s). The open's fence, a
    // write, is re-sent while the lease is valid (renewals go through the silent client too:
    // under 3 s). With room for a loaded machine.
    let bound = Duration::from_secs(8);
    async fn ends<T, E: std::fmt::Debug>(
        what: &str,
        bound: Duration,
        request: impl std::future::Future<Output = Result<T, E>>,
    ) {
        let started = tokio::time::Instant::now();
        let outcome = tokio::time::timeout(bound, request)
            .await
            .unwrap_or_else(|_| panic!("{what}: still waiting after {bound:?}"));
        assert!(
            outcome.is_err(),
            "{what}: nothing answers, yet it succeeded"
        );
        eprintln!("{what}: failed after {:?}", started.elapsed());
    }
    ends(
        "open_journal",
        bound,
        store.open_journal(unopened.session_id(), Some(&unopened)),
    )
    .await;
    ends("Admin::owner", bound, admin.owner(session)).await;
    ends("Admin::owners", bound, admin.owners()).await;
    ends("Admin::journals", bound, admin.journals()).await;
    ends("Admin::journal", bound, admin.journal(session)).await;
    ends("Admin::trim", bound, admin.trim(session, 2)).await;
    ends("Admin::check", bound, admin.check(session)).await;
    ends("status", bound, store.connection().status()).await;
    ends("namespace_status", bound, admin.namespace_status()).await;
    let mut replay = store.replay_records(session);
    ends("replay", bound, async {
        replay.next().await.expect("an item").map(|_| ())
    })
    .await;
    proxy.heal();
    store.close().await;
}
