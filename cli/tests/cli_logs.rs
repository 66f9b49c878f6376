//! `--log-format json`: every log line is one JSON object, and events carry the spans that
//! name their store (node, namespace) and their session and epoch.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_name_node_namespace_session_and_epoch() {
    let etcd = common::Etcd::start().await;
    let mut node = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "--endpoints",
            etcd.node.endpoint(),
            "--namespace",
            etcd.ns.as_str(),
        ])
        .args(["--node", "logger", "--log-format", "json"])
        .args(["node", "--sessions", "1", "--settle", "0s"])
        .env("LEASEHOLD_LOG", "info")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(node.stdout.take().unwrap()).lines();
    let mut stderr = node.stderr.take().unwrap();
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        stderr.read_to_string(&mut text).await.unwrap();
        text
    });
    loop {
        let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
            .await
            .expect("the node acquires its session")
            .unwrap()
            .expect("a line");
        if line.contains("acquired session=") {
            break;
        }
    }
    let status = common::terminate(&mut node, Duration::from_secs(20)).await;
    assert!(status.success());
    let logs = errors.await.unwrap();

    let lines: Vec<Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let span = |line: &Value, name: &str| -> Option<Value> {
        line["spans"]
            .as_array()?
            .iter()
            .find(|span| span["name"] == name)
            .cloned()
    };
    let connected = lines
        .iter()
        .find(|line| line["fields"]["message"] == "store connected")
        .unwrap_or_else(|| panic!("a 'store connected' event: {logs}"));
    let store = span(connected, "store").expect("in the store's span");
    assert_eq!(store["node"], "logger");
    assert_eq!(store["namespace"], etcd.ns.as_str());
    let lost = lines
        .iter()
        .find(|line| line["fields"]["message"] == "lease lost")
        .unwrap_or_else(|| panic!("a 'lease lost' event on shutdown: {logs}"));
    let release = span(lost, "release").unwrap_or_else(|| panic!("in a release span: {lost}"));
    assert!(
        release["session"].as_str().is_some_and(|s| s.len() == 36),
        "{lost}"
    );
    assert!(release["epoch"].as_str().is_some(), "{lost}");
    assert_eq!(span(lost, "store").unwrap()["node"], "logger");
}
