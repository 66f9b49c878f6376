//! A write that a member refuses goes on to the next member: with one of two ways to etcd
//! refusing every connection, appends and acquisitions still commit, once each.

mod common;

use std::time::Duration;

use leasehold::Uuid;
use leasehold::testing::{AppendHistory, FaultProxy, check_journal};

/// A store that reaches one etcd member two ways, with a journal open on a fresh session.
struct TwoWays {
    journal: leasehold::Journal,
    _lease: leasehold::Lease,
    store: leasehold::Store,
    session: Uuid,
    proxies: [FaultProxy; 2],
    // Last: the container outlives the rest.
    etcd: common::Etcd,
}

impl TwoWays {
    async fn open() -> Self {
        let etcd = common::Etcd::start().await;
        let (proxies, endpoints) = etcd.two_ways().await;
        let store = common::store(&endpoints, &etcd.ns, "a", 10).await;
        let session = Uuid::new_v4();
        let lease = store.acquire_lease(session).await.unwrap();
        let journal = store.open_journal(session, Some(&lease)).await.unwrap();
        Self {
            journal,
            _lease: lease,
            store,
            session,
            proxies,
            etcd,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_move_past_a_member_that_refuses_them() {
    let TwoWays {
        journal,
        _lease,
        store,
        session,
        proxies,
        etcd: _etcd,
    } = TwoWays::open().await;
    let mut history = AppendHistory::default();

    // Each way refuses in turn: whichever a write starts on, it must move to the other.
    for (i, proxy) in proxies.iter().enumerate() {
        proxy.reject();
        for n in 0..10 {
            let payload = format!("way {i} down, event {n}");
            let result =
                tokio::time::timeout(Duration::from_secs(5), journal.append(&payload)).await;
            let result = result.expect("the append moves to the member that answers");
            history.record(&[&payload], &result);
            result.unwrap();
        }
        let other = store
            .acquire_lease(Uuid::new_v4())
            .await
            .expect("so does an acquisition");
        other.release().await.unwrap();
        proxy.heal();
    }
    let report = check_journal(&store, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.events, 20, "each once");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_settling_read_moves_past_a_member_that_refuses_it() {
    let TwoWays {
        journal,
        _lease,
        store,
        session,
        proxies,
        etcd,
    } = TwoWays::open().await;
    let mut history = AppendHistory::default();
    let result = journal.append("before").await;
    history.record(&["before"], &result);
    result.unwrap();

    // The append (record 3) never gets through either way. The first member also refuses
    // anything naming record 3, so the read that settles it must move on to the second.
    proxies[0].reject_requests_containing(etcd.ns.record_key(session, 3));
    proxies[1].reject_requests_containing("poison");
    let pending = tokio::spawn(async move {
        let result = journal.append("poison").await;
        (result, journal)
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!pending.is_finished(), "re-sent while the lease is valid");

    // An operator revokes the session: the lease is lost, and a read settles the append.
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    let (result, _journal) = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("settled")
        .unwrap();
    history.record(&["poison"], &result);
    assert!(
        matches!(result, Err(leasehold::JournalWriteError::Fenced(_))),
        "the read, on the member that answers, proves it can never commit: {result:?}"
    );
    for proxy in &proxies {
        proxy.clear_request_filter();
    }
    let report = check_journal(&store, session, &history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.events, 1);
}
