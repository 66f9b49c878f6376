//! `remove` is local to the host: a host that removes every session it hosts leaves them to the
//! hosts that still host them, which own them all at once (it counts as a maximum of 0).

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn a_host_that_removes_its_sessions_leaves_them_to_the_others() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..30).map(|_| Uuid::new_v4()).collect();
    let mut hosts = Vec::new();
    for i in 0..3 {
        let store = Arc::new(etcd.store(&format!("r{i}"), 3).await);
        hosts.push(SessionHost::start(
            store,
            HostOptions::default(),
            sessions.clone(),
            |_rig: Arc<Rig>, stop: CancellationToken| async move { stop.cancelled().await },
        ));
    }
    wait_for("10 sessions each", Duration::from_secs(30), || async {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        (held == [10, 10, 10]).then_some(())
    })
    .await
    .unwrap();
    for &session in &sessions {
        hosts[0].remove(session);
    }
    let removed = tokio::time::Instant::now();
    let held = wait_for(
        "the other two own all 30",
        Duration::from_secs(10),
        || async {
            let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
            (held == [0, 15, 15]).then_some(held)
        },
    )
    .await
    .unwrap();
    println!("{held:?} {:?} after the removes", removed.elapsed());
    // Added back, it takes its share again.
    for &session in &sessions {
        hosts[0].add(session);
    }
    wait_for(
        "10 sessions each again",
        Duration::from_secs(30),
        || async {
            let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
            (held == [10, 10, 10]).then_some(())
        },
    )
    .await
    .unwrap();
    for host in &hosts {
        host.shutdown().await;
    }
}
