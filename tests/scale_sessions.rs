//! One store holding 10,000 sessions, measured by etcd's own counters: the store costs etcd
//! one lease grant, one keepalive stream and one watch stream, and a handful of keepalive
//! messages per TTL however many sessions it holds; its acquisitions are in flight at once,
//! as many transactions as it has slots, and those that wait share the next transactions (etcd
//! commits several before the store has heard back from any, and a burst of acquisitions costs
//! it fewer transactions than sessions); and a restart of its owner watch reads the owner keys
//! page by page, not once per held session.

mod common;

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::WatchOptions;
use futures_util::StreamExt as _;
use futures_util::future::join_all;
use leasehold::testing::{EtcdNode, FaultProxy, etcd_metric, random_namespace, wait_for};
use leasehold::{Lease, Store};
use tokio::time::{Instant, sleep, timeout};
use uuid::Uuid;

const SESSIONS: usize = 10_000;
/// Acquisitions the caller keeps outstanding (`buffer_unordered`).
const PIPELINE: usize = 256;
/// A blip of the proxy (phase 3) is far shorter than this: no lease may be lost to it.
const TTL: u64 = 10;
/// The page size of the owner watch's snapshot read (`PAGE` in
/// `Connection::range_at_one_revision`, src/etcd/connection.rs).
const SNAPSHOT_PAGE: usize = 1000;
/// Acquisitions made while etcd's replies are dropped (phase 4). Small enough that their
/// requests fit in the HTTP/2 flow-control window etcd granted (64 KiB at least) without
/// etcd's window updates, which are dropped too, and in the store's window of requests in
/// flight (`ConnectOptions::DEFAULT_MAX_IN_FLIGHT`, 128) with room for its other requests.
const PROBE: usize = 100;
/// The transactions of lifecycle writes a store has in flight at once: its journal limits'
/// `in_flight` (8 by default).
const SLOTS: usize = 8;

/// What etcd has served, from its own Prometheus counters (`/metrics` on the client port).
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    /// `LeaseGrant` requests received.
    grants: f64,
    /// `LeaseKeepAlive` streams opened.
    keepalive_streams: f64,
    /// Messages received on `LeaseKeepAlive` streams: one per renewal.
    keepalive_messages: f64,
    /// `Watch` streams opened.
    watch_streams: f64,
    /// `Range` requests received.
    ranges: f64,
    /// `Txn` requests received.
    txns: f64,
}

impl Counters {
    async fn read(endpoint: &str) -> Self {
        // Each series is labelled with its gRPC service, method and type; etcd also serves a
        // `Watch` of `grpc.health.v1.Health`, which is not the KV watch.
        let metric = |name: &'static str, service: &'static str, method: &'static str| async move {
            let kind = match method {
                "LeaseKeepAlive" | "Watch" => "bidi_stream",
                _ => "unary",
            };
            let labels = [
                format!("grpc_service=\"etcdserverpb.{service}\""),
                format!("grpc_method=\"{method}\""),
                format!("grpc_type=\"{kind}\""),
            ];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            etcd_metric(endpoint, name, &labels)
                .await
                .expect("etcd serves /metrics")
                .unwrap_or_else(|| panic!("etcd exports no {name} for {labels:?}"))
        };
        // `started`: every request (or stream) etcd received, whether or not it has finished.
        let started = "grpc_server_started_total";
        Self {
            grants: metric(started, "Lease", "LeaseGrant").await,
            keepalive_streams: metric(started, "Lease", "LeaseKeepAlive").await,
            keepalive_messages: metric("grpc_server_msg_received_total", "Lease", "LeaseKeepAlive")
                .await,
            watch_streams: metric(started, "Watch", "Watch").await,
            ranges: metric(started, "KV", "Range").await,
            txns: metric(started, "KV", "Txn").await,
        }
    }

    /// What etcd served since `earlier`.
    fn since(self, earlier: Self) -> Self {
        Self {
            grants: self.grants - earlier.grants,
            keepalive_streams: self.keepalive_streams - earlier.keepalive_streams,
            keepalive_messages: self.keepalive_messages - earlier.keepalive_messages,
            watch_streams: self.watch_streams - earlier.watch_streams,
            ranges: self.ranges - earlier.ranges,
            txns: self.txns - earlier.txns,
        }
    }
}

/// Counts the caller's acquisitions under way, and the most at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl InFlight {
    async fn track<T>(&self, future: impl Future<Output = T>) -> T {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        let output = future.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        output
    }
}

fn all_valid(store: &Store, leases: &[Lease]) -> bool {
    store.held_sessions() == leases.len() && leases.iter().all(Lease::is_valid)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_sessions_cost_etcd_one_lease_one_keepalive_and_one_watch() {
    let etcd = EtcdNode::start().await.expect("etcd starts");
    let endpoint = etcd.endpoint().to_owned();
    let proxy = FaultProxy::start(&endpoint).await.unwrap();
    let ns = random_namespace();
    let raw = common::raw(&endpoint).await;

    // --- phase 1: 10,000 acquisitions, pipelined
    let before = Counters::read(&endpoint).await;
    let store = common::store(&[proxy.endpoint()], &ns, "a", TTL).await;
    let in_flight = InFlight::default();
    let started = Instant::now();
    let mut leases: Vec<Lease> = futures_util::stream::iter(0..SESSIONS)
        .map(|_| in_flight.track(store.acquire_lease(Uuid::new_v4())))
        .buffer_unordered(PIPELINE)
        .map(|acquired| acquired.expect("every session acquired"))
        .collect()
        .await;
    let acquiring = started.elapsed();
    let most_at_once = in_flight.max.load(Ordering::SeqCst);
    println!(
        "acquired {SESSIONS} sessions in {acquiring:?}, at most {most_at_once} acquisitions \
         under way at once (caller side)"
    );
    assert_eq!(store.held_sessions(), SESSIONS);
    assert!(leases.iter().all(Lease::is_valid), "every lease is valid");
    // The caller kept the pipeline full; whether the store sent the acquisitions at once is
    // what phase 4 shows from etcd's side.
    assert!(
        most_at_once >= PIPELINE / 4,
        "the caller had only {most_at_once} acquisitions under way at once"
    );

    // --- phase 2: three TTLs of holding them all
    let window = Duration::from_secs(3 * TTL);
    let acquired = Counters::read(&endpoint).await;
    sleep(window).await;
    let held = Counters::read(&endpoint).await;
    let renewals = held.since(acquired).keepalive_messages;
    let total = held.since(before);
    // Renewals go out every TTL/3: three per TTL. One lease per session would be 10,000 times
    // as many.
    let per_ttl = renewals / 3.0;
    println!(
        "over the test so far: {} lease grant(s), {} keepalive stream(s), {} watch stream(s); \
         {renewals} keepalive messages in {window:?} ({per_ttl:.1} per TTL; one lease per \
         session renewed every TTL/3 would be {})",
        total.grants,
        total.keepalive_streams,
        total.watch_streams,
        SESSIONS * 3 * 3
    );
    assert!(
        all_valid(&store, &leases),
        "after {window:?}, {} of {SESSIONS} leases are valid and the store holds {}",
        leases.iter().filter(|lease| lease.is_valid()).count(),
        store.held_sessions()
    );
    assert_eq!(total.grants, 1.0, "one lease granted for 10,000 sessions");
    assert_eq!(total.keepalive_streams, 1.0, "one keepalive stream");
    assert_eq!(total.watch_streams, 1.0, "one owner watch");
    assert!(
        (1.0..=4.0).contains(&per_ttl),
        "{renewals} keepalive messages in {window:?}: expected about 3 per TTL"
    );

    // --- phase 3: a blip restarts the owner watch; the restart reads the owner keys by pages
    let before_blip = Counters::read(&endpoint).await;
    proxy.reject();
    sleep(Duration::from_secs(1)).await;
    proxy.heal();
    // The bound. A restart reads the owner keys at one revision, SNAPSHOT_PAGE keys per Range:
    // ⌈10,000 / 1000⌉ = 10 ranges (etcd reads one key past the limit to say whether more
    // follow, so no empty last page; one more page is allowed anyway: 11). The blip may cut one
    // run of the watch short and the next run reads again: at most two snapshots, 22 reads.
    // A re-read per held session would be 10,000 reads or more.
    let snapshot = SESSIONS / SNAPSHOT_PAGE + 1;
    let bound = (2 * snapshot) as f64;
    let last = Cell::new(Counters::default());
    let waited = wait_for(
        "the owner watch and the keepalive stream back after the blip, every lease valid",
        Duration::from_secs(20),
        || async {
            let since = Counters::read(&endpoint).await.since(before_blip);
            last.set(since);
            let recovered = since.watch_streams >= 1.0
                && since.keepalive_streams >= 1.0
                && all_valid(&store, &leases);
            // Reading on past the bound cannot undo it: stop there.
            (recovered || since.ranges + since.txns > bound).then_some(since)
        },
    )
    .await;
    let recovered = last.get();
    let reads = recovered.ranges + recovered.txns;
    println!(
        "watch restart after the blip: {} range(s) and {} txn(s) for {SESSIONS} owner keys \
         ({} watch stream(s), {} keepalive stream(s) opened); one snapshot is at most \
         {snapshot} pages",
        recovered.ranges, recovered.txns, recovered.watch_streams, recovered.keepalive_streams
    );
    assert!(
        reads <= bound,
        "a watch restart read {reads} times for {SESSIONS} held sessions: more than two \
         snapshots of {snapshot} pages"
    );
    if let Err(error) = waited {
        panic!("{error}; etcd saw since the blip: {recovered:?}");
    }
    assert!(
        reads >= (SESSIONS / SNAPSHOT_PAGE) as f64,
        "the restarted watch read {reads} times: fewer than the {} pages of owner keys, so it \
         did not re-read them and may have missed a change made while it was down",
        SESSIONS / SNAPSHOT_PAGE
    );
    assert_eq!(store.held_sessions(), SESSIONS);

    // --- phase 4: acquisitions are in flight at once, seen from etcd
    // etcd's replies are dropped: no acquisition can complete, so a store that sends one
    // acquisition at a time (a lock around each, say) gets one transaction to etcd and waits
    // for its reply, forever. This one fills its slots at once: every owner key etcd creates
    // meanwhile is an acquisition the store sent before it heard back from any. The others
    // wait for a slot, and share the transactions that follow once replies flow. The keys are
    // counted from etcd's history, not by listing them: with no replies the store cannot renew
    // its node lease, and once its validity runs out it revokes the lease, which deletes its
    // keys.
    let from = common::revision(&raw).await + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut history = raw
        .clone()
        .watch(ns.owners_prefix(), Some(options))
        .await
        .unwrap();
    let txns_before = Counters::read(&endpoint).await.txns;
    proxy.drop_replies();
    let completed = AtomicUsize::new(0);
    let probe = join_all((0..PROBE).map(|_| async {
        let acquired = store.acquire_lease(Uuid::new_v4()).await;
        completed.fetch_add(1, Ordering::SeqCst);
        acquired
    }));
    let observe = async {
        let mut created = 0;
        let slots_filled = timeout(Duration::from_secs(10), async {
            while created < SLOTS {
                let response = history.message().await.unwrap().expect("etcd's history");
                created += response
                    .events()
                    .iter()
                    .filter_map(|event| event.kv())
                    .filter(|kv| kv.create_revision() == kv.mod_revision())
                    .count();
            }
        })
        .await;
        assert!(
            slots_filled.is_ok(),
            "etcd created the owner keys of only {created} of {PROBE} acquisitions made while \
             its replies were dropped: the store does not send acquisitions at once"
        );
        let returned = completed.load(Ordering::SeqCst);
        proxy.heal();
        (created, returned)
    };
    let (acquisitions, (committed, returned)) = timeout(Duration::from_secs(30), async {
        tokio::join!(probe, observe)
    })
    .await
    .expect("the probe acquisitions settle once etcd's replies flow again");
    // Re-sends of the transactions whose replies were dropped count too.
    let txns = Counters::read(&endpoint).await.txns - txns_before;
    println!(
        "with etcd's replies dropped: etcd created the owner keys of {committed} of {PROBE} \
         acquisitions while {returned} had returned; all {PROBE} took {txns} txn(s)"
    );
    assert_eq!(returned, 0, "no acquisition completed without etcd's reply");
    assert!(
        txns < PROBE as f64,
        "{PROBE} acquisitions in {txns} transactions: those that waited shared them"
    );
    for acquired in acquisitions {
        leases.push(acquired.expect("a probe acquisition settles once replies flow again"));
    }
    assert_eq!(store.held_sessions(), SESSIONS + PROBE);
    assert!(leases.iter().all(Lease::is_valid), "every lease is valid");

    store.close().await;
    drop(leases);
}
