//! `leasehold bench --json` prints one object per result, in the documented schema, with the
//! ratio of the two numbers it reports; progress goes to stderr; bad input exits 2.

use std::process::Command;

fn bench(args: &[&str], etcd: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("bench")
        .args(args)
        .env("LEASEHOLD_ETCD_BIN", etcd)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .output()
        .expect("runs")
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_follow_the_schema_and_progress_goes_to_stderr() {
    let etcd = leasehold::testing::etcd_binary("3.5.16")
        .await
        .expect("the etcd binary");
    let output = tokio::task::spawn_blocking(move || {
        bench(&["group_commit", "--rounds", "1", "--json"], &etcd)
    })
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("bench: group_commit: round 1/1"),
        "{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one result line: {stdout}");
    let result: serde_json::Value = serde_json::from_str(lines[0]).expect("JSON");
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
