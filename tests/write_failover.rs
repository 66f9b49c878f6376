//! A write that a member refuses goes on to the next member: with one of two ways to etcd
//! refusing every connection, appends and acquisitions still commit, once each.

mod common;

use std::time::Duration;

use leasehold::Uuid;
use leasehold::testing::{AppendHistory, FaultProxy, check_journal};

#[tokio::test(flavor = "multi_thread")]
async fn writes_move_past_a_member_that_refuses_them() {
    let etcd = common::Etcd::start().await;
    let proxies = [
        FaultProxy::start(etcd.node.endpoint()).await.unwrap(),
        FaultProxy::start(etcd.node.endpoint()).await.unwrap(),
    ];
    let endpoints: Vec<String> = proxies.iter().map(FaultProxy::endpoint).collect();
    let store = common::store(&endpoints, &etcd.ns, "a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
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
