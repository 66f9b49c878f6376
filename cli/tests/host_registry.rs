//! The shared session registry: three `leasehold node --registry` processes, and 1,000
//! sessions created at 200/s through `Admin::create_session` in this one. Each is owned by one
//! of the nodes, once (from etcd's history: no owner key created twice, none deleted), within
//! a bound of its creation (the figures printed), and the balance holds (334/333/333). Then
//! finishing sessions releases them and deletes their journals; `leasehold sessions` lists
//! what is left.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use leasehold::admin::Admin;
use leasehold::testing::wait_for;
use leasehold::{ConnectOptions, Connection, Uuid};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const SESSIONS: usize = 1000;
const PER_SECOND: u64 = 200;

fn node(endpoint: &str, namespace: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["node", "--registry", "--settle", "0s", "--interval", "1s"])
        .args(["--endpoints", endpoint, "--namespace", namespace])
        .args(["--node", name, "--ttl", "5", "--margin", "1"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .stdout(std::fs::File::create(format!("/tmp/reg-{name}.log")).unwrap())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts")
}

/// When this process saw each session's registry key and owner key created, and how many times
/// each owner key was created, and how many deleted, from one watch of the namespace.
#[derive(Default)]
struct Seen {
    registered: HashMap<Uuid, Instant>,
    owned: HashMap<Uuid, Instant>,
    acquisitions: HashMap<Uuid, usize>,
    owner_deletes: usize,
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_created_anywhere_are_owned_once_and_balanced() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = etcd.ns.clone();
    let connection = Connection::connect(ConnectOptions::new([endpoint.clone()]))
        .await
        .unwrap();
    let admin = Admin::new(connection, ns.clone());
    let mut nodes: Vec<Child> = (0..3)
        .map(|i| node(&endpoint, ns.as_str(), &format!("n{i}")))
        .collect();
    wait_for("three live hosts", Duration::from_secs(30), || async {
        (admin.hosts().await.ok()?.len() == 3).then_some(())
    })
    .await
    .unwrap();
    // Each has listed the others (a balance tick, at most 1 s).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // --- one watch of the namespace, from now: registry and owner keys, arrival times
    let from = common::revision(&etcd.raw).await + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut watch = etcd
        .raw
        .clone()
        .watch(ns.prefix(), Some(options))
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watcher = tokio::spawn({
        let seen = seen.clone();
        let (sessions, owners) = (ns.sessions_prefix(), ns.owners_prefix());
        async move {
            while let Ok(Some(response)) = watch.message().await {
                let now = Instant::now();
                let mut seen = seen.lock().unwrap();
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key());
                    let created = event.event_type() == EventType::Put && kv.version() == 1;
                    if let Some(id) = key.strip_prefix(&sessions) {
                        if created {
                            seen.registered.insert(id.parse().unwrap(), now);
                        }
                    } else if let Some(id) = key.strip_prefix(&owners) {
                        let session: Uuid = id.parse().unwrap();
                        if created {
                            seen.owned.entry(session).or_insert(now);
                            *seen.acquisitions.entry(session).or_insert(0) += 1;
                        } else if event.event_type() == EventType::Delete {
                            seen.owner_deletes += 1;
                        }
                    }
                }
            }
        }
    });

    // --- 1,000 sessions created at 200/s
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let mut pace = tokio::time::interval(Duration::from_micros(1_000_000 / PER_SECOND));
    let started = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for (i, &session) in sessions.iter().enumerate() {
        pace.tick().await;
        let admin = admin.clone();
        creates.spawn(async move {
            let (registered, created) = admin
                .create_session(session, format!("conversation {i}").as_bytes())
                .await
                .unwrap();
            assert!(created && registered.session == session);
        });
    }
    let creating = started.elapsed();
    while let Some(created) = creates.join_next().await {
        created.unwrap();
    }
    wait_for("every session owned", Duration::from_secs(30), || async {
        (seen.lock().unwrap().owned.len() == SESSIONS).then_some(())
    })
    .await
    .unwrap();
    // Settled: nothing moves after.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut latencies: Vec<Duration> = {
        let seen = seen.lock().unwrap();
        sessions
            .iter()
            .map(|session| seen.owned[session].duration_since(seen.registered[session]))
            .collect()
    };
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "{SESSIONS} sessions created in {creating:?}; owned after their creation: p50 {:?}, p99 {:?}, max {:?}",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    {
        let seen = seen.lock().unwrap();
        let twice: Vec<_> = seen.acquisitions.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "sessions acquired more than once: {twice:?}"
        );
        assert_eq!(seen.owner_deletes, 0, "no session handed over or released");
    }
    // A liveness bound, far above the figures printed: the watch event and one acquisition.
    assert!(at(0.99) < Duration::from_secs(2), "p99 {:?}", at(0.99));
    let mut held: Vec<usize> = admin
        .hosts()
        .await
        .unwrap()
        .iter()
        .map(|host| host.sessions)
        .collect();
    held.sort();
    println!("held: {held:?}");
    assert_eq!(held, [333, 333, 334], "the balance holds");

    // --- finishing: released in order, journals deleted, the registry shrinks
    for &session in &sessions[..10] {
        let finished = admin
            .finish_session(session, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(finished.was_registered);
        assert!(finished.journal.keys > 0, "its journal is deleted");
        assert!(admin.owner(session).await.unwrap().is_none());
        assert_eq!(
            common::count(&etcd.raw, &ns.journal_prefix(session)).await,
            0
        );
    }
    let again = admin
        .finish_session(sessions[0], Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        !again.was_registered && again.journal.keys == 0,
        "idempotent"
    );
    assert_eq!(admin.sessions().await.unwrap().len(), SESSIONS - 10);
    let listed = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", &endpoint, "--namespace", ns.as_str()])
        .args(["sessions", "list", "--json"])
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .output()
        .await
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), SESSIONS - 10);
    assert!(lines.iter().all(|line| {
        line["metadata"]
            .as_str()
            .unwrap()
            .starts_with("conversation ")
    }));
    wait_for("990 owned", Duration::from_secs(10), || async {
        let owned = common::count(&etcd.raw, &ns.owners_prefix()).await;
        (owned == (SESSIONS - 10) as i64).then_some(())
    })
    .await
    .unwrap();
    watcher.abort();
    for node in &mut nodes {
        node.start_kill().unwrap();
    }
}
