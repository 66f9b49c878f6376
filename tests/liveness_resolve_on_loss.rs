//! An append whose sends all went unanswered is settled by a read once its lease is lost,
//! instead of being left unknown: here it never reached etcd and the owner key is gone, so it
//! can never commit, and the journal reports it fenced.

mod common;

use std::time::Duration;

use leasehold::testing::{AppendHistory, check_journal};
use leasehold::{JournalWriteError, LossReason};

#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_append_is_settled_by_reading_once_the_lease_is_lost() {
    let common::ProxiedJournal {
        journal,
        lease,
        store,
        session,
        proxy,
        etcd,
    } = common::ProxiedJournal::start(10).await;
    let mut history = AppendHistory::default();
    let result = journal.append("before").await;
    history.record(&["before"], &result);
    result.unwrap();

    // --- phase: every send of this append is refused before it reaches etcd
    proxy.reject_requests_containing("poison-payload");
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.append("poison-payload").await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!pending.is_finished(), "re-sent while the lease is valid");

    // --- phase: an operator revokes the session; the owner learns it through its watch
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), lease.lost())
            .await
            .unwrap(),
        LossReason::Revoked
    );
    let result = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("settled once the lease is lost")
        .unwrap();
    history.record(&["poison-payload"], &result);
    assert!(
        matches!(result, Err(JournalWriteError::Fenced(_))),
        "the read proves it can never commit: {result:?}"
    );
    proxy.clear_request_filter();
    let report = check_journal(&store, session, &history).await.unwrap();
    assert_eq!(report.events, 1);
}
