//! `Admin::move_session`: an owned session moved to another host in one
//! graceful handover (etcd's history shows one delete and one creation of its owner key, the
//! creation by the target), while a third store stands by on it and never gets it; the target
//! keeps it and the balance holds; each refusal in one typed error.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fleet::{Fleet, TTL, idle};
use leasehold::admin::{Admin, MoveError};
use leasehold::testing::wait_for;
use leasehold::{AcquireError, HostEvent, HostOptions, SessionHost, Uuid};

const SESSIONS: usize = 30;

/// The creations (with the store their value names) and deletes of `session`'s owner key in
/// etcd's history from revision `from` to `to`.
async fn owner_history(
    etcd: &common::Etcd,
    session: Uuid,
    from: i64,
    to: i64,
) -> (Vec<String>, usize) {
    let key = etcd.ns.owner_key(session);
    let (mut created, mut deleted) = (Vec::new(), 0);
    for change in common::history(&etcd.raw, from, to).await {
        if change.key != key.as_bytes() {
            continue;
        }
        match (change.put, change.version) {
            (true, 1) => {
                let value = String::from_utf8_lossy(&change.value);
                created.push(value.split(' ').nth(1).unwrap_or("").to_owned());
            }
            (false, _) => deleted += 1,
            (true, _) => {}
        }
    }
    (created, deleted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_is_one_handover_to_its_target_and_no_third_store_takes_the_session() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::start(&etcd, &sessions).await;
    let admin = Admin::new(fleet.stores[0].connection().clone(), etcd.ns.clone());
    let target = fleet.stores[2].id();
    // A store that is no host: it stands by on every session it is given and would take one
    // the moment it is freed, were it not for the move's compare.
    let third = Arc::new(etcd.store("third", TTL).await);

    let moves = 5;
    let moved: Vec<Uuid> = fleet.hosts[0]
        .held()
        .into_iter()
        .map(|(session, _)| session)
        .take(moves)
        .collect();
    let mut events = fleet.hosts[2].events();
    let mut given = fleet.hosts[0].events();
    for &session in &moved {
        // --- phase: a standby on the session in a third store, then the move
        let standby = tokio::spawn({
            let third = third.clone();
            async move {
                third
                    .acquire_lease_wait(session, Duration::from_secs(20))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let from = common::revision(&etcd.raw).await + 1;
        let started = Instant::now();
        let done = admin
            .move_session(session, target, Duration::from_secs(20))
            .await
            .expect("the move completes");
        let took = started.elapsed();
        assert_eq!(done.to, target);
        assert_eq!(done.from, Some(fleet.stores[0].id()));
        assert!(done.epoch > done.from_epoch && !done.already, "{done:?}");
        // The owner key names the target once it acquired; its rig opens (workspace root,
        // fence) right after.
        wait_for("the target's rig", Duration::from_secs(5), || async {
            fleet.holds(2, session).then_some(())
        })
        .await
        .unwrap();

        // --- checks: one handover, from the holder to the target, from etcd's history
        let to = common::revision(&etcd.raw).await;
        let (created, deleted) = owner_history(&etcd, session, from, to).await;
        assert_eq!(created, [target.to_string()], "created once, by the target");
        assert_eq!(deleted, 1, "deleted once, by the holder's release");
        // The holder gave it up as moved; the target acquired it.
        let gave_up = wait_event(&mut given, |event| match event {
            HostEvent::GaveUp {
                session: s, why, ..
            } if *s == session => Some(*why),
            _ => None,
        })
        .await;
        assert_eq!(gave_up, leasehold::GiveUp::Moved { to: target });
        wait_event(&mut events, |event| match event {
            HostEvent::Acquired { session: s, .. } if *s == session => Some(()),
            _ => None,
        })
        .await;
        println!("moved in {took:?} (the admin's call)");
        assert!(
            !standby.is_finished(),
            "the third store's standby never got it: {:?}",
            standby.await
        );
        standby.abort();
    }

    // --- phase: the balance holds, and the moved sessions stay where they were moved
    fleet.balanced().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.balanced().await;
    for &session in &moved {
        assert!(fleet.holds(2, session), "{session} stays on its target");
    }
    // The third store gets nothing now either: each moved session is held.
    for &session in &moved {
        match third.acquire_lease(session).await {
            Err(AcquireError::Held(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    third.close().await;
    for host in &fleet.hosts {
        host.shutdown().await;
    }
}

async fn wait_event<T>(
    events: &mut leasehold::HostEvents,
    mut pick: impl FnMut(&HostEvent) -> Option<T>,
) -> T {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(picked) = pick(&event) {
                        return picked;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(error) => panic!("{error}"),
            }
        }
    })
    .await
    .expect("the event within 10 s")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_is_refused_in_one_typed_error_and_leaves_the_session_where_it_is() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::start(&etcd, &sessions).await;
    let admin = Admin::new(fleet.stores[0].connection().clone(), etcd.ns.clone());
    let session = fleet.hosts[0].held()[0].0;
    let wait = Duration::from_secs(10);

    // --- nobody owns it, nobody has that store id
    let unowned = Uuid::new_v4();
    let refused = admin
        .move_session(unowned, fleet.stores[1].id(), wait)
        .await;
    assert!(
        matches!(refused, Err(MoveError::NotOwned { .. })),
        "{refused:?}"
    );
    let nobody = Uuid::now_v7();
    let refused = admin.move_session(session, nobody, wait).await;
    assert!(
        matches!(refused, Err(MoveError::NotLive { store }) if store == nobody),
        "{refused:?}"
    );

    // --- to its holder: nothing to do
    let already = admin
        .move_session(session, fleet.stores[0].id(), wait)
        .await
        .unwrap();
    assert!(already.already && already.epoch == already.from_epoch);

    // --- a move under way
    let move_key = etcd.ns.move_key(session);
    let other = format!(
        "leasehold-move/1 {} {} asked",
        Uuid::now_v7(),
        Uuid::now_v7()
    );
    etcd.raw
        .clone()
        .put(move_key.as_str(), other, None)
        .await
        .unwrap();
    let refused = admin
        .move_session(session, fleet.stores[1].id(), wait)
        .await;
    assert!(
        matches!(refused, Err(MoveError::UnderWay { .. })),
        "{refused:?}"
    );
    etcd.raw
        .clone()
        .delete(move_key.as_str(), None)
        .await
        .unwrap();

    // --- a target that drains
    fleet.hosts[1].drain().await;
    wait_for("drained, in its key", Duration::from_secs(10), || async {
        admin
            .hosts()
            .await
            .unwrap()
            .iter()
            .any(|host| host.store == fleet.stores[1].id() && host.draining)
            .then_some(())
    })
    .await
    .unwrap();
    let refused = admin
        .move_session(session, fleet.stores[1].id(), wait)
        .await;
    assert!(
        matches!(refused, Err(MoveError::TakesNone { .. })),
        "{refused:?}"
    );
    fleet.hosts[1].undrain();
    fleet.balanced().await;

    // --- a target that does not host the session: it withdraws the move
    let outsider_store = Arc::new(etcd.store("outsider", TTL).await);
    let outsider = SessionHost::start(
        outsider_store.clone(),
        HostOptions::default().with_settle(Duration::ZERO),
        [Uuid::new_v4()],
        idle,
    );
    wait_for(
        "the outsider is listed",
        Duration::from_secs(10),
        || async {
            admin
                .hosts()
                .await
                .unwrap()
                .iter()
                .any(|host| host.store == outsider_store.id())
                .then_some(())
        },
    )
    .await
    .unwrap();
    // Its key counts in the shares (a maximum of 1): once the others have shed to cover it,
    // a session of host 0's.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (session, epoch) = fleet.hosts[0].held()[0];
    let refused = admin.move_session(session, outsider_store.id(), wait).await;
    assert!(
        matches!(refused, Err(MoveError::Refused { .. })),
        "{refused:?}"
    );
    assert!(
        fleet.hosts[0].held().contains(&(session, epoch)),
        "it stays with its holder"
    );
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.moves_prefix()).await,
        0,
        "no move left behind"
    );
    outsider.shutdown().await;
    for host in &fleet.hosts {
        host.shutdown().await;
    }
}
