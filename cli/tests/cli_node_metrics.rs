//! `leasehold node --metrics-addr`: Prometheus text at /metrics, /healthz, and /readyz that
//! turns 503 while the node lease is not valid and 200 again once it is.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{get, sample};
use leasehold::testing::{FaultProxy, wait_for};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn metrics_health_and_readiness_are_served() {
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let mut node = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "--endpoints",
            &proxy.endpoint(),
            "--namespace",
            etcd.ns.as_str(),
        ])
        .args(["--node", "metered", "--ttl", "3", "--margin", "0.5"])
        .args(["node", "--sessions", "2", "--metrics-addr", "127.0.0.1:0"])
        .env_remove("LEASEHOLD_METRICS_ADDR")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(node.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the node says where its metrics are")
            .unwrap()
            .expect("a line");
        if let Some(url) = line.split("metrics at http://").nth(1) {
            break url.trim_end_matches("/metrics").to_owned();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // --- up, ready, and counting what it does
    assert_eq!(get(&addr, "/healthz").await.0, 200);
    let node_label = "node=\"metered\"";
    wait_for(
        "two sessions held and heartbeats appended",
        Duration::from_secs(15),
        || async {
            let (status, scrape) = get(&addr, "/metrics").await;
            assert_eq!(status, 200);
            let held = sample(&scrape, "leasehold_sessions_held", &[node_label])?;
            let appended = sample(
                &scrape,
                "leasehold_appends_total",
                &[node_label, "outcome=\"ok\""],
            )?;
            (held == 2.0 && appended >= 2.0).then_some(())
        },
    )
    .await
    .unwrap();
    let (_, scrape) = get(&addr, "/metrics").await;
    assert!(
        scrape.contains("# HELP leasehold_appends_total"),
        "described: {scrape}"
    );
    assert_eq!(
        sample(
            &scrape,
            "leasehold_acquisitions_total",
            &[node_label, "outcome=\"acquired\""]
        ),
        Some(2.0)
    );
    assert_eq!(get(&addr, "/readyz").await.0, 200);

    // --- cut off from etcd: not ready once the node lease is past its deadline; ready again
    // once a fresh node lease is granted
    proxy.blackhole();
    wait_for("/readyz 503", Duration::from_secs(6), || async {
        (get(&addr, "/readyz").await.0 == 503).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(get(&addr, "/healthz").await.0, 200, "still up");
    proxy.heal();
    wait_for("/readyz 200 again", Duration::from_secs(20), || async {
        (get(&addr, "/readyz").await.0 == 200).then_some(())
    })
    .await
    .unwrap();

    let status = common::terminate(&mut node, Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
}
