//! A session host's set of sessions changes at run time, and `max_sessions` caps what it holds.
//! (The hosts do not settle: `tests/host_settle.rs` is about that.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::testing::wait_for;
use leasehold::{
    CancellationToken, GiveUp, HostEvent, HostOptions, LossReason, Rig, SessionHost, Uuid,
};

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

async fn owned(etcd: &common::Etcd) -> usize {
    common::count(&etcd.raw, &etcd.ns.owners_prefix()).await as usize
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_added_and_removed_at_run_time_are_taken_and_handed_back() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", 10).await);
    let sessions: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
    let host = SessionHost::start(
        store,
        HostOptions::default().with_settle(Duration::ZERO),
        sessions[..3].to_vec(),
        idle,
    );
    let within = Duration::from_secs(5);
    wait_for("three owned", within, || async {
        (owned(&etcd).await == 3).then_some(())
    })
    .await
    .unwrap();

    host.add(sessions[3]);
    host.add(sessions[3]); // no second task
    wait_for("the added one owned", within, || async {
        (host.held_count() == 4 && owned(&etcd).await == 4).then_some(())
    })
    .await
    .unwrap();

    host.remove(sessions[0]);
    wait_for("the removed one released", within, || async {
        let key = etcd.ns.owner_key(sessions[0]);
        (common::create_revision(&etcd.raw, &key).await == 0 && host.held_count() == 3)
            .then_some(())
    })
    .await
    .unwrap();
    let workspace = etcd.ns.workspace_key(&format!("ws-{}", sessions[0]));
    assert_eq!(common::create_revision(&etcd.raw, &workspace).await, 0);
    host.shutdown().await;
    assert_eq!(owned(&etcd).await, 0);
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.workspaces_prefix()).await,
        0
    );
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.hosts_prefix()).await,
        0,
        "the host's key is gone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn max_sessions_caps_a_host_and_another_takes_the_rest() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
    let capped = SessionHost::start(
        Arc::new(etcd.store("capped", 10).await),
        HostOptions::default()
            .with_settle(Duration::ZERO)
            .with_max_sessions(3),
        sessions.clone(),
        idle,
    );
    wait_for("three owned", Duration::from_secs(5), || async {
        (owned(&etcd).await == 3).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(capped.held_count(), 3, "never more than its maximum");
    assert_eq!(owned(&etcd).await, 3);

    let other = SessionHost::start(
        Arc::new(etcd.store("other", 10).await),
        HostOptions::default().with_settle(Duration::ZERO),
        sessions.clone(),
        idle,
    );
    wait_for("all owned", Duration::from_secs(10), || async {
        (owned(&etcd).await == 10 && capped.held_count() + other.held_count() == 10).then_some(())
    })
    .await
    .unwrap();
    assert_eq!((capped.held_count(), other.held_count()), (3, 7));
    capped.shutdown().await;
    other.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn work_that_ignores_its_token_is_aborted_after_the_grace_period() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", 10).await);
    let session = Uuid::new_v4();
    let stubborn = |_rig: Arc<Rig>, _stop: CancellationToken| std::future::pending::<()>();
    let host = SessionHost::start(
        store,
        HostOptions::default()
            .with_settle(Duration::ZERO)
            .with_stop_grace(Duration::from_millis(500)),
        [session],
        stubborn,
    );
    wait_for("owned", Duration::from_secs(5), || async {
        (host.held_count() == 1).then_some(())
    })
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), host.shutdown())
        .await
        .expect("shutdown is bounded by the grace period");
    println!("shutdown took {:?}", started.elapsed());
    assert_eq!(owned(&etcd).await, 0, "released in order all the same");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_lost_from_outside_is_given_up_as_lost_and_owned_again() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", 10).await);
    let session = Uuid::new_v4();
    // Work that only waits for its token: the loss must cancel it.
    let host = SessionHost::start(
        store,
        HostOptions::default().with_settle(Duration::ZERO),
        [session],
        idle,
    );
    let mut events = host.events();
    let HostEvent::Acquired { epoch: first, .. } = next(&mut events).await else {
        panic!("expected the session acquired");
    };
    etcd.raw
        .clone()
        .delete(etcd.ns.owner_key(session), None)
        .await
        .unwrap();
    let (why, _) = given_up_then_owned_again(&mut events, first).await;
    assert_eq!(why, GiveUp::Lost(LossReason::Revoked));
    host.shutdown().await;
}

/// The host's next events: the session owned at epoch `first` is given up (why, and how its
/// shutdown went), then owned again at a later epoch.
async fn given_up_then_owned_again(
    events: &mut leasehold::HostEvents,
    first: leasehold::Epoch,
) -> (GiveUp, Result<(), Arc<leasehold::rig::RigError>>) {
    let given_up = match next(events).await {
        HostEvent::GaveUp {
            why, epoch, result, ..
        } => {
            assert_eq!(epoch, first);
            (why, result)
        }
        other => panic!("expected the session given up, got {other:?}"),
    };
    match next(events).await {
        HostEvent::Acquired { epoch, .. } => assert!(epoch > first),
        other => panic!("expected the session acquired again, got {other:?}"),
    }
    given_up
}

/// The host's next event, within 5 s.
async fn next(events: &mut leasehold::HostEvents) -> HostEvent {
    tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("an event within 5 s")
        .expect("the host lives")
}

#[tokio::test(flavor = "multi_thread")]
async fn work_that_panics_gives_the_session_up_in_order_and_it_is_owned_again() {
    let etcd = common::Etcd::start().await;
    let store = Arc::new(etcd.store("a", 10).await);
    let session = Uuid::new_v4();
    let panicking = |rig: Arc<Rig>, _stop: CancellationToken| async move {
        rig.journal().append("before the panic").await.unwrap();
        panic!("the work panics");
    };
    let host = SessionHost::start(
        store,
        HostOptions::default().with_settle(Duration::ZERO),
        [session],
        panicking,
    );
    let mut events = host.events();
    let HostEvent::Acquired { epoch: first, .. } = next(&mut events).await else {
        panic!("expected the session acquired");
    };
    let (why, result) = given_up_then_owned_again(&mut events, first).await;
    assert_eq!(why, GiveUp::WorkDone);
    assert!(result.is_ok(), "shut down in order: {result:?}");
    host.shutdown().await;
}
