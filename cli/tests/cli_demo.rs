//! `leasehold demo` tells the whole story and exits 0, and its timeline is true: node-a learns
//! that it lost each of its sessions (from its own deadline) before node-c takes that session
//! over, by the event times the demo prints, not by the order of its lines. On a cluster of
//! yours it writes beside `--namespace`, never under it, and removes its keys however it ends
//! (SIGINT: exit code 130).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

/// The session and event time of every line that contains `phrase`: the session is the word
/// right after the phrase, the time the number before the first `s` unit after it
/// (`… at 2.183 s: …`).
fn event_times(stdout: &str, phrase: &str) -> HashMap<String, f64> {
    let mut times = HashMap::new();
    for line in stdout.lines() {
        let Some((_, rest)) = line.split_once(phrase) else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let session = words
            .first()
            .unwrap_or_else(|| panic!("no session: {line}"));
        let time = words
            .windows(2)
            .find(|w| w[1].trim_end_matches([':', ',']) == "s")
            .and_then(|w| w[0].parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no event time: {line}"));
        let earlier = times.insert((*session).to_owned(), time);
        assert!(earlier.is_none(), "one {phrase:?} line per session: {line}");
    }
    times
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_prints_the_timeline_and_exits_0() {
    let etcd = leasehold::testing::etcd_binary("3.5.16")
        .await
        .expect("the etcd binary");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("demo")
            .env("LEASEHOLD_ETCD_BIN", etcd)
            .env_remove("LEASEHOLD_ENDPOINTS")
            .output()
            .expect("runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "node-a acquired session",
        "node-a freezes",
        "node-a knows it lost session",
        "node-c took over session",
        "stale append refused: AppendError",
        "node-b leaves gracefully",
        "fence  epoch",
        "demo done",
    ] {
        assert!(stdout.contains(line), "missing {line:?}");
    }

    // --- node-a knew of each loss before node-c owned that session
    let lost = event_times(&stdout, "node-a knows it lost session ");
    let taken = event_times(&stdout, "node-c took over session ");
    assert_eq!(lost.len(), 2, "node-a loses its two sessions: {lost:?}");
    assert_eq!(taken.len(), 4, "node-c takes all four sessions: {taken:?}");
    for (session, lost_at) in &lost {
        let taken_at = taken
            .get(session)
            .unwrap_or_else(|| panic!("node-c took over node-a's session {session}"));
        println!(
            "session {session}: node-a knew at {lost_at:.3} s, node-c owned at {taken_at:.3} s"
        );
        assert!(
            lost_at < taken_at,
            "session {session}: node-a learned of its loss at {lost_at:.3} s, \
             not before node-c took it over at {taken_at:.3} s"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_on_a_cluster_of_yours_removes_what_it_wrote() {
    let etcd = leasehold::testing::EtcdNode::start()
        .await
        .expect("etcd starts");
    let raw = common::raw(etcd.endpoint()).await;
    raw.clone().put("unrelated", "stays", None).await.unwrap();
    let from = common::revision(&raw).await + 1;
    let endpoint = etcd.endpoint().to_owned();
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        demo(&["--endpoints", &endpoint, "--namespace", "tenant"]).output(),
    )
    .await
    .expect("the demo ends within 120 s")
    .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Beside the user's namespace, never under it (docs/production.md: namespaces in use at
    // the same time do not nest).
    let put = common::keys_put_since(&raw, from).await;
    let under: Vec<&String> = put
        .iter()
        .filter(|key| key.starts_with("tenant/"))
        .collect();
    assert!(
        under.is_empty(),
        "under the user's namespace tenant/: {}",
        common::few(under)
    );
    assert!(
        !put.is_empty() && put.iter().all(|key| key.starts_with("tenant-demo-")),
        "{}",
        common::few(&put)
    );
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("demo done"), "{stdout}");
    let removed = stdout
        .lines()
        .find(|line| line.contains("removed namespace tenant-demo-"))
        .unwrap_or_else(|| panic!("says what it removed: {stdout}"));
    println!("{removed}");
    assert_eq!(
        common::all_keys(&raw).await,
        ["unrelated"],
        "only what was there before"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_demo_removes_its_keys_and_exits_130() {
    let etcd = leasehold::testing::EtcdNode::start()
        .await
        .expect("etcd starts");
    let raw = common::raw(etcd.endpoint()).await;
    let from = common::revision(&raw).await + 1;
    let child = demo(&["--endpoints", etcd.endpoint(), "--namespace", "tenant"])
        .spawn()
        .expect("runs");
    leasehold::testing::wait_for("the demo writes", Duration::from_secs(60), || async {
        (common::count(&raw, "").await > 0).then_some(())
    })
    .await
    .unwrap();
    let pid = child.id().expect("still running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("it exits within 30 s of SIGINT")
        .expect("its output");
    let (status, stdout) = (output.status, String::from_utf8_lossy(&output.stdout));
    let left = common::all_keys(&raw).await;
    assert!(left.is_empty(), "left: {}\n{stdout}", common::few(&left));
    let put = common::keys_put_since(&raw, from).await;
    assert!(
        put.iter().all(|key| key.starts_with("tenant-demo-")),
        "not in a namespace beside tenant: {}",
        common::few(&put)
    );
    assert_eq!(status.code(), Some(130), "{stdout}");
    assert!(
        stdout.contains("demo removed namespace tenant-demo-"),
        "{stdout}"
    );
}

/// `leasehold demo` on a cluster of yours, stdout piped.
fn demo(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .arg("demo")
        .args(args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}
