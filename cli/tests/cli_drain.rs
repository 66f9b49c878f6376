//! `leasehold drain NODE [--wait]` and `undrain NODE`: a running host asked through etcd to
//! hand its sessions over, and to take its share back; a node that is not live refused in one
//! line.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};

#[tokio::test(flavor = "multi_thread")]
async fn leasehold_drain_asks_a_running_host_through_etcd_and_undrain_ends_it() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..60).map(|_| Uuid::new_v4()).collect();
    let mut hosts = Vec::new();
    for i in 0..3 {
        let store = Arc::new(etcd.store(&format!("n{i}"), 10).await);
        hosts.push(SessionHost::start(
            store,
            HostOptions::default(),
            sessions.clone(),
            |_rig: Arc<Rig>, stop: CancellationToken| async move { stop.cancelled().await },
        ));
    }
    let held = |hosts: &[SessionHost]| -> Vec<usize> {
        hosts.iter().map(SessionHost::held_count).collect()
    };
    wait_for("20 each", Duration::from_secs(30), || async {
        (held(&hosts) == [20, 20, 20]).then_some(())
    })
    .await
    .unwrap();
    let tool = |args: &'static [&'static str]| etcd.tool(args);

    // --- a node that is not there: one line, exit 1, nothing written
    let refused = tool(&["drain", "nobody"]).await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no live session host named \"nobody\""),
        "{stderr}"
    );

    // --- drain n1 and wait: it holds nothing, the others hold all
    let drained = tool(&["drain", "n1", "--wait"]).await;
    assert!(drained.status.success(), "{drained:?}");
    assert!(String::from_utf8_lossy(&drained.stdout).contains("n1 drained"));
    assert_eq!(hosts[1].held_count(), 0);
    assert!(hosts[1].is_draining() && !hosts[0].is_draining());
    wait_for("the others own all 60", Duration::from_secs(10), || async {
        (held(&hosts) == [30, 0, 30]).then_some(())
    })
    .await
    .unwrap();
    let listed = tool(&["hosts", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let draining: Vec<(String, bool)> = listed["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["node"].as_str().unwrap().to_owned(),
                h["draining"].as_bool().unwrap(),
            )
        })
        .filter(|(_, draining)| *draining)
        .collect();
    assert_eq!(draining, [("n1".to_owned(), true)]);

    // --- undrain: its share comes back
    let undrained = tool(&["undrain", "n1"]).await;
    assert!(undrained.status.success(), "{undrained:?}");
    wait_for("20 each again", Duration::from_secs(30), || async {
        (held(&hosts) == [20, 20, 20]).then_some(())
    })
    .await
    .unwrap();
    assert!(!hosts[1].is_draining());
    for host in &hosts {
        host.shutdown().await;
    }
}
