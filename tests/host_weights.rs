//! Weights: hosts of weights 2, 1 and 1 over 300 sessions hold 150, 75 and 75; a host of
//! weight 0 holds none; `Admin::hosts` shows each weight.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn shares_follow_the_hosts_weights() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..300).map(|_| Uuid::new_v4()).collect();
    let mut hosts = Vec::new();
    let mut connection = None;
    for (i, weight) in [2, 1, 1, 0].into_iter().enumerate() {
        let store = Arc::new(etcd.store(&format!("w{i}"), 10).await);
        connection.get_or_insert_with(|| store.connection().clone());
        hosts.push(SessionHost::start(
            store,
            HostOptions::default().with_weight(weight),
            sessions.clone(),
            |_rig: Arc<Rig>, stop: CancellationToken| async move { stop.cancelled().await },
        ));
    }
    let held = wait_for("150, 75, 75, 0", Duration::from_secs(30), || async {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        (held == [150, 75, 75, 0]).then_some(held)
    })
    .await
    .unwrap();
    println!("held: {held:?}");
    let admin = Admin::new(connection.unwrap(), etcd.ns.clone());
    let mut weights: Vec<(String, u32, usize)> = admin
        .hosts()
        .await
        .unwrap()
        .into_iter()
        .map(|host| (host.node, host.weight, host.sessions))
        .collect();
    weights.sort();
    assert_eq!(
        weights,
        [
            ("w0".to_owned(), 2, 150),
            ("w1".to_owned(), 1, 75),
            ("w2".to_owned(), 1, 75),
            ("w3".to_owned(), 0, 0)
        ]
    );
    // The heavy host leaves: the rest share by weight (the weight-0 host still takes none).
    hosts.remove(0).shutdown().await;
    wait_for("150, 150, 0", Duration::from_secs(30), || async {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        (held == [150, 150, 0]).then_some(())
    })
    .await
    .unwrap();
    for host in &hosts {
        host.shutdown().await;
    }
}
