//! Every duration and count the library takes, at any value, `Duration::MAX` included: the
//! options build, a connect bounded by its retry deadline fails with a typed error, and a
//! store whose every timeout is `Duration::MAX` works and waits forever where it waits:
//! `acquire_lease_wait(session, Duration::MAX)` stands by, it does not time out at once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{
    CancellationToken, ConnectError, ConnectOptions, Connection, HostOptions, JournalLimits,
    ReplayOptions, RetryPolicy, Rig, SessionHost, Store, StoreError, StoreOptions, Uuid,
    WritePolicy,
};
use proptest::prelude::*;

/// An endpoint that refuses connections at once.
const REFUSING: &str = "http://127.0.0.1:1";

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..10_000_000_000).prop_map(Duration::from_nanos),
    ]
}

fn any_count() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0), Just(usize::MAX), any::<usize>(), 0usize..1024]
}

/// Every timeout and pause of every option set, at `value`.
fn store_options(value: Duration, retry_deadline: Duration) -> StoreOptions {
    StoreOptions::new([REFUSING])
        .with_standby_recheck(value)
        .with_request_timeout(value)
        .with_write_policy(
            WritePolicy::default()
                .with_attempt_timeout(value)
                .with_resend_timeout(value)
                .with_backoff(value, value),
        )
        .with_retry(
            RetryPolicy::default()
                .with_deadline(retry_deadline)
                .with_backoff(value, value),
        )
}

proptest! {
    /// Every option that takes a duration or a count builds with any value, and shows itself.
    #[test]
    fn every_option_builds_with_any_value(
        [a, b, c, d, e, f, g, h, i, j] in proptest::array::uniform10(any_duration()),
        [k, l, m, n, o, p, q] in proptest::array::uniform7(any_count()),
        ttl_secs in any::<u64>(),
    ) {
        let write = WritePolicy::default()
            .with_attempt_timeout(a)
            .with_resend_timeout(b)
            .with_backoff(c, d);
        let retry = RetryPolicy::default().with_deadline(e).with_backoff(f, g);
        let limits = JournalLimits::default()
            .with_max_txn_ops(k)
            .with_max_request_bytes(l)
            .with_headroom(m)
            .with_in_flight(n);
        let _ = (limits.max_records(), limits.max_bytes());
        let replay = ReplayOptions::default().with_page_records(o).with_page_bytes(p);
        let store = StoreOptions::new([REFUSING])
            .with_ttl(Duration::from_secs(ttl_secs), h)
            .with_standby_recheck(i)
            .with_request_timeout(j)
            .with_write_policy(write)
            .with_retry(retry.clone())
            .with_journal_limits(limits)
            .with_replay(replay);
        let connect = ConnectOptions::new([REFUSING])
            .with_retry(retry)
            .with_connect_timeout(a)
            .with_request_timeout(j);
        let host = HostOptions::default()
            .with_max_sessions(q)
            .with_stop_grace(c)
            .with_retry_pause(d)
            .with_settle(d);
        let _ = format!("{store:?} {connect:?} {host:?}");
    }
}

/// With every timeout at `Duration::MAX` (or zero) and a short retry deadline, connecting to an
/// endpoint that refuses fails with a typed error, in time; with a retry deadline of
/// `Duration::MAX` it goes on retrying.
#[tokio::test(flavor = "multi_thread")]
async fn extreme_timeouts_connect_or_fail_typed_and_wait_forever_means_forever() {
    for value in [Duration::ZERO, Duration::MAX] {
        let options = ConnectOptions::new([REFUSING])
            .with_connect_timeout(value)
            .with_request_timeout(value)
            .with_retry(
                RetryPolicy::default()
                    .with_deadline(Duration::from_millis(300))
                    .with_backoff(value, value),
            );
        let connected = tokio::time::timeout(Duration::from_secs(20), Connection::connect(options))
            .await
            .expect("bounded by the retry deadline");
        assert!(
            matches!(connected, Err(ConnectError::Unreachable { .. })),
            "{value:?}: {connected:?}"
        );

        let connected = tokio::time::timeout(
            Duration::from_secs(20),
            Store::connect(store_options(value, Duration::from_millis(300))),
        )
        .await
        .expect("bounded by the retry deadline");
        // Zero attempt timeouts are refused before connecting; the rest cannot reach etcd.
        assert!(
            matches!(
                connected,
                Err(StoreError::Connect(ConnectError::Unreachable { .. })
                    | StoreError::InvalidWritePolicy { .. })
            ),
            "{value:?}: {connected:?}"
        );
    }

    // Waiting forever for an endpoint keeps waiting (and keeps retrying without a panic).
    let options = ConnectOptions::new([REFUSING]).with_retry(
        RetryPolicy::default()
            .with_deadline(Duration::MAX)
            .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
    );
    let waited = tokio::time::timeout(Duration::from_secs(2), Connection::connect(options)).await;
    assert!(waited.is_err(), "Duration::MAX gave up: {waited:?}");
}

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// A store whose every timeout is `Duration::MAX` works: it acquires, fences, appends and
/// releases; a standby acquisition with `Duration::MAX` waits until the holder releases; a
/// host with the largest grace, pause and cap starts and shuts down in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_with_every_timeout_at_duration_max_works_and_waits_forever() {
    let etcd = common::Etcd::start().await;
    let options = |node: &str| {
        let mut options = store_options(Duration::MAX, Duration::MAX)
            .with_namespace(etcd.ns.clone())
            .with_node(node);
        options.endpoints = vec![etcd.node.endpoint().to_owned()];
        options
    };
    let a = Store::connect(options("a")).await.expect("connects");
    let b = Store::connect(options("b")).await.expect("connects");

    // --- phase: the whole path, with every timeout at its largest
    let session = Uuid::new_v4();
    let held = a.acquire_lease(session).await.expect("acquires");
    let journal = a.open_journal(session, Some(&held)).await.expect("fences");
    let appended = journal.append("one").await.expect("appends");
    assert_eq!(appended.first_seq, 2);

    // --- phase: wait forever stands by, and wakes on the release
    let standby = tokio::spawn(async move {
        let lease = b.acquire_lease_wait(session, Duration::MAX).await;
        (lease, b)
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !standby.is_finished(),
        "Duration::MAX is forever, not at once: {:?}",
        standby.await.map(|(lease, _)| lease.map(|l| l.epoch()))
    );
    journal.close().await;
    held.release().await.expect("releases");
    let (lease, b) = tokio::time::timeout(Duration::from_secs(10), standby)
        .await
        .expect("wakes on the release")
        .unwrap();
    let lease = lease.expect("acquired after the release");
    assert!(lease.epoch() > held.epoch());
    lease.release().await.expect("releases");

    // --- phase: a host with the largest grace, pause and cap
    let host_options = HostOptions::default()
        .with_stop_grace(Duration::MAX)
        .with_retry_pause(Duration::MAX)
        .with_max_sessions(usize::MAX)
        .with_settle(Duration::ZERO);
    let store = Arc::new(a);
    let host = SessionHost::start(store.clone(), host_options, vec![Uuid::new_v4()], idle);
    wait_for(
        "the host owns its session",
        Duration::from_secs(10),
        || async { (host.held_count() == 1).then_some(()) },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(20), host.shutdown())
        .await
        .expect("shuts down in order");
    store.close().await;
    b.close().await;
}
