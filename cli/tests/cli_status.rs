//! `leasehold status` names the member that answers and counts exactly what the namespace
//! holds: owned sessions, owned workspace roots and all keys (journals included), at one
//! revision; the counts follow releases, and it exits 0.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use leasehold::Rig;
use leasehold::{Namespace, Uuid};

/// What one `leasehold status` run printed.
struct Status {
    /// The member line.
    member: String,
    /// The namespace line up to its revision: `namespace …: … keys`.
    counts: String,
    revision: i64,
}

/// Runs `leasehold status` on `endpoint` for `namespace`; it must exit 0 within 20 s and say
/// nothing on stderr but that the test's etcd is older than the minimum for production.
async fn status(endpoint: &str, namespace: &Namespace) -> Status {
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "status",
                "--endpoints",
                endpoint,
                "--namespace",
                namespace.as_str(),
            ])
            .env_remove("LEASEHOLD_ENDPOINTS")
            .env_remove("LEASEHOLD_NAMESPACE")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("status answers within 20 s")
    .expect("status runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    println!("{stdout}");
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    // The test's etcd (3.5.16) is older than the minimum for production: one warning says so.
    let warnings: Vec<&str> = stderr.lines().collect();
    assert_eq!(warnings.len(), 1, "one line on stderr: {stderr}");
    assert!(
        warnings[0].contains("WARN") && warnings[0].contains("is older than 3.5.28"),
        "{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "two lines: {stdout}");
    let (counts, revision) = lines[1]
        .strip_suffix(')')
        .and_then(|line| line.split_once(" (revision "))
        .unwrap_or_else(|| panic!("a revision at the end: {}", lines[1]));
    Status {
        member: lines[0].to_owned(),
        counts: counts.to_owned(),
        revision: revision.parse().expect("a revision"),
    }
}

/// The namespace line `leasehold status` must print, without its revision.
fn counts(namespace: &Namespace, sessions: u64, workspaces: u64, keys: u64) -> String {
    format!(
        "namespace {namespace}: {sessions} owned sessions, {workspaces} owned workspaces, {keys} keys",
        namespace = namespace.as_str()
    )
}

/// Runs `leasehold status` and checks its counts; its revision must be the one etcd was at
/// (nothing in the namespace is written while it runs).
async fn expect_counts(
    etcd: &common::Etcd,
    (sessions, workspaces, keys): (u64, u64, u64),
) -> Status {
    let before = common::revision(&etcd.raw).await;
    let status = status(etcd.node.endpoint(), &etcd.ns).await;
    let after = common::revision(&etcd.raw).await;
    assert_eq!(
        status.counts,
        counts(&etcd.ns, sessions, workspaces, keys),
        "keys in the namespace: {:#?}",
        keys_under(&etcd.raw, &etcd.ns).await
    );
    assert!(
        (before..=after).contains(&status.revision),
        "revision {} read between {before} and {after}",
        status.revision
    );
    status
}

/// Every key under the namespace, for failure messages.
async fn keys_under(raw: &etcd_client::Client, namespace: &Namespace) -> Vec<String> {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    raw.clone()
        .get(namespace.prefix(), Some(options))
        .await
        .expect("get")
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_counts_what_the_namespace_holds() {
    let etcd = common::Etcd::start().await;

    // --- an empty namespace; the member line names the member that answers
    let empty = expect_counts(&etcd, (0, 0, 0)).await;
    let version = etcd.node.image().version().unwrap_or("");
    let prefix = format!("etcd {version}");
    assert!(
        empty.member.starts_with(&prefix),
        "{prefix:?}: {}",
        empty.member
    );
    let rest = empty
        .member
        .split_once(&format!(" at {}: member ", etcd.node.endpoint()))
        .unwrap_or_else(|| panic!("the endpoint: {}", empty.member))
        .1;
    // A single member leads itself.
    let (member, rest) = rest.split_once(", leader ").expect("a leader");
    let (leader, term) = rest.split_once(", raft term ").expect("a raft term");
    assert_eq!(member, leader, "{}", empty.member);
    assert!(term.parse::<u64>().expect("a term") >= 1);

    // --- a rig on session A (owner, workspace root, journal of a fence and 3 events); a bare
    // lease on B; C's journal (a fence and 2 events) left behind by a released lease
    let store = etcd.store("status", 10).await;
    let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let rig = Rig::open(&store, a, "ws-status").await.unwrap();
    for n in 1..=3 {
        rig.journal().append(format!("a {n}")).await.unwrap();
    }
    let lease_b = store.acquire_lease(b).await.unwrap();
    let lease_c = store.acquire_lease(c).await.unwrap();
    let journal_c = store.open_journal(c, Some(&lease_c)).await.unwrap();
    for n in 1..=2 {
        journal_c.append(format!("c {n}")).await.unwrap();
    }
    journal_c.close().await;
    lease_c.release().await.unwrap();
    // keys: owners A and B, workspace root, A's tip and 4 records, C's tip and 3 records
    expect_counts(&etcd, (2, 1, 2 + 1 + 5 + 4)).await;

    // --- B released: one owner key fewer
    lease_b.release().await.unwrap();
    expect_counts(&etcd, (1, 1, 1 + 1 + 5 + 4)).await;

    // --- the rig shut down: no owner, no workspace root; the journals stay
    rig.shutdown().await.unwrap();
    expect_counts(&etcd, (0, 0, 5 + 4)).await;
    store.close().await;
}
