//! The metrics move by exactly what happened: after a scripted run (acquisitions, a held
//! acquisition, appends and a batch, a fenced append, an outcome-unknown append, two appends
//! whose unknown outcome the resolving read settles, a revoke, expiries), each counter of each
//! node shows exactly its count.
//!
//! One test in this binary: it installs the process-wide recorder.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::prometheus::parse;
use leasehold::admin::Admin;
use leasehold::testing::FaultProxy;
use leasehold::{ConnectOptions, Connection, JournalWriteError, LossReason, Uuid};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::test(flavor = "multi_thread")]
async fn every_counter_moves_by_exactly_what_happened() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    leasehold::metrics::describe();
    let etcd = common::Etcd::start().await;
    let ns = etcd.ns.as_str().to_owned();
    let a = etcd.store("a", 10).await;
    let b = etcd.store("b", 10).await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let p = common::store(&[proxy.endpoint()], &etcd.ns, "p", 3).await;
    let proxy_q = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let q = common::store(&[proxy_q.endpoint()], &etcd.ns, "q", 3).await;

    // --- a: one acquisition, four append calls (five records), then a fenced append
    let s1 = Uuid::new_v4();
    let l1 = a.acquire_lease(s1).await.unwrap();
    let j1 = a.open_journal(s1, Some(&l1)).await.unwrap();
    for i in 0..3 {
        j1.append(format!("a {i}")).await.unwrap();
    }
    j1.append_batch(&["a 3", "a 4"]).await.unwrap();
    // Someone else moves the tip: a's next append loses its compare.
    etcd.raw
        .clone()
        .put(etcd.ns.tip_key(s1), b"\x01forged".to_vec(), None)
        .await
        .unwrap();
    let fenced = j1.append("a fenced").await;
    assert!(
        matches!(fenced, Err(JournalWriteError::Fenced(_))),
        "{fenced:?}"
    );

    // --- b: held
    assert!(b.acquire_lease(s1).await.is_err());

    // --- p: one append, then one whose replies are all lost until its lease expires
    let s2 = Uuid::new_v4();
    let l2 = p.acquire_lease(s2).await.unwrap();
    let j2 = p.open_journal(s2, Some(&l2)).await.unwrap();
    j2.append("p 0").await.unwrap();
    proxy.drop_replies();
    let unknown = j2.append("p unknown").await;
    assert!(
        matches!(unknown, Err(JournalWriteError::OutcomeUnknown(_))),
        "{unknown:?}"
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), l2.lost()).await,
        Ok(LossReason::Expired)
    );

    // --- q: one append, then two whose replies are lost until its lease is no longer valid;
    // then the resolving read gets through and settles each: one committed, one fenced
    let (s3, s4) = (Uuid::new_v4(), Uuid::new_v4());
    let l3 = q.acquire_lease(s3).await.unwrap();
    let l4 = q.acquire_lease(s4).await.unwrap();
    let j3 = q.open_journal(s3, Some(&l3)).await.unwrap();
    let j4 = q.open_journal(s4, Some(&l4)).await.unwrap();
    j3.append("q 0").await.unwrap();
    proxy_q.drop_replies();
    // s4's owner key goes (q does not hear of it): its append can never commit.
    etcd.raw.clone().delete(l4.owner_key(), None).await.unwrap();
    let (committed, fenced) = tokio::join!(
        async {
            let pending = j3.append("q committed");
            let heal = async {
                // Healed once the lease is no longer valid: no more re-sends, only the read.
                tokio::time::timeout(Duration::from_secs(10), async {
                    while l3.is_valid() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .expect("q's lease stops being valid");
                proxy_q.heal();
            };
            tokio::join!(pending, heal).0
        },
        j4.append("q fenced"),
    );
    committed.expect("the resolving read finds it committed");
    assert!(
        matches!(fenced, Err(JournalWriteError::Fenced(_))),
        "{fenced:?}"
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), l3.lost()).await,
        Ok(LossReason::Expired)
    );

    // --- an operator revokes a's session
    let connection = Connection::connect(ConnectOptions::new([etcd.node.endpoint()]))
        .await
        .unwrap();
    Admin::new(connection, etcd.ns.clone())
        .revoke(s1, None)
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), l1.lost()).await,
        Ok(LossReason::Revoked)
    );

    // --- m: 32 sessions append at once; a store sends at most 8 transactions at a time, so
    // appends that wait share one
    let m = etcd.store("m", 10).await;
    let mut journals = Vec::new();
    for _ in 0..32 {
        let session = Uuid::new_v4();
        let lease = m.acquire_lease(session).await.unwrap();
        let journal = m.open_journal(session, Some(&lease)).await.unwrap();
        journals.push((lease, journal));
    }
    let appends = journals
        .iter()
        .map(|(_, journal)| async move { journal.append("m").await });
    for appended in futures_util::future::join_all(appends).await {
        appended.unwrap();
    }

    // --- the scrape
    let samples = parse(&handle.render());
    let labels = |node: &str, extra: &[(&str, &str)]| -> BTreeMap<String, String> {
        let mut labels: BTreeMap<String, String> = [("node", node), ("namespace", ns.as_str())]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.retain(|_, v| !v.is_empty());
        labels
    };
    let value = |name: &str, node: &str, extra: &[(&str, &str)]| -> f64 {
        let labels = labels(node, extra);
        samples
            .get(&(name.to_owned(), labels.clone()))
            .copied()
            .unwrap_or_else(|| panic!("no {name} {labels:?} in the scrape"))
    };
    let has = |name: &str, node: &str, extra: &[(&str, &str)]| -> bool {
        samples.contains_key(&(name.to_owned(), labels(node, extra)))
    };
    let acquisitions = "leasehold_acquisitions_total";
    assert_eq!(value(acquisitions, "a", &[("outcome", "acquired")]), 1.0);
    assert_eq!(value(acquisitions, "b", &[("outcome", "held")]), 1.0);
    assert_eq!(value(acquisitions, "p", &[("outcome", "acquired")]), 1.0);
    let appends = "leasehold_appends_total";
    let records = "leasehold_append_records_total";
    assert_eq!(value(appends, "a", &[("outcome", "ok")]), 4.0);
    assert_eq!(value(records, "a", &[("outcome", "ok")]), 5.0);
    assert_eq!(value(appends, "a", &[("outcome", "fenced")]), 1.0);
    assert_eq!(value(records, "a", &[("outcome", "fenced")]), 1.0);
    assert_eq!(value(appends, "p", &[("outcome", "ok")]), 1.0);
    assert_eq!(value(appends, "p", &[("outcome", "unknown")]), 1.0);
    assert_eq!(value(appends, "q", &[("outcome", "ok")]), 1.0);
    assert_eq!(value(appends, "q", &[("outcome", "unknown_resolved")]), 2.0);
    assert_eq!(value(records, "q", &[("outcome", "unknown_resolved")]), 2.0);
    // Counted once each: not also as ok, fenced or unknown.
    for outcome in ["fenced", "unknown", "failed"] {
        assert!(
            !has(appends, "q", &[("outcome", outcome)]),
            "q: an append counted as {outcome}"
        );
    }
    // p's append stayed unknown: not resolved.
    assert!(!has(appends, "p", &[("outcome", "unknown_resolved")]));
    let losses = "leasehold_losses_total";
    assert_eq!(value(losses, "a", &[("reason", "revoked")]), 1.0);
    assert_eq!(value(losses, "p", &[("reason", "expired")]), 1.0);
    assert_eq!(value("leasehold_sessions_held", "a", &[]), 0.0);
    assert_eq!(value("leasehold_sessions_held", "p", &[]), 0.0);
    // Transactions sent: a's four appends and the fenced one; p's two.
    assert_eq!(value("leasehold_append_batch_records_count", "a", &[]), 5.0);
    assert_eq!(value("leasehold_append_batch_records_sum", "a", &[]), 6.0);
    assert_eq!(value("leasehold_append_seconds_count", "p", &[]), 2.0);
    // a's five transactions each carried one journal; m's 32 appends went in fewer.
    let txn_journals = "leasehold_append_txn_journals";
    assert_eq!(value(&format!("{txn_journals}_count"), "a", &[]), 5.0);
    assert_eq!(value(&format!("{txn_journals}_sum"), "a", &[]), 5.0);
    assert_eq!(value(&format!("{txn_journals}_sum"), "m", &[]), 32.0);
    let shared = value(&format!("{txn_journals}_count"), "m", &[]);
    assert!(shared < 32.0, "32 appends in {shared} transactions");
    assert!(value("leasehold_keepalive_round_trip_seconds_count", "a", &[]) >= 1.0);
    assert!(value("leasehold_validity_slack_seconds", "a", &[]) > 0.0);
}
