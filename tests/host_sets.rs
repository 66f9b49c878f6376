//! Hosts given different fixed sets are told so: each gets a `HostEvent::SetDiffers` naming the
//! other (with a WARN line); hosts given the same set are not, however they were built.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold::{CancellationToken, HostEvent, HostOptions, Rig, SessionHost, Uuid};

async fn idle(_rig: Arc<Rig>, stop: CancellationToken) {
    stop.cancelled().await;
}

/// The stores the host was told hold a different set within `within`.
async fn differing(host: &SessionHost, within: Duration) -> Vec<(Uuid, usize)> {
    let mut events = host.events();
    let mut seen = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while let Ok(event) = events.recv().await {
            if let HostEvent::SetDiffers { store, sessions } = event {
                seen.push((store, sessions));
            }
        }
    })
    .await;
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_with_different_sets_are_told_and_hosts_with_the_same_set_are_not() {
    let etcd = common::Etcd::start().await;
    let options = || HostOptions::default().with_settle(Duration::ZERO);
    let sessions: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();

    // --- the same set, given in another order and built by adding and removing
    let a = Arc::new(etcd.store("a", 3).await);
    let b = Arc::new(etcd.store("b", 3).await);
    let host_a = SessionHost::start(a.clone(), options(), sessions.clone(), idle);
    let stray = Uuid::new_v4();
    let reversed: Vec<Uuid> = sessions.iter().rev().copied().chain([stray]).collect();
    let host_b = SessionHost::start(b.clone(), options(), reversed, idle);
    host_b.remove(stray);
    let (told_a, told_b) = tokio::join!(
        differing(&host_a, Duration::from_secs(3)),
        differing(&host_b, Duration::from_secs(3))
    );
    assert_eq!((told_a.as_slice(), told_b.as_slice()), (&[][..], &[][..]));

    // --- a third host with as many sessions, one of them another
    let c = Arc::new(etcd.store("c", 3).await);
    let mut other = sessions.clone();
    other[0] = Uuid::new_v4();
    let host_c = SessionHost::start(c.clone(), options(), other, idle);
    let (told_a, told_c) = tokio::join!(
        differing(&host_a, Duration::from_secs(3)),
        differing(&host_c, Duration::from_secs(3))
    );
    assert_eq!(told_a, [(c.id(), 20)], "a is told of c, once");
    let mut told_c: Vec<Uuid> = told_c.into_iter().map(|(store, _)| store).collect();
    told_c.sort();
    let mut both = vec![a.id(), b.id()];
    both.sort();
    assert_eq!(told_c, both, "c is told of a and b, once each");

    // --- c leaves: its set key goes with it
    host_c.shutdown().await;
    assert_eq!(
        common::count(&etcd.raw, &etcd.ns.sets_prefix()).await,
        2,
        "the set keys of a and b"
    );
    host_a.shutdown().await;
    host_b.shutdown().await;
    assert_eq!(common::count(&etcd.raw, &etcd.ns.sets_prefix()).await, 0);
}
