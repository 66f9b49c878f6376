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
    let host = SessionHost::start(
        store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        [session],
        work,
    );
    let mut events = host.events();
    let first = match tokio::time::timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Ok(HostEvent::Acquired { epoch, .. })) => epoch,
        other => panic!("expected the session acquired, got {other:?}"),
    };

    // --- phase: the tip is rewritten from outside (same bytes, a new mod_revision): the
    // owner's next append fails its compare, with its lease still valid
    let tip_key = etcd.ns.tip_key(session);
    let tampered = loop {
        // Rewrite exactly the current tip (a CAS on its mod_revision), so that it never goes
        // back: only its mod_revision moves.
        let tip = etcd.raw.clone().get(tip_key.as_str(), None).await.unwrap();
        let (value, revision) = (tip.kvs()[0].value().to_vec(), tip.kvs()[0].mod_revision());
        let rewrite = etcd_client::Txn::new()
            .when([etcd_client::Compare::mod_revision(
                tip_key.as_str(),
                etcd_client::CompareOp::Equal,
                revision,
            )])
            .and_then([etcd_client::TxnOp::put(tip_key.as_str(), value, None)]);
        if etcd.raw.clone().txn(rewrite).await.unwrap().succeeded() {
            break Instant::now();
        }
    };

    let deadline = tampered + Duration::from_secs(5);
    let (mut gave_up, mut again) = (None, None);
    while gave_up.is_none() || again.is_none() {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(HostEvent::GaveUp { why, .. })) => gave_up = Some(why),
            Ok(Ok(HostEvent::Acquired { epoch, .. })) => again = Some(epoch),
            Ok(other) => panic!("unexpected: {other:?}"),
            Err(_) => panic!("not reopened within 5 s: gave up {gave_up:?}, acquired {again:?}"),
        }
    }
    let (why, second) = (gave_up.unwrap(), again.unwrap());
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
