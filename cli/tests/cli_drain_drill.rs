//! The drain drill over processes: three `leasehold node` processes over 300 sessions, each
//! appending a heartbeat every 100 ms; `leasehold drain n1 --wait` empties n1 within 2 s per 100
//! sessions it held, every journal keeps advancing meanwhile (no gap over 1 s between two
//! commits to it, seen on a watch of the journals), no heartbeat fails, `leasehold check`
//! finds every journal sound; `leasehold undrain n1` gives its share back.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use leasehold::admin::Admin;
use leasehold::testing::wait_for;
use leasehold::{ConnectOptions, Connection};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const SESSIONS: usize = 300;

fn node(endpoint: &str, namespace: &str, name: &str, log: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["node", "--sessions", &SESSIONS.to_string()])
        .args(["--settle", "0s", "--interval", "100ms"])
        .args(["--endpoints", endpoint, "--namespace", namespace])
        .args(["--node", name, "--ttl", "5", "--margin", "1"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts")
}

#[tokio::test(flavor = "multi_thread")]
async fn draining_a_node_process_keeps_every_journal_advancing_and_undrain_gives_its_share_back() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = etcd.ns.clone();
    let admin = Admin::new(
        Connection::connect(ConnectOptions::new([endpoint.clone()]))
            .await
            .unwrap(),
        ns.clone(),
    );
    let logs = tempfile::tempdir().unwrap();
    let log = |i: usize| logs.path().join(format!("n{i}.log"));
    let mut nodes: Vec<Child> = (0..3)
        .map(|i| node(&endpoint, ns.as_str(), &format!("n{i}"), &log(i)))
        .collect();
    let held = || async {
        let mut hosts = admin.hosts().await.ok()?;
        hosts.sort_by(|a, b| a.node.cmp(&b.node));
        Some(hosts.iter().map(|h| h.sessions).collect::<Vec<_>>())
    };
    wait_for("100 sessions each", Duration::from_secs(60), || async {
        (held().await? == [100, 100, 100]).then_some(())
    })
    .await
    .unwrap();

    // --- a watch of every journal's tip: when each commit arrived
    let from = common::revision(&etcd.raw).await + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let prefix = format!("{}/journals/", ns.as_str());
    let mut watch = etcd
        .raw
        .clone()
        .watch(prefix.as_str(), Some(options))
        .await
        .unwrap();
    let commits: Arc<Mutex<HashMap<Vec<u8>, Vec<Instant>>>> = Arc::default();
    let watcher = tokio::spawn({
        let commits = commits.clone();
        async move {
            while let Ok(Some(response)) = watch.message().await {
                let now = Instant::now();
                let mut commits = commits.lock().unwrap();
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    if event.event_type() == EventType::Put && kv.key().ends_with(b"/tip") {
                        commits.entry(kv.key().to_vec()).or_default().push(now);
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    // --- phase: drain n1 and wait
    let started = Instant::now();
    let drained = etcd.tool(["drain", "n1", "--wait"]).await;
    let took = started.elapsed();
    assert!(drained.status.success(), "{drained:?}");
    assert!(String::from_utf8_lossy(&drained.stdout).contains("n1 drained"));
    wait_for(
        "the others own all 300",
        Duration::from_secs(10),
        || async { (held().await? == [150, 0, 150]).then_some(()) },
    )
    .await
    .unwrap();
    let all_owned = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ended = Instant::now();
    watcher.abort();
    println!(
        "n1 drained of 100 sessions in {took:?} (the command); all 300 owned by n0 and n2 after {all_owned:?}"
    );
    assert!(
        took <= Duration::from_secs(2),
        "2 s per 100 sessions: {took:?}"
    );

    // --- checks: every journal advanced, with no gap over 1 s, from a second before the drain
    // to two after it
    let commits = std::mem::take(&mut *commits.lock().unwrap());
    assert_eq!(commits.len(), SESSIONS, "every journal committed");
    let mut worst = Duration::ZERO;
    for (key, times) in commits.iter() {
        let mut last = started - Duration::from_secs(1);
        for &at in times.iter().chain([&ended]) {
            let gap = at.saturating_duration_since(last);
            assert!(
                gap <= Duration::from_secs(1),
                "{}: {gap:?} without a commit",
                String::from_utf8_lossy(key)
            );
            worst = worst.max(gap);
            last = at;
        }
    }
    println!("the longest a journal went without a commit: {worst:?}");

    // --- no heartbeat failed, every journal is sound
    for i in 0..3 {
        let printed = std::fs::read_to_string(log(i)).unwrap();
        let failed: Vec<&str> = printed.lines().filter(|l| l.contains("failed")).collect();
        assert!(failed.is_empty(), "n{i}: {failed:#?}");
    }
    let checked = etcd.tool(["check"]).await;
    assert!(checked.status.success(), "{checked:?}");

    // --- phase: undrain gives n1 its share back
    let undrained = etcd.tool(["undrain", "n1"]).await;
    assert!(undrained.status.success(), "{undrained:?}");
    wait_for("100 each again", Duration::from_secs(20), || async {
        (held().await? == [100, 100, 100]).then_some(())
    })
    .await
    .unwrap();
    for node in &mut nodes {
        node.start_kill().unwrap();
    }
}
