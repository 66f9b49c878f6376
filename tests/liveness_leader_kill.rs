//! The leader of a 3-member cluster is killed under continuous appends on 20 sessions: every
//! journal advances again within 3 s (etcd's election takes about 1 s; a proposal that a
//! follower forwarded to the dying leader would otherwise wait out etcd's 7 s request timeout),
//! and every journal passes the checker.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{EtcdCluster, check_journal, random_namespace};
use leasehold::{CancellationToken, Uuid};
use tokio::time::Instant;

const SESSIONS: usize = 20;
const BOUND: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread")]
async fn every_journal_advances_within_three_seconds_of_a_leader_kill() {
    let cluster = EtcdCluster::start().await.expect("cluster starts");
    let ns = random_namespace();
    // A follower first: the store's requests go through it, and it forwards them to the leader
    // that is about to die.
    let leader = cluster.leader().await.unwrap();
    let mut endpoints = cluster.endpoints();
    endpoints.rotate_left((leader + 1) % cluster.len());
    let store = common::store(&endpoints, &ns, "a", 10).await;

    let mut journals = Vec::new();
    for _ in 0..SESSIONS {
        let session = Uuid::new_v4();
        let lease = store.acquire_lease(session).await.unwrap();
        let journal = store.open_journal(session, Some(&lease)).await.unwrap();
        journals.push((lease, Arc::new(journal)));
    }

    // --- phase: every journal appends continuously
    let stop = CancellationToken::new();
    let writers: Vec<_> = journals
        .iter()
        .map(|(_, journal)| {
            common::append_continuously(journal.clone(), stop.clone(), Duration::from_millis(50))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // --- phase: the leader dies
    let killed = Instant::now();
    cluster.kill(leader).await.unwrap();
    tokio::time::sleep(BOUND * 2).await;
    let ended = Instant::now();
    stop.cancel();

    let mut worst = Duration::ZERO;
    for ((lease, journal), writer) in journals.iter().zip(writers) {
        let common::Appends {
            history,
            acks,
            error,
        } = writer.await.unwrap();
        assert!(error.is_none(), "an append failed: {error:?}");
        worst = worst.max(longest_stall(&acks, killed, ended));
        assert!(lease.is_valid(), "no false loss");
        let report = check_journal(&store, journal.session_id(), &history)
            .await
            .unwrap_or_else(|violation| panic!("{violation}"));
        assert_eq!(report.events as usize, history.acknowledged());
    }
    println!("every journal advanced within {worst:?} of the leader kill");
    assert!(
        worst <= BOUND,
        "a journal stalled {worst:?} after the leader kill"
    );
}

/// The longest time without an acknowledged append between `from` and `to`.
fn longest_stall(acks: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut last = from;
    let mut longest = Duration::ZERO;
    for &at in acks.iter().filter(|at| **at > from).chain([&to]) {
        longest = longest.max(at - last);
        last = at;
    }
    longest
}
