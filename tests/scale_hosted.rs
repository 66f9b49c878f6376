//! One node hosting 10,000 sessions through [`SessionHost`] (a lease, a workspace root and a
//! fenced journal each), while etcd's replies come late: for 2.5 s after the node starts, the
//! replies to everything it sends are held (etcd answers at once, the node hears it 2.5 s
//! later), so every attempt then in flight outlives its 1 s timeout.
//!
//! The store's window (`max_in_flight`, 128 by default) keeps that many requests in flight on
//! its connection at most, so only those time out and are sent again; the rest wait their
//! turn, their timeouts not yet started. Every session is owned soon after the replies flow
//! again, no rig fails to open, and no connection is closed by the client's HTTP/2 layer for
//! cancelled streams (tests/connection_transport_resets.rs shows that case).
//!
//! Without the window the node has all 10,000 acquisitions in flight at once: each times out,
//! is sent again and times out again while the one connection works through the backlog, and
//! the node makes almost no progress (some 500 of 10,000 owned after 90 s, its node lease
//! lost meanwhile).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::resets::ResetLimits;
use leasehold::testing::{EtcdNode, FaultProxy, etcd_metric, random_namespace, wait_for};
use leasehold::{CancellationToken, HostEvent, HostOptions, Rig, SessionHost, Store, StoreOptions};
use tokio::time::{Instant, sleep};
use uuid::Uuid;

const SESSIONS: usize = 10_000;
/// How long etcd's replies are held, from a moment after the node starts.
const HELD: Duration = Duration::from_millis(2500);
/// From the node's start: every session must be owned by then.
const ALL_OWNED_WITHIN: Duration = Duration::from_secs(90);

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// `Txn` requests etcd has received.
async fn txns(endpoint: &str) -> f64 {
    let labels = ["grpc_method=\"Txn\"", "grpc_type=\"unary\""];
    etcd_metric(endpoint, "grpc_server_started_total", &labels)
        .await
        .expect("etcd serves /metrics")
        .expect("etcd counts its Txn requests")
}

/// One store, with the default window, hosts [`SESSIONS`] sessions through a proxy that holds
/// etcd's replies for [`HELD`] right after the start.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_hosted_sessions_are_all_owned_though_replies_come_after_their_timeouts() {
    let resets = ResetLimits::install();
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let proxy = FaultProxy::start(etcd.endpoint()).await.unwrap();
    let options = StoreOptions::new([proxy.endpoint()])
        .with_namespace(random_namespace())
        .with_node("a")
        .with_ttl(Duration::from_secs(10), Duration::from_secs(1));
    let store = Arc::new(Store::connect(options).await.expect("store connects"));
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let txns_before = txns(etcd.endpoint()).await;

    let host = SessionHost::start(
        store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        sessions,
        idle,
    );
    let mut events = host.events();
    let open_failures = Arc::new(AtomicUsize::new(0));
    let counting = tokio::spawn({
        let open_failures = open_failures.clone();
        async move {
            loop {
                match events.recv().await {
                    Ok(HostEvent::OpenFailed { .. }) => {
                        open_failures.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                }
            }
        }
    });
    let started = Instant::now();
    // --- the fault: once the node's first acquisitions are on their way
    sleep(Duration::from_millis(300)).await;
    proxy.hold_replies();
    sleep(HELD).await;
    proxy.heal();
    let owned = wait_for("every session owned", ALL_OWNED_WITHIN, || async {
        (host.held_count() == SESSIONS).then_some(())
    })
    .await;
    let owned_after = started.elapsed();
    let txns_per_session = (txns(etcd.endpoint()).await - txns_before) / SESSIONS as f64;
    let (open_failures, closed) = (open_failures.load(Ordering::SeqCst), resets.count());
    println!(
        "{} of {SESSIONS} owned after {owned_after:?}; {txns_per_session:.2} txns per session; \
         {open_failures} failed opens; {closed} connection(s) closed at h2's reset limit",
        host.held_count(),
    );
    owned.unwrap_or_else(|error| panic!("{error}: {} of {SESSIONS} owned", host.held_count()));
    assert_eq!(
        closed, 0,
        "no connection is closed for cancelled streams within the window"
    );
    assert_eq!(open_failures, 0, "no rig open failed");

    host.shutdown().await;
    counting.abort();
    drop(host);
    Arc::into_inner(store)
        .expect("the host let its store go")
        .close()
        .await;
}
