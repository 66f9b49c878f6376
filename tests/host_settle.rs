//! No churn on start or join: hosts started together, or a second apart, over 300 sessions
//! acquire each session exactly once (counted from etcd's history), under a CPU burner too; a
//! host that joins and leaves every 2 s for 60 s causes no handover.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Uuid};

const SESSIONS: usize = 300;
const TTL: u64 = 3;

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// What etcd's history says of the owner keys from `from` to `to`: each session's creations
/// (acquisitions), and how many owner keys were deleted (handovers and releases).
async fn owner_history(etcd: &common::Etcd, from: i64, to: i64) -> (HashMap<String, usize>, usize) {
    let (mut created, mut deleted) = (HashMap::new(), 0);
    let prefix = etcd.ns.owners_prefix();
    for change in common::history(&etcd.raw, from, to).await {
        if !change.key.starts_with(prefix.as_bytes()) {
            continue;
        }
        match (change.put, change.version) {
            (true, 1) => {
                let key = String::from_utf8_lossy(&change.key).into_owned();
                *created.entry(key).or_insert(0) += 1;
            }
            (false, _) => deleted += 1,
            (true, _) => {}
        }
    }
    (created, deleted)
}

/// Spins `threads` busy threads until dropped.
struct Burner(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Burner {
    fn start(threads: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spinners = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Self(stop, spinners)
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for spinner in self.1.drain(..) {
            let _ = spinner.join();
        }
    }
}

/// Three hosts over the same sessions, started `apart` from each other; returns once they hold
/// 100 each, with the revision before the first started.
async fn fleet(etcd: &common::Etcd, sessions: &[Uuid], apart: Duration) -> (Vec<SessionHost>, i64) {
    let from = common::revision(&etcd.raw).await + 1;
    let mut hosts = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(apart).await;
        }
        let store = Arc::new(etcd.store(&format!("h{i}"), TTL).await);
        hosts.push(SessionHost::start(
            store,
            HostOptions::default(),
            sessions.to_vec(),
            idle,
        ));
    }
    let started = tokio::time::Instant::now();
    wait_for("100 sessions each", Duration::from_secs(60), || async {
        let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
        (held == [100, 100, 100]).then_some(())
    })
    .await
    .unwrap();
    println!(
        "3 hosts {apart:?} apart own 100 each {:?} after the last started",
        started.elapsed()
    );
    (hosts, from)
}

/// Starts a fleet and checks that every session was acquired once and none was handed over.
async fn started_once(apart: Duration, burner: bool) {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let burner = burner.then(|| Burner::start(4));
    let (hosts, from) = fleet(&etcd, &sessions, apart).await;
    // Settled: nothing moves any more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(burner);
    let to = common::revision(&etcd.raw).await;
    let (created, deleted) = owner_history(&etcd, from, to).await;
    let acquisitions: usize = created.values().sum();
    println!("{acquisitions} acquisitions, {deleted} owner keys deleted");
    assert_eq!(created.len(), SESSIONS, "every session acquired");
    assert_eq!(
        acquisitions, SESSIONS,
        "each session acquired exactly once ({deleted} handed over)"
    );
    assert_eq!(deleted, 0, "no session handed over");
    for host in &hosts {
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_started_together_acquire_each_session_once() {
    started_once(Duration::ZERO, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_started_a_second_apart_acquire_each_session_once() {
    started_once(Duration::from_secs(1), false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_started_together_under_a_cpu_burner_acquire_each_session_once() {
    started_once(Duration::ZERO, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_joining_and_leaving_every_two_seconds_moves_nothing() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let (hosts, _) = fleet(&etcd, &sessions, Duration::ZERO).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let from = common::revision(&etcd.raw).await + 1;
    let flapping = tokio::time::Instant::now();
    let mut flaps = 0;
    while flapping.elapsed() < Duration::from_secs(60) {
        let store = Arc::new(etcd.store(&format!("flap{flaps}"), TTL).await);
        let host = SessionHost::start(
            store.clone(),
            HostOptions::default(),
            sessions.clone(),
            idle,
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(host.held_count(), 0, "a settling host takes nothing");
        host.shutdown().await;
        store.close().await;
        flaps += 1;
    }
    let held: Vec<usize> = hosts.iter().map(SessionHost::held_count).collect();
    let to = common::revision(&etcd.raw).await;
    let (created, deleted) = owner_history(&etcd, from, to).await;
    println!(
        "{flaps} flaps over 60 s: {} acquisitions, {deleted} owner keys deleted, held {held:?}",
        created.len()
    );
    assert_eq!(held, [100, 100, 100]);
    assert!(
        created.is_empty() && deleted == 0,
        "no handover: {} acquisitions, {deleted} deletes",
        created.len()
    );
    for host in &hosts {
        host.shutdown().await;
    }
}
