//! A 2 s blip in which every connection to etcd is accepted and closed at once (fast
//! outcome-unknown failures), while appends are in flight and the lease stays valid: the
//! journal resumes, nothing is lost or doubled, and every session a `SessionHost` holds
//! advances within 2 s of the heal.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::testing::{AppendHistory, FaultProxy, check_journal, wait_for};
use leasehold::{HostOptions, SessionHost, Uuid};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const BLIP: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread")]
async fn a_journal_resumes_after_a_blip_of_fast_unknown_outcomes() {
    let common::ProxiedJournal {
        journal,
        lease,
        store,
        session,
        proxy,
        etcd: _etcd,
    } = common::ProxiedJournal::start(10).await;

    // --- phase: one writer appends continuously; its results are its history
    let stop = CancellationToken::new();
    let writer =
        common::append_continuously(journal.clone(), stop.clone(), Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // --- phase: the blip
    proxy.reject();
    tokio::time::sleep(BLIP).await;
    assert!(
        lease.is_valid(),
        "the blip is shorter than the lease's validity"
    );
    proxy.heal();
    let healed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let common::Appends {
        history,
        acks,
        error,
    } = writer.await.unwrap();

    // --- the journal went on: no append failed, one was acknowledged soon after the heal
    assert!(error.is_none(), "an append failed: {error:?}");
    assert!(!journal.is_broken());
    let resumed = acks
        .iter()
        .find(|at| **at >= healed)
        .map(|at| *at - healed)
        .expect("appends acknowledged after the heal");
    println!(
        "{} appends acknowledged; the first after the heal {resumed:?} after it",
        history.acknowledged()
    );
    assert!(
        resumed <= Duration::from_secs(2),
        "resumed after {resumed:?}"
    );
    let report = check_journal(&store, session, &history).await.unwrap();
    assert_eq!(report.events as usize, history.acknowledged());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_hosted_session_advances_within_two_seconds_of_the_heal() {
    const SESSIONS: usize = 5;
    let etcd = common::Etcd::start().await;
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    let store = Arc::new(common::store(&[proxy.endpoint()], &etcd.ns, "a", 10).await);
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    // What each session's work was told, by session.
    let histories: Arc<Mutex<HashMap<Uuid, AppendHistory>>> = Arc::default();
    let work = {
        let histories = histories.clone();
        move |rig: Arc<leasehold::Rig>, stop: CancellationToken| {
            let histories = histories.clone();
            async move {
                let mut i = 0;
                while !stop.is_cancelled() {
                    i += 1;
                    let payload = format!("{} {i}", rig.epoch());
                    let result = rig.journal().append(&payload).await;
                    histories
                        .lock()
                        .unwrap()
                        .entry(rig.session_id())
                        .or_default()
                        .record(&[&payload], &result);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    let host = SessionHost::start(
        store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        sessions.clone(),
        work,
    );
    let mut events = host.events();
    wait_for("every session owned", Duration::from_secs(10), || async {
        (host.held_count() == SESSIONS).then_some(())
    })
    .await
    .unwrap();

    // --- phase: the blip
    proxy.reject();
    tokio::time::sleep(BLIP).await;
    let tips_at_heal = tips(&etcd, &sessions).await;
    proxy.heal();
    let healed = Instant::now();

    // --- every journal advances, under the same owner, within 2 s
    let advanced = wait_for("every journal advanced", Duration::from_secs(2), || async {
        let now = tips(&etcd, &sessions).await;
        now.iter()
            .zip(&tips_at_heal)
            .all(|(now, then)| now > then)
            .then(|| healed.elapsed())
    })
    .await
    .unwrap();
    println!("every hosted journal advanced {advanced:?} after the heal");
    assert_eq!(host.held_count(), SESSIONS);
    while let Ok(event) = events.try_recv() {
        assert!(
            matches!(event, leasehold::HostEvent::Acquired { .. }),
            "no session was given up: {event:?}"
        );
    }

    host.shutdown().await;
    let histories = histories.lock().unwrap().clone();
    for session in &sessions {
        let report = check_journal(&store, *session, &histories[session])
            .await
            .unwrap();
        assert_eq!(report.fence_epochs.len(), 1, "one owner throughout");
    }
}

/// The mod_revision of each session's tip, read from outside.
async fn tips(etcd: &common::Etcd, sessions: &[Uuid]) -> Vec<i64> {
    let mut revisions = Vec::new();
    for session in sessions {
        let tip = etcd
            .raw
            .clone()
            .get(etcd.ns.tip_key(*session), None)
            .await
            .unwrap();
        revisions.push(tip.kvs().first().map_or(0, |kv| kv.mod_revision()));
    }
    revisions
}
