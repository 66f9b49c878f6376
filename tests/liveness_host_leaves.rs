//! A host that goes away hands its share over, whatever way it goes: dropped while its store
//! lives on, or shut down while the delete of its key fails. Two stores, two hosts over 10
//! sessions; once one host is gone, the other owns all 10 within invariant 6's bound (TTL +
//! etcd's election timeout + its 0.5 s expiry scan + a round trip).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{FaultProxy, wait_for};
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Store, Uuid};
use tokio::time::Instant;

const SESSIONS: usize = 10;
const TTL: u64 = 3;
/// TTL + etcd's election timeout (1 s) + its 0.5 s expiry scan + a round trip (1 s).
const BOUND: Duration = Duration::from_millis(TTL * 1000 + 1000 + 500 + 1000);

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

fn host(store: &Arc<Store>, sessions: &[Uuid]) -> SessionHost {
    SessionHost::start(
        store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        sessions.iter().copied(),
        idle,
    )
}

async fn owned(etcd: &common::Etcd) -> usize {
    common::count(&etcd.raw, &etcd.ns.owners_prefix()).await as usize
}

/// Waits until `a` and `b` hold 5 sessions each.
async fn balanced(etcd: &common::Etcd, a: &SessionHost, b: &SessionHost) {
    wait_for("5 and 5", Duration::from_secs(15), || async {
        (a.held_count() == 5 && b.held_count() == 5 && owned(etcd).await == SESSIONS).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {} and {}", a.held_count(), b.held_count()));
}

/// Waits until `host` owns every session (etcd agreeing) within `within`; how long it took.
async fn owns_all(etcd: &common::Etcd, host: &SessionHost, within: Duration) -> Duration {
    let start = Instant::now();
    wait_for("the remaining host owns all 10", within, || async {
        (host.held_count() == SESSIONS && owned(etcd).await == SESSIONS).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: it holds {}", host.held_count()));
    start.elapsed()
}

/// The key of the host on node `node`, read from etcd.
async fn host_key(etcd: &common::Etcd, node: &str) -> Option<String> {
    let options = etcd_client::GetOptions::new().with_prefix();
    let response = etcd
        .raw
        .clone()
        .get(etcd.ns.hosts_prefix(), Some(options))
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .find(|kv| kv.value().ends_with(format!(" {node}").as_bytes()))
        .map(|kv| kv.key_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_host_hands_its_share_over_while_its_store_lives_on() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let store_a = Arc::new(etcd.store("a", TTL).await);
    let store_b = Arc::new(etcd.store("b", TTL).await);
    let a = host(&store_a, &sessions);
    let b = host(&store_b, &sessions);
    balanced(&etcd, &a, &b).await;

    // --- phase: a is dropped; its store stays connected, its node lease alive
    let node_lease = store_a.node_lease_id();
    drop(a);
    let took = owns_all(&etcd, &b, BOUND).await;
    println!("after the drop, the other host owned all {SESSIONS} in {took:?} (bound {BOUND:?})");
    assert_eq!(
        host_key(&etcd, "a").await,
        None,
        "the dropped host's key is gone"
    );
    assert_eq!(
        store_a.node_lease_id(),
        node_lease,
        "its node lease lived on: the key was deleted, it did not expire"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_whose_leave_fails_deletes_its_key_in_the_background() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    // a reaches etcd through a proxy, with a TTL long enough that its node lease lives through
    // the faults below: only the delete can hand its share over in time.
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store_a = Arc::new(common::store(&[proxy.endpoint()], &etcd.ns, "a", 20).await);
    let store_b = Arc::new(etcd.store("b", TTL).await);
    let a = host(&store_a, &sessions);
    let b = host(&store_b, &sessions);
    balanced(&etcd, &a, &b).await;

    // --- phase: every request carrying a's host key fails; a shuts down
    let key = host_key(&etcd, "a").await.expect("a's key");
    proxy.reject_requests_containing(key.as_bytes().to_vec());
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), a.shutdown())
        .await
        .expect("shutdown is bounded although its leave fails");
    println!("shutdown took {:?}", started.elapsed());
    assert_eq!(a.held_count(), 0);
    assert_eq!(
        host_key(&etcd, "a").await.as_deref(),
        Some(key.as_str()),
        "the leave's delete failed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(host_key(&etcd, "a").await.as_deref(), Some(key.as_str()));

    // --- phase: the fault heals; the delete goes on in the background and goes through
    let node_lease = store_a.node_lease_id();
    proxy.clear_request_filter();
    let took = owns_all(&etcd, &b, BOUND).await;
    println!("after the heal, the other host owned all {SESSIONS} in {took:?} (bound {BOUND:?})");
    assert_eq!(host_key(&etcd, "a").await, None, "a's key is gone");
    assert_eq!(store_a.node_lease_id(), node_lease, "deleted, not expired");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_dropped_as_it_starts_leaves_no_key_behind() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", TTL).await);
    for delay in [0, 1, 2, 5, 10, 20, 50] {
        // Dropped before, while or after its first put is on its way: the put is settled
        // before the delete is sent, so no key stays behind.
        let host = host(&store, &[Uuid::new_v4()]);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        drop(host);
    }
    wait_for("no host key", Duration::from_secs(5), || async {
        (common::count(&etcd.raw, &etcd.ns.hosts_prefix()).await == 0).then_some(())
    })
    .await
    .unwrap();
    // And none comes back later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(common::count(&etcd.raw, &etcd.ns.hosts_prefix()).await, 0);
    assert!(store.node_lease_id().is_some(), "the store lives on");
}
