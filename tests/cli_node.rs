//! Three `leasehold node` processes share 30 sessions: each owned by exactly one; a killed
//! node's sessions move within TTL + 2 s, a leaving node's within 1 s; every journal stays
//! sound.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use leasehold::testing::{AppendHistory, EtcdNode, check_journal, random_namespace, wait_for};
use leasehold::{Namespace, Uuid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const SESSIONS: usize = 30;
const TTL: u64 = 3;

fn spawn_node(endpoint: &str, namespace: &Namespace, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "node",
            "--sessions",
            &SESSIONS.to_string(),
            "--endpoints",
            endpoint,
            "--namespace",
            namespace.as_str(),
            "--node",
            name,
            "--ttl",
            &TTL.to_string(),
            "--margin",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts")
}

/// Whether every owned session's journal is open under its current owner: its tip was written
/// at the owner's epoch (the fence, or a heartbeat after it).
async fn journals_open(raw: &etcd_client::Client, namespace: &Namespace) -> bool {
    for (session, _, epoch) in owner_keys(raw, namespace).await {
        let tip = raw
            .clone()
            .get(namespace.tip_key(session), None)
            .await
            .unwrap();
        // tip = version:u8 seq:u64 epoch:u64 nonce:[u8;16]
        let tip_epoch = tip
            .kvs()
            .first()
            .map(|t| u64::from_be_bytes(t.value()[9..17].try_into().unwrap()));
        if tip_epoch != Some(epoch as u64) {
            return false;
        }
    }
    true
}

async fn journals_open_within(raw: &etcd_client::Client, namespace: &Namespace) {
    wait_for(
        "every journal open under its owner",
        Duration::from_secs(30),
        || async { journals_open(raw, namespace).await.then_some(()) },
    )
    .await
    .unwrap();
}

/// (session, owning node, epoch) of every owner key.
async fn owner_keys(raw: &etcd_client::Client, namespace: &Namespace) -> Vec<(Uuid, String, i64)> {
    let response = raw
        .clone()
        .get(
            namespace.owners_prefix(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| {
            let key = std::str::from_utf8(kv.key()).unwrap();
            let session = key.rsplit('/').next().unwrap().parse().unwrap();
            // leasehold-owner/1 {store} {nonce} {node}
            let value = std::str::from_utf8(kv.value()).unwrap();
            let node = value.splitn(4, ' ').nth(3).unwrap().to_owned();
            (session, node, kv.create_revision())
        })
        .collect()
}

/// session → owning node, read from the owner keys themselves.
async fn owners(raw: &etcd_client::Client, namespace: &Namespace) -> HashMap<Uuid, String> {
    owner_keys(raw, namespace)
        .await
        .into_iter()
        .map(|(session, node, _)| (session, node))
        .collect()
}

async fn wait_until_owned(
    raw: &etcd_client::Client,
    ns: &Namespace,
    what: &str,
    timeout: Duration,
    accept: impl Fn(&HashMap<Uuid, String>) -> bool,
) -> HashMap<Uuid, String> {
    wait_for(what, timeout, || async {
        let owners = owners(raw, ns).await;
        (owners.len() == SESSIONS && accept(&owners)).then_some(owners)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_move_when_a_node_dies_or_leaves() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let raw = common::raw(etcd.endpoint()).await;
    let mut nodes: HashMap<&str, Child> = ["a", "b", "c"]
        .into_iter()
        .map(|name| (name, spawn_node(etcd.endpoint(), &ns, name)))
        .collect();

    // --- every session owned, by exactly one node (one owner key each), its journal open
    wait_until_owned(
        &raw,
        &ns,
        "all 30 sessions owned",
        Duration::from_secs(30),
        |_| true,
    )
    .await;
    journals_open_within(&raw, &ns).await;
    let before = owners(&raw, &ns).await;
    let count =
        |owners: &HashMap<Uuid, String>, node: &str| owners.values().filter(|n| *n == node).count();
    println!(
        "owned: a {}, b {}, c {}",
        count(&before, "a"),
        count(&before, "b"),
        count(&before, "c")
    );

    // --- SIGKILL the node that owns the most: its sessions come back within TTL + 2 s
    let victim = ["a", "b", "c"]
        .into_iter()
        .max_by_key(|n| count(&before, n))
        .unwrap();
    let killed = Instant::now();
    nodes.get_mut(victim).unwrap().start_kill().unwrap();
    wait_until_owned(
        &raw,
        &ns,
        "the killed node's sessions owned again",
        Duration::from_secs(TTL + 2),
        |owners| count(owners, victim) == 0,
    )
    .await;
    println!(
        "killed node {victim}'s sessions owned again after {:?}",
        killed.elapsed()
    );
    journals_open_within(&raw, &ns).await;
    let after_kill = owners(&raw, &ns).await;

    // --- SIGTERM another: its sessions move within 1 s
    let leaver = ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != victim)
        .max_by_key(|n| count(&after_kill, n))
        .unwrap();
    let pid = nodes[leaver].id().unwrap();
    let left = Instant::now();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    wait_until_owned(
        &raw,
        &ns,
        "the leaving node's sessions moved",
        Duration::from_secs(1),
        |owners| count(owners, leaver) == 0,
    )
    .await;
    println!(
        "leaving node {leaver}'s sessions moved after {:?}",
        left.elapsed()
    );
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        nodes.get_mut(leaver).unwrap().wait(),
    )
    .await
    .expect("the leaving node exits")
    .unwrap();
    assert!(status.success(), "graceful exit: {status}");

    // --- every journal is one sound chain (the heartbeats' results are unknown here)
    tokio::time::sleep(Duration::from_millis(1500)).await; // a heartbeat into each
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "checker", 10).await;
    let mut total = 0;
    for (session, first_owner) in &before {
        let report = check_journal(&store, *session, &AppendHistory::default())
            .await
            .unwrap_or_else(|violation| panic!("{violation}"));
        if first_owner == victim || first_owner == leaver {
            assert!(
                report.fence_epochs.len() >= 2,
                "a moved session has its new owner's fence"
            );
        }
        total += report.records;
    }
    println!("{SESSIONS} journals, {total} records, all sound");
}
