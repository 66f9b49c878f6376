//! One node hosting 20,000 sessions through [`SessionHost`] (a lease, a workspace root and a
//! fenced journal each), through two faults between it and etcd:
//!
//! 1. **Replies come late.** For 2.5 s after the node starts, the replies to everything it
//!    sends are held (etcd answers at once, the node hears it 2.5 s later), so every attempt
//!    then in flight outlives its 1 s timeout. The store's window (`max_in_flight`, 128 by
//!    default) keeps that many requests in flight on its connection at most, so only those
//!    time out and are sent again; the rest wait their turn, their timeouts not yet started.
//!    Every session is owned soon after the replies flow again, no rig fails to open, and no
//!    connection is closed by the client's HTTP/2 layer for cancelled streams
//!    (tests/connection_transport_resets.rs shows that case). Without the window the node has
//!    all its acquisitions in flight at once: each times out, is sent again and times out
//!    again while the one connection works through the backlog, and the node makes almost no
//!    progress (some 500 of 10,000 owned after 90 s, its node lease lost meanwhile).
//! 2. **The connections are reset.** While every session appends to its journal, the proxy
//!    closes every connection of the node (its unary requests, keepalive and owner watch
//!    alike). Every session stays owned at the same epoch, no append fails, every journal
//!    takes a new record within one TTL of the cut, and another once a TTL has passed since
//!    (the node lease was renewed over the new connections).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::resets::ResetLimits;
use leasehold::testing::{EtcdNode, FaultProxy, random_namespace, wait_for};
use leasehold::{CancellationToken, HostEvent, HostOptions, Rig, SessionHost, Store, StoreOptions};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, sleep};
use uuid::Uuid;

const SESSIONS: usize = 20_000;
/// How long etcd's replies are held, from a moment after the node starts.
const HELD: Duration = Duration::from_millis(2500);
/// From the node's start: every session must be owned by then.
const ALL_OWNED_WITHIN: Duration = Duration::from_secs(180);
const TTL: Duration = Duration::from_secs(10);

/// What the sessions' work did: appends per round, and every failed append.
#[derive(Default)]
struct Tally {
    appended: [AtomicUsize; 4],
    failed: AtomicUsize,
}

/// A session's work: one append to its journal each time the round moves on (a session that
/// misses a round appends the latest), until the host stops it.
async fn append_each_round(
    rig: Arc<Rig>,
    stop: CancellationToken,
    mut rounds: watch::Receiver<usize>,
    tally: Arc<Tally>,
) {
    loop {
        tokio::select! {
            changed = rounds.changed() => if changed.is_err() { return },
            _ = stop.cancelled() => return,
        }
        let round = *rounds.borrow_and_update();
        match rig.journal().append(round.to_be_bytes()).await {
            Ok(_) => tally.appended[round].fetch_add(1, Ordering::SeqCst),
            Err(error) => {
                eprintln!("{}: round {round}: {error}", rig.session_id());
                tally.failed.fetch_add(1, Ordering::SeqCst)
            }
        };
    }
}

/// Counts the host's events that say a session failed: failed opens, sessions given up, and
/// events the counter missed (it fell behind the host's buffer).
fn count_failures(host: &SessionHost) -> (Arc<[AtomicUsize; 3]>, tokio::task::JoinHandle<()>) {
    let mut events = host.events();
    let failures = Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]);
    let counting = tokio::spawn({
        let failures = failures.clone();
        async move {
            loop {
                match events.recv().await {
                    Ok(HostEvent::OpenFailed { session, error }) => {
                        eprintln!("{session}: open failed: {error}");
                        failures[0].fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(HostEvent::GaveUp { session, why, .. }) => {
                        eprintln!("{session}: given up: {why:?}");
                        failures[1].fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        failures[2].fetch_add(missed as usize, Ordering::SeqCst);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    (failures, counting)
}

/// One store, with the default window, hosts [`SESSIONS`] sessions through a proxy that holds
/// etcd's replies for [`HELD`] right after the start, then cuts every connection while the
/// sessions append.
#[tokio::test(flavor = "multi_thread")]
async fn twenty_thousand_hosted_sessions_are_owned_through_late_replies_and_a_connection_reset() {
    let resets = ResetLimits::install();
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let options = StoreOptions::new([proxy.endpoint()])
        .with_namespace(random_namespace())
        .with_node("a")
        .with_ttl(TTL, Duration::from_secs(1));
    let store = Arc::new(Store::connect(options).await.expect("store connects"));
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let txns_before = common::txns(etcd.endpoint()).await;
    let (round, rounds) = watch::channel(0);
    let tally = Arc::new(Tally::default());

    let host = SessionHost::start(
        store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        sessions,
        {
            let tally = tally.clone();
            move |rig, stop| append_each_round(rig, stop, rounds.clone(), tally.clone())
        },
    );
    let (failures, counting) = count_failures(&host);
    let started = Instant::now();

    // --- fault 1: once the node's first acquisitions are on their way, replies come late
    sleep(Duration::from_millis(300)).await;
    proxy.hold_replies();
    sleep(HELD).await;
    proxy.heal();
    let owned = wait_for("every session owned", ALL_OWNED_WITHIN, || async {
        (host.held_count() == SESSIONS).then_some(())
    })
    .await;
    let owned_after = started.elapsed();
    let txns_per_session = (common::txns(etcd.endpoint()).await - txns_before) / SESSIONS as f64;
    let failed = |i: usize| failures[i].load(Ordering::SeqCst);
    println!(
        "{} of {SESSIONS} owned after {owned_after:?}; {txns_per_session:.2} txns per session; \
         {} failed opens; {} connection(s) closed at h2's reset limit",
        host.held_count(),
        failed(0),
        resets.count(),
    );
    owned.unwrap_or_else(|error| panic!("{error}: {} of {SESSIONS} owned", host.held_count()));
    assert_eq!(
        resets.count(),
        0,
        "no connection is closed for cancelled streams within the window"
    );
    assert_eq!(failed(0), 0, "no rig open failed");
    let mut epochs = host.held();
    epochs.sort();

    // --- fault 2: every connection cut while each session's append is on its way
    round.send_replace(1);
    sleep(Duration::from_millis(50)).await;
    let connections = proxy.open_connections();
    proxy.cut();
    let cut = Instant::now();
    round.send_replace(2);
    let advanced = wait_for("every journal advanced after the cut", TTL, || async {
        (tally.appended[2].load(Ordering::SeqCst) == SESSIONS).then_some(())
    })
    .await;
    let advanced_after = cut.elapsed();
    let appended = |r: usize| tally.appended[r].load(Ordering::SeqCst);
    println!(
        "{connections} connection(s) cut; every journal advanced {advanced_after:?} after: \
         {} and {} appends in rounds 1 and 2, {} failed; {} sessions given up",
        appended(1),
        appended(2),
        tally.failed.load(Ordering::SeqCst),
        failed(1),
    );
    advanced.unwrap_or_else(|error| panic!("{error}: {} of {SESSIONS}", appended(2)));
    assert!(
        connections > 0,
        "the node's connections went through the proxy"
    );
    assert_eq!(tally.failed.load(Ordering::SeqCst), 0, "no append failed");
    assert_eq!(failed(1), 0, "no session was given up");
    assert_eq!(failed(2), 0, "the counter saw every host event");

    // --- a TTL after the cut: the node lease was renewed over new connections
    sleep((cut + TTL + Duration::from_secs(1)).saturating_duration_since(Instant::now())).await;
    round.send_replace(3);
    let renewed = wait_for(
        "every journal advanced a TTL after the cut",
        TTL,
        || async { (tally.appended[3].load(Ordering::SeqCst) == SESSIONS).then_some(()) },
    )
    .await;
    println!(
        "{} of {SESSIONS} journals advanced again {:?} after the cut",
        appended(3),
        cut.elapsed()
    );
    renewed.unwrap_or_else(|error| panic!("{error}: {} of {SESSIONS}", appended(3)));
    assert_eq!(tally.failed.load(Ordering::SeqCst), 0, "no append failed");
    assert_eq!(failed(1), 0, "no session was given up");
    let mut after = host.held();
    after.sort();
    assert!(
        after == epochs,
        "every session is still owned, at the same epoch"
    );
    assert_eq!(
        resets.count(),
        0,
        "no connection closed at h2's reset limit"
    );

    counting.abort();
    host.shutdown().await;
    drop(host);
    Arc::into_inner(store)
        .expect("the host let its store go")
        .close()
        .await;
}
