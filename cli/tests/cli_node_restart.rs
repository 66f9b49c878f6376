//! A rolling restart of three `leasehold node`s over 300 sessions with a heartbeat every 200 ms:
//! each node in turn is sent SIGTERM, started again and given time to take its share back. The
//! fleet makes at most 1.1 × the fewest acquisitions a restart can cost (each session's first,
//! and for each restart the restarted node's share twice: away, then back), no session goes
//! more than 1 s between two acknowledged heartbeats, and every journal is one sound chain that
//! holds every acknowledged heartbeat at the sequence number its node was told. Meanwhile
//! `hosts` shows each node's load and `owners` the load of each node's 16 hottest sessions.

#[path = "../../tests/common/mod.rs"]
mod common;

mod nodes;

use std::collections::HashMap;
use std::time::Duration;

use leasehold::Uuid;
use leasehold::testing::{EtcdNode, random_namespace, wait_for};
use tokio::time::Instant;

use nodes::{Node, check_told, count, field, told, tool_json};

const SESSIONS: usize = 300;
const NAMES: [&str; 3] = ["a", "b", "c"];
/// The heartbeat, as the restart this test repeats was tried.
const INTERVAL: &str = "200ms";
/// The longest a session may go between two acknowledged heartbeats.
const GAP_BOUND: Duration = Duration::from_secs(1);
/// How long a restarted node is given to hold its share again (it settles for 2 × TTL first).
const SHARE_BACK: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_moves_each_session_at_most_once_per_change() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let ns = random_namespace();
    let raw = common::raw(etcd.endpoint()).await;
    let args = ["--ttl", "6", "--interval", INTERVAL];
    let spawn = |name| Node::spawn(etcd.endpoint(), &ns, name, SESSIONS, &args);
    let mut nodes: HashMap<&str, Node> = NAMES.into_iter().map(|n| (n, spawn(n))).collect();
    let balanced =
        |owners: &HashMap<Uuid, String>| NAMES.iter().all(|n| count(owners, n) == SESSIONS / 3);
    let what = "300 sessions owned, 100 by each node";
    nodes::wait_until_owned(&raw, &ns, SESSIONS, what, SHARE_BACK, balanced).await;
    // Every session has had a heartbeat acknowledged since: the gaps are measured from here.
    let from = Instant::now() + GAP_BOUND;

    // --- each node in turn: SIGTERM, started again, its share back
    let mut runs: Vec<(&str, Vec<(Instant, String)>)> = Vec::new();
    for name in NAMES {
        let restarted = Instant::now();
        let mut node = nodes.remove(name).unwrap();
        node.terminate();
        let status = node.exited().await;
        assert!(status.success(), "{name} exits 0 on SIGTERM: {status}");
        runs.push((name, node.timed_lines()));
        nodes.insert(name, spawn(name));
        let what = format!("{name} restarted and holding its share again");
        nodes::wait_until_owned(&raw, &ns, SESSIONS, &what, SHARE_BACK, balanced).await;
        println!(
            "{name} restarted; the fleet balanced again after {:?}",
            restarted.elapsed()
        );
        // Time to shed or take more, were anything still to move.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }

    // --- what an operator sees: each node's load, and its 16 hottest sessions' (all alike)
    let shown = wait_for(
        "each node's load and its hottest sessions' shown",
        SHARE_BACK,
        || async {
            let hosts = tool_json(etcd.endpoint(), &ns, &["hosts"]).await;
            let owners = tool_json(etcd.endpoint(), &ns, &["owners"]).await;
            let hosts = hosts["hosts"].as_array()?.clone();
            let owners = owners["owners"].as_array()?.clone();
            // Each node's, or none until every node shows them.
            NAMES
                .iter()
                .map(|name| {
                    let load = hosts.iter().find(|h| h["node"] == *name)?["load"].as_f64()?;
                    let hottest: Vec<f64> = owners
                        .iter()
                        .filter(|owner| owner["node"] == *name)
                        .filter_map(|owner| owner["load"].as_f64())
                        .collect();
                    (load > 0.0 && hottest.len() == 16).then_some((load, hottest))
                })
                .collect::<Option<Vec<_>>>()
        },
    )
    .await
    .unwrap();
    for (name, (load, hottest)) in NAMES.iter().zip(&shown) {
        println!("{name}: load {load:.1}, its hottest sessions' {hottest:.1?}");
        // Heartbeats every 200 ms: some 5 appends per second each (the first samples of a
        // session just taken back read higher or lower).
        assert!(
            hottest.iter().all(|l| (0.5..=50.0).contains(l))
                && hottest.iter().sum::<f64>() <= *load,
            "{name}: load {load}, its hottest sessions' {hottest:?}"
        );
    }
    let to = Instant::now();
    for node in nodes.values() {
        node.terminate();
    }
    for (name, mut node) in nodes {
        let status = node.exited().await;
        assert!(status.success(), "{name} exits 0 on SIGTERM: {status}");
        runs.push((name, node.timed_lines()));
    }

    // --- acquisitions: at most 1.1 × the fewest
    let acquired =
        |name: &str, line: &String| line.contains(&format!("] {name} acquired session="));
    let acquisitions = runs
        .iter()
        .map(|(name, lines)| {
            lines
                .iter()
                .filter(|(_, line)| acquired(name, line))
                .count()
        })
        .sum::<usize>();
    let fewest = SESSIONS + NAMES.len() * 2 * (SESSIONS / 3);
    println!(
        "{acquisitions} acquisitions, {:.2} per session; the fewest a rolling restart can make: {fewest}",
        acquisitions as f64 / SESSIONS as f64
    );
    assert!(
        acquisitions * 10 <= fewest * 11,
        "{acquisitions} acquisitions, over 1.1 × {fewest}"
    );

    // --- gaps: no session goes over GAP_BOUND without an acknowledged heartbeat
    let mut acks: HashMap<Uuid, Vec<Instant>> = HashMap::new();
    for (name, lines) in &runs {
        let appended = format!("] {name} appended session=");
        for (at, line) in lines.iter().filter(|(_, line)| line.contains(&appended)) {
            let session = field(line, "session").unwrap().parse().unwrap();
            acks.entry(session).or_default().push(*at);
        }
    }
    assert_eq!(acks.len(), SESSIONS, "every session was heartbeaten");
    let mut longest: Vec<Duration> = acks
        .values_mut()
        .map(|acks| {
            acks.sort();
            let within: Vec<Instant> = std::iter::once(from)
                .chain(acks.iter().copied().filter(|at| (from..to).contains(at)))
                .chain(std::iter::once(to))
                .collect();
            within.windows(2).map(|w| w[1] - w[0]).max().unwrap()
        })
        .collect();
    longest.sort();
    let (p50, max) = (longest[SESSIONS / 2], longest[SESSIONS - 1]);
    println!(
        "each session's longest gap between acknowledged heartbeats: p50 {p50:?}, max {max:?}"
    );
    assert!(
        max <= GAP_BOUND,
        "a session went {max:?} without a heartbeat"
    );

    // --- every journal sound, holding every acknowledged heartbeat where its node was told
    let lines = runs
        .iter()
        .map(|(name, lines)| (*name, lines.iter().map(|(_, line)| line.clone()).collect()));
    let mut told = told(lines);
    let store = common::store(&[etcd.endpoint().to_owned()], &ns, "checker", 10).await;
    let mut records = 0;
    for session in acks.keys() {
        let told = told.remove(session).unwrap_or_default();
        records += check_told(&store, *session, &told).await.records;
    }
    println!("{SESSIONS} journals, {records} records, all sound");
}
