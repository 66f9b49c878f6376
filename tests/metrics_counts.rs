//! The metrics move by exactly what happened: after a scripted run (acquisitions, a held
//! acquisition, appends and a batch, a fenced append, an outcome-unknown append, a revoke, an
//! expiry), each counter of each node shows exactly its count.
//!
//! One test in this binary: it installs the process-wide recorder.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::admin::Admin;
use leasehold::testing::FaultProxy;
use leasehold::{ConnectOptions, Connection, JournalWriteError, LossReason, Uuid};
use metrics_exporter_prometheus::PrometheusBuilder;

/// `name{labels} value` lines of a Prometheus text scrape, labels sorted.
fn parse(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut samples = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        samples.insert((name.to_owned(), labels), value.parse().unwrap());
    }
    samples
}

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

    // --- the scrape
    let samples = parse(&handle.render());
    let value = |name: &str, node: &str, extra: &[(&str, &str)]| -> f64 {
        let mut labels: BTreeMap<String, String> = [("node", node), ("namespace", ns.as_str())]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.retain(|_, v| !v.is_empty());
        samples
            .get(&(name.to_owned(), labels.clone()))
            .copied()
            .unwrap_or_else(|| panic!("no {name} {labels:?} in the scrape"))
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
    let losses = "leasehold_losses_total";
    assert_eq!(value(losses, "a", &[("reason", "revoked")]), 1.0);
    assert_eq!(value(losses, "p", &[("reason", "expired")]), 1.0);
    assert_eq!(value("leasehold_sessions_held", "a", &[]), 0.0);
    assert_eq!(value("leasehold_sessions_held", "p", &[]), 0.0);
    // Transactions sent: a's four appends and the fenced one; p's two.
    assert_eq!(value("leasehold_append_batch_records_count", "a", &[]), 5.0);
    assert_eq!(value("leasehold_append_batch_records_sum", "a", &[]), 6.0);
    assert_eq!(value("leasehold_append_seconds_count", "p", &[]), 2.0);
    assert!(value("leasehold_keepalive_round_trip_seconds_count", "a", &[]) >= 1.0);
    assert!(value("leasehold_validity_slack_seconds", "a", &[]) > 0.0);
}
