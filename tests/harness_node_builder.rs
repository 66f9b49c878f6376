//! `EtcdNode::builder`: extra etcd flags reach etcd (and a cluster's members), the endpoint is
//! the port Docker published, and `EtcdNode::store` gives a test a connected store.

use leasehold::testing::{ClusterOptions, EtcdCluster, EtcdNode, random_namespace};
use leasehold::{Namespace, Uuid};

/// A transaction of `ops` puts under `namespace`, sent to `endpoint`.
async fn txn_of(endpoint: &str, namespace: &Namespace, ops: usize) -> Result<(), String> {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connects");
    let puts: Vec<etcd_client::TxnOp> = (0..ops)
        .map(|i| etcd_client::TxnOp::put(format!("{}k{i}", namespace.prefix()), "v", None))
        .collect();
    client
        .txn(etcd_client::Txn::new().and_then(puts))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_extra_flag_reaches_etcd() {
    let namespace = random_namespace();
    let limited = EtcdNode::builder()
        .arg("--max-txn-ops=16")
        .start()
        .await
        .expect("etcd starts");
    txn_of(limited.endpoint(), &namespace, 16)
        .await
        .expect("16 operations are within the limit");
    let refused = txn_of(limited.endpoint(), &namespace, 20)
        .await
        .expect_err("20 operations are over the limit");
    assert!(
        refused.contains("too many operations in txn request"),
        "{refused}"
    );

    // Without the flag, etcd's own limit (128) lets the same transaction through.
    let plain = EtcdNode::builder()
        .args(Vec::<String>::new())
        .start()
        .await
        .expect("etcd starts");
    txn_of(plain.endpoint(), &namespace, 20)
        .await
        .expect("20 operations are within etcd's default limit");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clusters_members_take_extra_flags_too() {
    let namespace = random_namespace();
    let cluster = EtcdCluster::start_with(
        ClusterOptions::default()
            .with_members(1)
            .with_args(["--max-txn-ops=16"]),
    )
    .await
    .expect("cluster starts");
    let refused = txn_of(cluster.endpoint(0), &namespace, 20)
        .await
        .expect_err("20 operations are over the limit");
    assert!(
        refused.contains("too many operations in txn request"),
        "{refused}"
    );
}

/// The endpoint is the host port Docker picked and published for etcd's client port, not one
/// the harness asked for.
#[tokio::test(flavor = "multi_thread")]
async fn the_endpoint_is_the_port_docker_published() {
    let node = EtcdNode::start().await.expect("etcd starts");
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let container = docker
        .inspect_container(
            node.container_id(),
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let asked = container
        .host_config
        .unwrap()
        .port_bindings
        .unwrap_or_default();
    let fixed: Vec<String> = asked
        .values()
        .flatten()
        .flatten()
        .filter_map(|binding| binding.host_port.clone())
        .filter(|port| !port.is_empty() && port != "0")
        .collect();
    assert!(fixed.is_empty(), "host ports were asked for: {asked:?}");
    let ports = container.network_settings.unwrap().ports.unwrap();
    let bindings = ports["2379/tcp"]
        .clone()
        .expect("etcd's client port is published");
    let published: Vec<String> = bindings.into_iter().filter_map(|b| b.host_port).collect();
    let port = node.endpoint().rsplit_once(':').unwrap().1.to_owned();
    assert!(
        published.contains(&port),
        "{} vs {published:?}",
        node.endpoint()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_store_helper_connects_in_the_namespace() {
    let node = EtcdNode::start().await.expect("etcd starts");
    let namespace = random_namespace();
    let options = node.store_options(&namespace, "helper");
    assert_eq!(options.endpoints, [node.endpoint()]);
    assert_eq!(options.ttl, std::time::Duration::from_secs(10));

    let store = node.store(&namespace, "helper").await.expect("connects");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.expect("acquires");
    assert!(
        lease.owner_key().starts_with(&namespace.prefix()),
        "{} outside {}",
        lease.owner_key(),
        namespace.prefix()
    );
    let mut raw = etcd_client::Client::connect([node.endpoint()], None)
        .await
        .unwrap();
    let owner = raw.get(lease.owner_key(), None).await.unwrap();
    let value = String::from_utf8_lossy(owner.kvs()[0].value()).into_owned();
    assert!(value.ends_with(" helper"), "{value}");
    store.close().await;
}
