//! A session whose journal breaks while its lease stays valid is not left on it: the host gives
//! it up in order and opens it again under a new lease, and its journal goes on.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::{AppendHistory, check_journal, wait_for};
use leasehold::{CancellationToken, GiveUp, HostEvent, HostOptions, Rig, SessionHost, Uuid};
use tokio::time::Instant;

/// Appends every 50 ms until stopped.
async fn work(rig: Arc<Rig>, stop: CancellationToken) {
    let mut i = 0;
    while !stop.is_cancelled() {
        i += 1;
        let _ = rig.journal().append(format!("{} {i}", rig.epoch())).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_journal_under_a_valid_lease_is_given_up_and_reopened() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", 10).await);
    let session = Uuid::new_v4();
    let host = SessionHost::start(store.clone(), HostOptions::default(), [session], work);
    let mut events = host.events();
    let first = match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Ok(HostEvent::Acquired { epoch, .. })) => epoch,
        other => panic!("expected the session acquired, got {other:?}"),
    };

    // --- phase: the tip is rewritten from outside (same bytes, a new mod_revision): the
    // owner's next append fails its compare, with its lease still valid
    let tip_key = etcd.ns.tip_key(session);
    let tip = etcd.raw.clone().get(tip_key.as_str(), None).await.unwrap();
    let value = tip.kvs()[0].value().to_vec();
    let tampered = Instant::now();
    etcd.raw
        .clone()
        .put(tip_key.as_str(), value, None)
        .await
        .unwrap();

    // --- the host gives the session up for its broken journal and owns it again, newer
    let (why, second) = wait_for("the session reopened", Duration::from_secs(5), || {
        let mut seen = Vec::new();
        while let Ok(event) = events.try_recv() {
            seen.push(event);
        }
        let gave_up = seen.iter().find_map(|e| match e {
            HostEvent::GaveUp { why, .. } => Some(*why),
            _ => None,
        });
        let again = seen.iter().find_map(|e| match e {
            HostEvent::Acquired { epoch, .. } => Some(*epoch),
            _ => None,
        });
        std::future::ready(gave_up.zip(again))
    })
    .await
    .unwrap();
    println!(
        "gave up ({why}) and reopened at epoch {second} {:?} after the tamper",
        tampered.elapsed()
    );
    assert_eq!(why, GiveUp::JournalBroken);
    assert!(second > first);

    // --- and its journal advances under the new epoch
    let at = common::revision(&etcd.raw).await;
    wait_for("the journal advanced", Duration::from_secs(3), || async {
        let tip = etcd.raw.clone().get(tip_key.as_str(), None).await.unwrap();
        (tip.kvs()[0].mod_revision() > at).then_some(())
    })
    .await
    .unwrap();
    host.shutdown().await;
    let report = check_journal(&store, session, &AppendHistory::default())
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!(report.fence_epochs, [first, second]);
}
