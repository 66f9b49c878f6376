//! `leasehold demo` tells the whole story and exits 0, and its timeline is true: node-a learns
//! that it lost each of its sessions (from its own deadline) before node-c takes that session
//! over, by the event times the demo prints, not by the order of its lines.

use std::collections::HashMap;
use std::process::Command;

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
    let raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let mut before = raw.clone();
    before.put("unrelated", "stays", None).await.unwrap();
    let endpoint = etcd.endpoint().to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["demo", "--endpoints", &endpoint, "--namespace", "tenant"])
            .env_remove("LEASEHOLD_ENDPOINTS")
            .output()
            .expect("runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("demo done"), "{stdout}");
    let removed = stdout
        .lines()
        .find(|line| line.contains("removed namespace tenant/demo-"))
        .unwrap_or_else(|| panic!("says what it removed: {stdout}"));
    println!("{removed}");
    let left = raw
        .clone()
        .get("", Some(etcd_client::GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let keys: Vec<String> = left
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    assert_eq!(keys, ["unrelated"], "only what was there before");
}
