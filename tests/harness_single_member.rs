//! The harness's single member: starts from leasehold's own image and serves reads and writes.

use leasehold::testing::{EtcdImage, EtcdNode, random_namespace};
use leasehold::{ConnectOptions, Connection};

#[tokio::test(flavor = "multi_thread")]
async fn a_single_member_serves_put_and_get() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let connection = Connection::connect(ConnectOptions::new([etcd.endpoint()]))
        .await
        .expect("connects");

    let status = connection.status().await.expect("status");
    if let Some(version) = EtcdImage::from_env().version() {
        assert_eq!(status.version, version, "runs the etcd it was built from");
    }
    assert_eq!(status.leader_id, status.member_id, "a single member leads");

    let namespace = random_namespace();
    let key = format!("{}greeting", namespace.prefix());
    assert_eq!(connection.get(&key).await.unwrap(), None);
    let revision = connection.put(&key, "hello").await.unwrap();
    assert!(revision > status.revision);
    assert_eq!(connection.get(&key).await.unwrap(), Some(b"hello".to_vec()));

    let held = leasehold::Admin::new(connection.clone(), namespace.clone())
        .namespace_status()
        .await
        .unwrap();
    assert_eq!((held.keys, held.owned_sessions), (1, 0));
    assert_eq!(held.revision, revision);
}
