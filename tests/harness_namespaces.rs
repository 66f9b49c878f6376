//! Tests sharing one etcd do not see each other's keys: each takes a random namespace.

use leasehold::testing::{EtcdNode, random_namespace};
use leasehold::{ConnectOptions, Connection};

/// What one test does: writes the same relative keys as every other test, then reads them.
async fn a_test(connection: Connection, marker: &'static str) -> (String, Vec<Option<Vec<u8>>>) {
    let namespace = random_namespace();
    for i in 0..20 {
        let key = format!("{}owners/session-{i}", namespace.prefix());
        connection.put(key, format!("{marker}-{i}")).await.unwrap();
        tokio::task::yield_now().await;
    }
    let mut seen = Vec::new();
    for i in 0..20 {
        let key = format!("{}owners/session-{i}", namespace.prefix());
        seen.push(connection.get(key).await.unwrap());
    }
    let held = leasehold::Admin::new(connection.clone(), namespace.clone())
        .namespace_status()
        .await
        .unwrap();
    assert_eq!(held.keys, 20, "{marker} counts only its own keys");
    assert_eq!(held.owned_sessions, 20);
    (namespace.to_string(), seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tests_at_once_on_one_etcd_do_not_interfere() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let connection = Connection::connect(ConnectOptions::new([etcd.endpoint()]))
        .await
        .unwrap();

    let (a, b) = tokio::join!(
        tokio::spawn(a_test(connection.clone(), "a")),
        tokio::spawn(a_test(connection.clone(), "b")),
    );
    let ((ns_a, seen_a), (ns_b, seen_b)) = (a.unwrap(), b.unwrap());
    assert_ne!(ns_a, ns_b, "each test gets its own namespace");
    for (i, (a, b)) in seen_a.iter().zip(&seen_b).enumerate() {
        assert_eq!(a.as_deref(), Some(format!("a-{i}").as_bytes()));
        assert_eq!(b.as_deref(), Some(format!("b-{i}").as_bytes()));
    }
}
