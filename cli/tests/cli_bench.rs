//! `leasehold bench --json` prints one object per result, in the documented schema, with the
//! ratio of the two numbers it reports; progress goes to stderr; bad input exits 2. On a
//! cluster of yours it writes beside `--namespace`, never under it, and removes its keys
//! however it ends: done, a scenario's error, SIGINT or SIGTERM (exit code 130), within a
//! bound when the cluster went silent.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

fn bench(args: &[&str], etcd: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("bench")
        .args(args)
        .env("LEASEHOLD_ETCD_BIN", etcd)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .output()
        .expect("runs")
}

/// `leasehold bench` with `args`, on an etcd of its own: it succeeds. Its stdout's lines, each
/// parsed as JSON, and its stderr.
async fn bench_json(args: &'static [&'static str]) -> (Vec<serde_json::Value>, String) {
    let etcd = leasehold::testing::etcd_binary("3.5.16")
        .await
        .expect("the etcd binary");
    let output = tokio::task::spawn_blocking(move || bench(args, &etcd))
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let results = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect();
    (results, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_follow_the_schema_and_progress_goes_to_stderr() {
    let (results, stderr) = bench_json(&["group_commit", "--rounds", "1", "--json"]).await;
    assert!(
        stderr.contains("bench: group_commit: round 1/1"),
        "{stderr}"
    );
    assert_eq!(results.len(), 1, "one result line: {results:?}");
    let result = &results[0];
    let object = result.as_object().unwrap();
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "baseline",
            "baseline_name",
            "better",
            "metric",
            "ours",
            "p50_ms",
            "p99_ms",
            "ratio",
            "scenario",
            "unit"
        ]
    );
    assert_eq!(result["scenario"], "group_commit");
    assert_eq!(result["better"], "higher");
    let (ours, baseline, ratio) = (
        result["ours"].as_f64().unwrap(),
        result["baseline"].as_f64().unwrap(),
        result["ratio"].as_f64().unwrap(),
    );
    assert!(ours > 0.0 && baseline > 0.0);
    assert!((ratio - ours / baseline).abs() < 1e-9);
    let (p50, p99) = (
        result["p50_ms"].as_f64().unwrap(),
        result["p99_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "{p50} {p99}");
}

/// The sidecar scenario reports each of its lines beside the transport's bound: a no-op call
/// over the same channel, with and without an in-process append after it.
#[tokio::test(flavor = "multi_thread")]
async fn the_sidecar_scenario_reports_the_transports_bound_beside_its_own() {
    let (results, _) = bench_json(&["sidecar_append", "--rounds", "1", "--json"]).await;
    let metrics: Vec<&str> = results
        .iter()
        .map(|result| result["metric"].as_str().unwrap())
        .collect();
    assert_eq!(
        metrics,
        [
            "sequential",
            "sequential, bound",
            "64 concurrent callers",
            "64 callers, bound",
            "64 callers, no-op calls",
            "sequential, request ids",
            "64 callers, request ids",
            "64 callers, per txn"
        ]
    );
    for result in &results {
        assert_eq!(result["scenario"], "sidecar_append");
        let (ours, baseline) = (
            result["ours"].as_f64().unwrap(),
            result["baseline"].as_f64().unwrap(),
        );
        assert!(ours > 0.0 && baseline > 0.0, "{result}");
    }
    // A line and its bound are measured against the same in-process rounds.
    assert_eq!(results[0]["baseline"], results[1]["baseline"]);
    assert_eq!(results[2]["baseline"], results[3]["baseline"]);
    assert_eq!(results[2]["baseline"], results[4]["baseline"]);
    // What request ids cost: the sequential line with them against the same calls without.
    assert_eq!(results[5]["ours"], results[0]["ours"]);
}

/// The sidecar's memory: a `leasehold serve` process at its defaults, per owned session and
/// per request id, and what it needs at its defaults.
#[tokio::test(flavor = "multi_thread")]
async fn the_sidecar_memory_scenario_measures_a_serve_process() {
    let (results, _) = bench_json(&["sidecar_memory", "--json"]).await;
    let metrics: Vec<&str> = results
        .iter()
        .map(|result| result["metric"].as_str().unwrap())
        .collect();
    assert_eq!(
        metrics,
        [
            "resident at start",
            "per owned session",
            "per request id",
            "at its defaults"
        ]
    );
    for result in &results {
        assert_eq!(result["scenario"], "sidecar_memory");
        assert!(result["ours"].as_f64().unwrap().is_finite(), "{result}");
    }
    assert!(results[0]["ours"].as_f64().unwrap() > 0.0, "{}", results[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_exits_2() {
    let etcd = leasehold::testing::etcd_binary("3.5.16")
        .await
        .expect("the etcd binary");
    let output = tokio::task::spawn_blocking(move || {
        (
            bench(&["no_such_scenario"], &etcd),
            bench(&["append", "--rounds", "0"], &etcd),
        )
    })
    .await
    .unwrap();
    assert_eq!(output.0.status.code(), Some(2));
    assert_eq!(output.1.status.code(), Some(2));
}

/// `leasehold bench` on the cluster at `endpoint`, with `--namespace tenant`, running.
fn spawn_bench(args: &[&str], endpoint: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("bench")
        .args(args)
        .args(["--endpoints", endpoint, "--namespace", "tenant"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("runs")
}

/// Waits (at most 60 s) until the etcd behind `raw` holds more than `keys` keys.
async fn wait_for_keys(raw: &etcd_client::Client, keys: i64) {
    leasehold::testing::wait_for("the bench writes", Duration::from_secs(60), || async {
        (common::count(raw, "").await > keys).then_some(())
    })
    .await
    .unwrap();
}

fn signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("still running").to_string();
    let sent = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
}

/// Waits (at most `within`) for `child` to exit; its exit code and stderr.
async fn exit(child: tokio::process::Child, within: Duration) -> (Option<i32>, String) {
    let output = tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("it exits within {within:?}"))
        .expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("{stderr}");
    (output.status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_bench_removes_its_keys_and_exits_130() {
    let etcd = leasehold::testing::EtcdNode::start()
        .await
        .expect("etcd starts");
    let raw = common::raw(etcd.endpoint()).await;
    raw.clone().put("unrelated", "stays", None).await.unwrap();
    let from = common::revision(&raw).await + 1;
    let child = spawn_bench(&["append", "--rounds", "1000"], etcd.endpoint());
    wait_for_keys(&raw, 10).await;
    signal(&child, "-INT");
    let (code, stderr) = exit(child, Duration::from_secs(30)).await;
    let left: Vec<String> = common::all_keys(&raw)
        .await
        .into_iter()
        .filter(|key| key != "unrelated")
        .collect();
    assert!(left.is_empty(), "left: {}\n{stderr}", common::few(&left));
    assert_eq!(code, Some(130), "{stderr}");
    let put = common::keys_put_since(&raw, from).await;
    assert!(
        put.iter().all(|key| key.starts_with("tenant-bench-")),
        "{}",
        common::few(&put)
    );
    assert!(
        stderr.contains("bench removed namespace tenant-bench-"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().last(),
        Some("leasehold: interrupted"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bench_whose_scenario_fails_removes_its_keys() {
    // etcd raises NOSPACE while the bench appends: its next append is refused, the scenario
    // fails, and deletes (which etcd takes under NOSPACE) remove what it wrote.
    let etcd = common::nospace::small_etcd().await;
    let raw = etcd.raw.clone();
    let child = spawn_bench(&["append", "--rounds", "1000"], etcd.node.endpoint());
    wait_for_keys(&raw, 10).await;
    let filler = vec![b'x'; 1_000_000];
    for i in 0.. {
        assert!(i < 100, "a 16 MiB etcd filled by 100 puts of 1 MB");
        match raw
            .clone()
            .put(format!("filler/{i}"), filler.clone(), None)
            .await
        {
            Ok(_) => {}
            Err(error) if error.to_string().contains("database space exceeded") => break,
            Err(error) => panic!("put {i}: {error}"),
        }
    }
    let (code, stderr) = exit(child, Duration::from_secs(60)).await;
    let left: Vec<String> = common::all_keys(&raw)
        .await
        .into_iter()
        .filter(|key| !key.starts_with("filler/"))
        .collect();
    assert!(left.is_empty(), "left: {}\n{stderr}", common::few(&left));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("database space exceeded"), "{stderr}");
    assert!(
        stderr.contains("bench removed namespace tenant-bench-"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_writes_beside_the_users_namespace_never_under_it() {
    let etcd = leasehold::testing::EtcdNode::start()
        .await
        .expect("etcd starts");
    let raw = common::raw(etcd.endpoint()).await;
    let from = common::revision(&raw).await + 1;
    let child = spawn_bench(&["group_commit", "--rounds", "1"], etcd.endpoint());
    let (code, stderr) = exit(child, Duration::from_secs(120)).await;
    let put = common::keys_put_since(&raw, from).await;
    assert!(!put.is_empty(), "the bench wrote: {stderr}");
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
        put.iter().all(|key| key.starts_with("tenant-bench-")),
        "{}",
        common::few(&put)
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(common::all_keys(&raw).await.is_empty(), "every key removed");
    assert!(
        stderr.contains("bench removed namespace tenant-bench-"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_bench_on_a_silent_cluster_exits_within_the_bound() {
    let etcd = leasehold::testing::EtcdNode::start()
        .await
        .expect("etcd starts");
    let raw = common::raw(etcd.endpoint()).await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let child = spawn_bench(&["append", "--rounds", "1000"], &proxy.endpoint());
    wait_for_keys(&raw, 10).await;
    proxy.blackhole();
    let silenced = std::time::Instant::now();
    signal(&child, "-TERM");
    let (code, stderr) = exit(child, Duration::from_secs(30)).await;
    println!(
        "exited {:?} after the cluster went silent",
        silenced.elapsed()
    );
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("bench could not remove namespace tenant-bench-"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().last(),
        Some("leasehold: interrupted"),
        "{stderr}"
    );
    // 10 s to remove the keys, and some slack for a loaded machine.
    assert!(silenced.elapsed() < Duration::from_secs(20));
}
