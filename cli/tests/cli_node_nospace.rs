//! `leasehold node` under etcd's NOSPACE alarm: another tenant fills a small etcd; the node says
//! so once at WARN (how many sessions it blocks, the way out), `/readyz` answers 503 and the
//! metrics show it; once an operator frees space and disarms the alarm, the heartbeats resume
//! by themselves within 2 s, and the journals are sound.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::nospace;
use common::{get, sample};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

/// Lines of a child's output, each with the instant it was read.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

fn collect(stream: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Lines {
    let lines: Lines = Arc::default();
    let sink = lines.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            sink.lock().unwrap().push((Instant::now(), line));
        }
    });
    lines
}

/// Waits until `condition` holds, checking every 20 ms, for at most `timeout`.
async fn until(what: &str, timeout: Duration, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn matching(lines: &Lines, pattern: &str) -> Vec<(Instant, String)> {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, line)| line.contains(pattern))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_says_nospace_once_reports_it_and_resumes_by_itself_once_disarmed() {
    let etcd = nospace::small_etcd().await;
    let mut node = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args(["--node", "full", "--ttl", "5", "--margin", "1"])
        .args(["node", "--sessions", "2", "--print-appends", "--keep", "20"])
        .args(["--settle", "0s"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env_remove("LEASEHOLD_METRICS_ADDR")
        .env_remove("LEASEHOLD_LOG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = collect(node.stdout.take().unwrap());
    let stderr = collect(node.stderr.take().unwrap());
    let node_label = "node=\"full\"";
    let scrape = |addr: String| async move { get(&addr, "/metrics").await.1 };

    // --- phase: two sessions owned, heartbeats appended
    until("two sessions heartbeating", Duration::from_secs(20), || {
        let appended = matching(&stdout, " appended session=");
        let sessions: std::collections::HashSet<_> = appended
            .iter()
            .filter_map(|(_, line)| line.split("session=").nth(1)?.split(' ').next())
            .map(str::to_owned)
            .collect();
        sessions.len() == 2
    })
    .await;
    let addr = matching(&stdout, "metrics at http://")[0]
        .1
        .split("metrics at http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_owned();
    assert_eq!(get(&addr, "/readyz").await.0, 200);
    let metrics = scrape(addr.clone()).await;
    assert_eq!(
        sample(&metrics, "leasehold_nospace", &[node_label]),
        Some(0.0)
    );

    // --- phase: another tenant fills etcd until it raises NOSPACE
    let filler = "x".repeat(1_000_000);
    let mut raw = etcd.raw.clone();
    for i in 0.. {
        assert!(i < 100, "a 16 MiB etcd fills with 100 values of 1 MB");
        match raw
            .put(format!("other-tenant/{i}"), filler.as_str(), None)
            .await
        {
            Ok(_) => {}
            Err(error) if error.to_string().contains("database space exceeded") => break,
            Err(error) => panic!("{error}"),
        }
    }
    let raised = Instant::now();
    assert!(nospace::nospace(&etcd.raw).await);

    // --- the node says so once, at WARN; /readyz and the metrics report it
    until("the node says NOSPACE", Duration::from_secs(10), || {
        !matching(&stderr, "NOSPACE alarm").is_empty()
    })
    .await;
    let said = matching(&stderr, "NOSPACE alarm");
    let warning = &said[0].1;
    println!("said {:?} after the alarm: {warning}", said[0].0 - raised);
    for words in [
        "WARN",
        "2 sessions this node owns",
        "trim",
        "compact",
        "defragment",
        "disarm",
        "docs/production.md",
    ] {
        assert!(warning.contains(words), "{words:?} in {warning}");
    }
    let (status, body) = get(&addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("NOSPACE"), "{body}");
    let metrics = scrape(addr.clone()).await;
    assert_eq!(
        sample(&metrics, "leasehold_nospace", &[node_label]),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "leasehold_nospace_alarms_total", &[node_label]),
        Some(1.0)
    );
    // Heartbeats go on failing, and the node does not say it again.
    until(
        "heartbeats refused for space",
        Duration::from_secs(10),
        || {
            matching(&stdout, "database space exceeded")
                .iter()
                .filter(|(at, _)| *at > raised)
                .count()
                >= 4
        },
    )
    .await;
    assert_eq!(matching(&stderr, "NOSPACE alarm").len(), 1, "said once");

    // --- phase: the operator's way out: free space, compact, defragment, disarm
    raw.delete(
        "other-tenant/",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("a delete passes under NOSPACE");
    nospace::compact_and_defrag(&etcd.raw).await;
    let disarmed = Instant::now();
    nospace::disarm(&etcd.raw).await;

    // --- the heartbeats resume by themselves within 2 s
    until("heartbeats resume", Duration::from_secs(10), || {
        matching(&stdout, " appended session=")
            .iter()
            .any(|(at, _)| *at > disarmed)
    })
    .await;
    let resumed = matching(&stdout, " appended session=")
        .into_iter()
        .find(|(at, _)| *at > disarmed)
        .unwrap()
        .0;
    println!("first append {:?} after the disarm", resumed - disarmed);
    assert!(
        resumed - disarmed <= Duration::from_secs(2),
        "{:?}",
        resumed - disarmed
    );
    until("the node says so", Duration::from_secs(5), || {
        !matching(&stderr, "etcd takes writes again after").is_empty()
    })
    .await;
    assert_eq!(get(&addr, "/readyz").await.0, 200);
    let metrics = scrape(addr.clone()).await;
    assert_eq!(
        sample(&metrics, "leasehold_nospace", &[node_label]),
        Some(0.0)
    );
    assert_eq!(
        sample(&metrics, "leasehold_nospace_alarms_total", &[node_label]),
        Some(1.0)
    );
    assert!(
        matching(&stdout, "trim session=").is_empty(),
        "no trim failed: {:?}",
        matching(&stdout, "trim session=")
    );
    assert!(
        matching(&stdout, " lost session=").is_empty(),
        "no session lost"
    );

    // --- the journals are sound
    let check = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .arg("check")
        .output()
        .await
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    node.kill().await.unwrap();
}
