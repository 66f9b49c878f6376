//! A session that can never open does not thrash the cluster: two hosts, one session whose
//! journal's tip was rewritten behind its last record (so no fence can be written). Its opens
//! are retried with a growing, capped backoff: a handful of acquisitions per minute, counted
//! from etcd's history of its owner key; it is reported quarantined (an event and the
//! `leasehold_sessions_quarantined` gauge), and the healthy sessions are owned all along.
//!
//! One test in this binary: it installs the process-wide metrics recorder.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{CancellationToken, HostEvent, HostOptions, Rig, SessionHost, Store, Uuid};
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::time::Instant;

/// How long the acquisitions are counted.
const WINDOW: Duration = Duration::from_secs(60);
/// The most acquisitions of the broken session in `WINDOW`, both hosts together. Each host
/// retries it after 0.5, 1, 2, 4 … s (jittered: up to twice that), so at most 7 in the first
/// minute; 2 × 500 ms pauses without backoff made about 110.
const MOST_PER_MINUTE: usize = 12;

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// The sum of the gauge `leasehold_sessions_quarantined` over the series of `namespace`.
fn quarantined(scrape: &str, namespace: &str) -> f64 {
    scrape
        .lines()
        .filter(|line| {
            line.starts_with("leasehold_sessions_quarantined{")
                && line.contains(&format!("namespace=\"{namespace}\""))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Writes a journal for `session` and rewrites its tip to name the record before the last:
/// the next fence's record key exists already, so every open is fenced.
async fn break_journal(etcd: &common::Etcd, session: Uuid) {
    let store = etcd.store("setup", 10).await;
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let tip_key = etcd.ns.tip_key(session);
    let behind = etcd
        .raw
        .clone()
        .get(tip_key.as_str(), None)
        .await
        .unwrap()
        .kvs()[0]
        .value()
        .to_vec();
    journal.append("the last record").await.unwrap();
    drop(journal);
    lease.release().await.unwrap();
    store.close().await;
    etcd.raw.clone().put(tip_key, behind, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_that_cannot_open_is_retried_with_backoff_and_reported() {
    let metrics = PrometheusBuilder::new().install_recorder().unwrap();
    leasehold::metrics::describe();
    let etcd = common::Etcd::start().await;
    let ns = etcd.ns.as_str().to_owned();
    let broken = Uuid::new_v4();
    break_journal(&etcd, broken).await;
    let sessions = [broken, Uuid::new_v4(), Uuid::new_v4()];

    // --- phase: count every creation of the broken session's owner key from now on
    let from = common::revision(&etcd.raw).await + 1;
    let options = etcd_client::WatchOptions::new().with_start_revision(from);
    let mut watch = etcd
        .raw
        .clone()
        .watch(etcd.ns.owner_key(broken), Some(options))
        .await
        .unwrap();
    let acquisitions = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let counter = tokio::spawn({
        let acquisitions = acquisitions.clone();
        async move {
            while let Ok(Some(response)) = watch.message().await {
                for event in response.events() {
                    let created = event.event_type() == etcd_client::EventType::Put
                        && event.kv().is_some_and(|kv| kv.version() == 1);
                    if created {
                        acquisitions.lock().unwrap().push(Instant::now());
                    }
                }
            }
        }
    });

    // --- phase: two hosts over the broken session and two healthy ones
    let start = Instant::now();
    let stores: Vec<Arc<Store>> = vec![
        Arc::new(etcd.store("a", 10).await),
        Arc::new(etcd.store("b", 10).await),
    ];
    let hosts: Vec<SessionHost> = stores
        .iter()
        .map(|store| {
            SessionHost::start(
                store.clone(),
                HostOptions::default().with_settle(Duration::ZERO),
                sessions,
                idle,
            )
        })
        .collect();
    let reports = Arc::new(Mutex::new(Vec::new()));
    for host in &hosts {
        let (mut events, reports) = (host.events(), reports.clone());
        tokio::spawn(async move {
            while let Ok(event) = events.recv().await {
                if let HostEvent::Quarantined {
                    session,
                    failures,
                    retry_in,
                    error,
                } = event
                {
                    println!(
                        "quarantined after {:?}: {session}, {failures} failures, retry in {retry_in:?}: {error}",
                        start.elapsed()
                    );
                    reports.lock().unwrap().push((session, failures));
                }
            }
        });
    }

    // --- phase: it is reported quarantined; the healthy sessions are owned
    wait_for(
        "the quarantine reported",
        Duration::from_secs(20),
        || async {
            let scrape = metrics.render();
            (!reports.lock().unwrap().is_empty() && quarantined(&scrape, &ns) >= 1.0).then_some(())
        },
    )
    .await
    .unwrap();
    assert!(
        reports
            .lock()
            .unwrap()
            .iter()
            .all(|&(session, failures)| session == broken && failures >= 3)
    );
    wait_for(
        "the healthy sessions owned",
        Duration::from_secs(10),
        || async {
            let held: Vec<Uuid> = hosts
                .iter()
                .flat_map(SessionHost::held)
                .map(|(session, _)| session)
                .collect();
            (held.len() == 2 && !held.contains(&broken)).then_some(())
        },
    )
    .await
    .unwrap();

    // --- phase: a minute of it: a handful of acquisitions
    tokio::time::sleep_until(start + WINDOW).await;
    let times: Vec<Duration> = acquisitions
        .lock()
        .unwrap()
        .iter()
        .map(|at| at.saturating_duration_since(start))
        .collect();
    println!(
        "{} acquisitions of the broken session in {WINDOW:?}: {times:.1?}",
        times.len()
    );
    assert!(!times.is_empty(), "it is tried");
    assert!(
        times.len() <= MOST_PER_MINUTE,
        "{} acquisitions in {WINDOW:?}: {times:.1?}",
        times.len()
    );
    let last_half = times.iter().filter(|t| **t >= WINDOW / 2).count();
    assert!(
        last_half <= 4,
        "{last_half} acquisitions in the last {:?}",
        WINDOW / 2
    );

    // --- phase: the hosts stop; nothing is quarantined any more
    for host in &hosts {
        host.shutdown().await;
    }
    assert_eq!(quarantined(&metrics.render(), &ns), 0.0);
    counter.abort();
}
