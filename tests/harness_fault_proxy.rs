//! A `FaultProxy` cuts one client off from etcd while a direct client keeps working.

use std::time::Duration;

use leasehold::testing::{EtcdNode, FaultProxy, random_namespace};
use leasehold::{ConnectOptions, Connection, FailureClass, RetryPolicy};

fn impatient(endpoint: &str) -> ConnectOptions {
    ConnectOptions::new([endpoint])
        .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(2)))
        .with_request_timeout(Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread")]
async fn rejecting_cuts_one_client_off_and_healing_restores_it() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let proxied = Connection::connect(impatient(&proxy.endpoint()))
        .await
        .unwrap();
    let direct = Connection::connect(impatient(etcd.endpoint()))
        .await
        .unwrap();
    let key = format!("{}k", random_namespace().prefix());
    proxied
        .put(&key, "1")
        .await
        .expect("the proxy passes traffic");
    assert!(proxy.open_connections() >= 1);

    // --- phase: the proxied client is cut off
    proxy.reject();
    let error = proxied.get(&key).await.expect_err("cut off");
    assert_ne!(error.class(), FailureClass::Permanent, "{error}");
    assert_eq!(direct.get(&key).await.unwrap(), Some(b"1".to_vec()));
    direct.put(&key, "2").await.unwrap();

    // --- phase: healed
    proxy.heal();
    assert_eq!(proxied.get(&key).await.unwrap(), Some(b"2".to_vec()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blackhole_stalls_one_client_until_healed() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let proxied = Connection::connect(impatient(&proxy.endpoint()))
        .await
        .unwrap();
    let direct = Connection::connect(impatient(etcd.endpoint()))
        .await
        .unwrap();
    let key = format!("{}k", random_namespace().prefix());
    proxied.put(&key, "1").await.unwrap();

    proxy.blackhole();
    let error = proxied.get(&key).await.expect_err("stalled");
    assert_eq!(error.class(), FailureClass::OutcomeUnknown, "{error}");
    assert_eq!(direct.get(&key).await.unwrap(), Some(b"1".to_vec()));

    proxy.heal();
    assert_eq!(proxied.get(&key).await.unwrap(), Some(b"1".to_vec()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_reply_leaves_a_committed_write_with_an_unknown_outcome() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let proxied = Connection::connect(impatient(&proxy.endpoint()))
        .await
        .unwrap();
    let direct = Connection::connect(impatient(etcd.endpoint()))
        .await
        .unwrap();
    let key = format!("{}k", random_namespace().prefix());

    proxy.drop_replies();
    let error = proxied.put(&key, "sent").await.expect_err("no reply");
    assert_eq!(error.class(), FailureClass::OutcomeUnknown, "{error}");
    assert_eq!(
        direct.get(&key).await.unwrap(),
        Some(b"sent".to_vec()),
        "the write committed although its writer never heard so"
    );

    proxy.heal();
    assert_eq!(proxied.get(&key).await.unwrap(), Some(b"sent".to_vec()));
}
