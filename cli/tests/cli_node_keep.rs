//! `leasehold node --keep N` bounds every journal it owns: over 20 sessions appending a
//! heartbeat every 50 ms for 60 s, no journal ever holds more than N + one trim batch, and each
//! stays sound.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::{ConnectOptions, Connection, Uuid};
use tokio::process::Command;
use tokio::time::Instant;

const SESSIONS: usize = 20;
const KEEP: u64 = 100;
/// `trim_batch(100)` of the node: a journal is trimmed back to 100 once it holds more than
/// 125, and holds at most 150.
const BATCH: u64 = 50;
const RUN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn keep_bounds_every_journal_while_the_node_appends() {
    let etcd = common::Etcd::start().await;
    let mut node = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "--endpoints",
            etcd.node.endpoint(),
            "--namespace",
            etcd.ns.as_str(),
        ])
        .args(["--node", "keeper", "--ttl", "5"])
        .args(["node", "--sessions", &SESSIONS.to_string()])
        .args(["--keep", &KEEP.to_string(), "--interval", "50ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    let admin = Admin::new(connection, etcd.ns.clone());

    // --- phase: sample every journal's length while the node runs
    let started = Instant::now();
    let mut sessions: Vec<Uuid> = Vec::new();
    let mut longest = 0u64;
    let mut samples = 0usize;
    while started.elapsed() < RUN {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if sessions.len() < SESSIONS {
            sessions = admin.journals().await.unwrap();
        }
        for &session in &sessions {
            let info = admin.journal(session).await.unwrap();
            longest = longest.max(info.len());
            assert!(
                info.len() <= KEEP + BATCH,
                "{session} holds {} records ({}..={:?}) at {:?}",
                info.len(),
                info.base,
                info.tip.map(|t| t.seq),
                started.elapsed()
            );
        }
        samples += 1;
    }
    assert_eq!(sessions.len(), SESSIONS, "every session was owned");

    // --- the node stops in order; every journal is bounded, trimmed and sound
    let status = common::terminate(&mut node, Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
    let mut appended = Vec::new();
    for &session in &sessions {
        let info = admin.journal(session).await.unwrap();
        let tip = info.tip.unwrap().seq;
        assert!(
            info.len() <= KEEP + BATCH,
            "{session}: {} records",
            info.len()
        );
        assert!(info.base > 1, "{session} was trimmed");
        let check = admin.check(session).await.unwrap();
        assert!(check.is_sound(), "{session}: {:?}", check.violations);
        appended.push(tip);
    }
    appended.sort_unstable();
    println!(
        "{samples} samples over {RUN:?}: longest journal {longest} records (bound {}); \
         records appended per journal: {} to {}",
        KEEP + BATCH,
        appended[0],
        appended[appended.len() - 1]
    );
    assert!(
        appended[0] > 2 * (KEEP + BATCH),
        "enough appended that trimming was needed: {appended:?}"
    );
}
