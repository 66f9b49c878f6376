//! Session hosts balance: 3 hosts over 30 sessions converge to 10/10/10 within 3 × TTL; a
//! fourth host joining takes its share (7 or 8 each); a host leaving hands its sessions over.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{AppendHistory, check_journal, wait_for};
use leasehold::{CancellationToken, HostOptions, Rig, SessionHost, Store, Uuid};
use tokio::time::Instant;

const SESSIONS: usize = 30;
const TTL: u64 = 3;
const BOUND: Duration = Duration::from_secs(3 * TTL);

/// Appends one event when it starts, then waits to be stopped.
async fn work(rig: Arc<Rig>, stop: CancellationToken) {
    let _ = rig
        .journal()
        .append(format!("owned by epoch {}", rig.epoch()))
        .await;
    stop.cancelled().await;
}

async fn host(etcd: &common::Etcd, name: &str, sessions: &[Uuid]) -> (SessionHost, Arc<Store>) {
    let store = Arc::new(etcd.store(name, TTL).await);
    let host = SessionHost::start(
        store.clone(),
        HostOptions::default(),
        sessions.iter().copied(),
        work,
    );
    (host, store)
}

/// Waits until the hosts hold every session between them, each within one of the mean (and
/// the owner keys in etcd agree); returns how long it took.
async fn balanced(etcd: &common::Etcd, hosts: &[&SessionHost], what: &str) -> Duration {
    let (low, high) = (SESSIONS / hosts.len(), SESSIONS.div_ceil(hosts.len()));
    let start = Instant::now();
    wait_for(what, BOUND, || async {
        let counts: Vec<usize> = hosts.iter().map(|h| h.held_count()).collect();
        let owned = common::count(&etcd.raw, &etcd.ns.owners_prefix()).await as usize;
        (counts.iter().sum::<usize>() == SESSIONS
            && owned == SESSIONS
            && counts.iter().all(|c| (low..=high).contains(c)))
        .then_some(())
    })
    .await
    .unwrap_or_else(|error| {
        let counts: Vec<usize> = hosts.iter().map(|h| h.held_count()).collect();
        panic!("{error}: hosts hold {counts:?}")
    });
    let took = start.elapsed();
    let counts: Vec<usize> = hosts.iter().map(|h| h.held_count()).collect();
    println!("{what}: {counts:?} after {took:?}");
    took
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_share_the_sessions_and_rebalance_as_hosts_come_and_go() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();

    // --- phase: three hosts start
    let (a, _sa) = host(&etcd, "a", &sessions).await;
    let (b, _sb) = host(&etcd, "b", &sessions).await;
    let (c, _sc) = host(&etcd, "c", &sessions).await;
    balanced(&etcd, &[&a, &b, &c], "three hosts").await;

    // --- phase: a fourth joins and takes its share (30 / 4: 7 or 8 each)
    let (d, _sd) = host(&etcd, "d", &sessions).await;
    balanced(&etcd, &[&a, &b, &c, &d], "a fourth host joined").await;

    // --- phase: one leaves; the others take its sessions
    a.shutdown().await;
    assert_eq!(a.held_count(), 0);
    balanced(&etcd, &[&b, &c, &d], "a host left").await;

    // --- every journal is sound, and each moved session has its new owner's fence
    let checker = etcd.store("checker", 10).await;
    for session in &sessions {
        let report = check_journal(&checker, *session, &AppendHistory::default())
            .await
            .unwrap_or_else(|violation| panic!("{violation}"));
        assert!(!report.fence_epochs.is_empty());
    }
    for host in [&b, &c, &d] {
        host.shutdown().await;
    }
    assert_eq!(common::count(&etcd.raw, &etcd.ns.owners_prefix()).await, 0);
}
