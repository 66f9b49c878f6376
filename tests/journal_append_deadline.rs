//! An append that etcd never lets through while the lease stays valid (renewals get through,
//! its own transaction never does) does not wait forever: once the write policy's deadline has
//! passed, the outcome is settled by reading and the append returns; and whatever waits for it
//! (`Journal::close`, a rig's shutdown) returns with it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{AppendHistory, FaultProxy, check_journal};
use leasehold::{JournalWriteError, Store, StoreOptions, Uuid, WritePolicy};

/// A store through a proxy with node lease TTL 3 s, its write deadline `deadline` (`None`: the
/// default, three TTLs), a journal open on a fresh session with one event appended.
async fn writer(
    etcd: &common::Etcd,
    deadline: Option<Duration>,
    history: &mut AppendHistory,
) -> (FaultProxy, Store, leasehold::Lease, Arc<leasehold::Journal>) {
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let mut write = WritePolicy::default();
    write.deadline = deadline;
    let options = StoreOptions::new([proxy.endpoint()])
        .with_namespace(etcd.ns.clone())
        .with_node("a")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500))
        .with_write_policy(write);
    let store = Store::connect(options).await.expect("store connects");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());
    let result = journal.append("before").await;
    history.record(&["before"], &result);
    result.unwrap();
    (proxy, store, lease, journal)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_append_refused_while_its_lease_stays_valid_returns_after_the_write_deadline() {
    let etcd = common::Etcd::start().await;
    // The default deadline: three TTLs, 9 s.
    let mut history = AppendHistory::default();
    let (proxy, store, lease, journal) = writer(&etcd, None, &mut history).await;
    let session = journal.session_id();

    // Every connection that carries the append is closed before etcd sees it: each send's
    // outcome is unknown to the writer. Renewals and reads go through.
    proxy.reject_requests_containing("poison");
    let started = tokio::time::Instant::now();
    let pending = {
        let journal = journal.clone();
        tokio::spawn(async move { journal.append("poison").await })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!pending.is_finished(), "re-sent while the lease is valid");
    assert!(
        lease.is_valid(),
        "renewals get through: the lease stays valid"
    );
    let closing = {
        let journal = journal.clone();
        tokio::spawn(async move { journal.close().await })
    };

    let result = tokio::time::timeout(Duration::from_secs(15), pending)
        .await
        .expect("the append returns once the write deadline (9 s) has passed")
        .unwrap();
    let waited = started.elapsed();
    eprintln!("the append returned after {waited:?}: {result:?}");
    assert!(
        waited >= Duration::from_secs(8),
        "not before the deadline: {waited:?}"
    );
    assert!(
        lease.is_valid(),
        "the lease never stopped being valid: the deadline ended it"
    );
    // The read finds it not committed, but a send may still be on its way: unknown, and the
    // journal no longer knows its tip.
    assert!(
        matches!(result, Err(JournalWriteError::OutcomeUnknown(_))),
        "{result:?}"
    );
    history.record(&["poison"], &result);
    assert!(journal.is_broken());
    tokio::time::timeout(Duration::from_secs(2), closing)
        .await
        .expect("close returns with the append")
        .unwrap();

    proxy.clear_request_filter();
    let report = check_journal(&store, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.events, 1, "the refused append never committed");
    store.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shorter_write_deadline_ends_the_resends_sooner() {
    let etcd = common::Etcd::start().await;
    let mut history = AppendHistory::default();
    let (proxy, store, lease, journal) =
        writer(&etcd, Some(Duration::from_secs(2)), &mut history).await;
    proxy.reject_requests_containing("poison");
    let started = tokio::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(8), journal.append("poison"))
        .await
        .expect("the append returns once its 2 s deadline has passed");
    let waited = started.elapsed();
    eprintln!("the append returned after {waited:?}: {result:?}");
    assert!(waited >= Duration::from_secs(2), "{waited:?}");
    assert!(lease.is_valid());
    assert!(matches!(result, Err(JournalWriteError::OutcomeUnknown(_))));
    proxy.clear_request_filter();
    store.close().await;
}
