//! One store holding 1,000 sessions costs etcd one lease and one keepalive stream.

mod common;

use etcd_client::LeaseTimeToLiveOptions;
use futures_util::future::try_join_all;
use leasehold::testing::{EtcdNode, etcd_metric, random_namespace};
use uuid::Uuid;

const SESSIONS: usize = 1_000;

async fn started_streams(endpoint: &str, method: &str) -> f64 {
    let label = format!("grpc_method=\"{method}\"");
    etcd_metric(endpoint, "grpc_server_started_total", &[&label])
        .await
        .expect("metrics")
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_sessions_share_one_node_lease_and_one_keepalive_stream() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "a", 10).await;
    let mut raw = common::raw(etcd.endpoint()).await;

    let mut leases = Vec::with_capacity(SESSIONS);
    for chunk in (0..SESSIONS).collect::<Vec<_>>().chunks(100) {
        let acquired = try_join_all(chunk.iter().map(|_| store.acquire_lease(Uuid::new_v4())))
            .await
            .expect("every session acquired");
        leases.extend(acquired);
    }
    assert_eq!(store.held_sessions(), SESSIONS);
    assert!(leases.iter().all(|lease| lease.is_valid()));

    let node_lease = store.node_lease_id().expect("a node lease");
    let listed = raw.leases().await.unwrap();
    assert_eq!(
        listed.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        vec![node_lease],
        "the cluster has exactly one lease: the store's"
    );
    let ttl = raw
        .lease_time_to_live(node_lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(
        ttl.keys().len(),
        SESSIONS,
        "every owner key is attached to it"
    );
    assert_eq!(
        common::count(&raw, &ns.owners_prefix()).await,
        SESSIONS as i64
    );

    assert_eq!(
        started_streams(etcd.endpoint(), "LeaseKeepAlive").await,
        1.0
    );
    assert_eq!(started_streams(etcd.endpoint(), "Watch").await, 1.0);
}
