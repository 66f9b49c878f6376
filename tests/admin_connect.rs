//! `Admin::connect` from endpoints and a namespace name: it reads the namespace it was given;
//! an invalid namespace is refused before anything is dialled, and an etcd that does not answer
//! fails within the retry deadline, each in its own typed error. Hosts named by their node
//! name: drained, undrained and moved to by name; a name no live host has, or that two share,
//! refused in one typed error with nothing written.

mod common;

use common::fleet::{Fleet, TTL};
use std::time::{Duration, Instant};

use leasehold::admin::{Admin, AdminConnectError, DrainError, HostLookupError, MoveError};
use leasehold::testing::wait_for;
use leasehold::{ConnectError, ConnectOptions, RetryPolicy, Uuid};

const SESSIONS: usize = 20;

/// An admin of the member's namespace, connected by endpoint and namespace name.
async fn admin(etcd: &common::Etcd) -> Admin {
    Admin::connect([etcd.node.endpoint()], etcd.ns.as_str())
        .await
        .expect("the admin connects")
}

/// How many drain requests and moves the namespace holds.
async fn requests(etcd: &common::Etcd) -> (i64, i64) {
    (
        common::count(&etcd.raw, &format!("{}/drains/", etcd.ns)).await,
        common::count(&etcd.raw, &etcd.ns.moves_prefix()).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_connect_reads_the_namespace_it_was_given() {
    let etcd = common::Etcd::start().await;
    let store = etcd.store("n0", TTL).await;
    let session = Uuid::new_v4();
    let _lease = store.acquire_lease(session).await.expect("acquired");

    let admin = admin(&etcd).await;
    assert_eq!(admin.namespace(), &etcd.ns);
    let status = admin.namespace_status().await.expect("status");
    assert_eq!(status.namespace, etcd.ns);
    assert_eq!(status.owned_sessions, 1, "{status:?}");
    let owners = admin.owners().await.expect("owners");
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].session, session);

    // With options: the same namespace, through `connect_with`.
    let options = ConnectOptions::new([etcd.node.endpoint()])
        .with_connect_timeout(Duration::from_secs(1))
        .with_retry(RetryPolicy::default().with_deadline(Duration::from_secs(5)));
    let with = Admin::connect_with(options, etcd.ns.to_string())
        .await
        .expect("the admin connects with options");
    assert_eq!(with.namespace_status().await.unwrap().owned_sessions, 1);

    // Another namespace on the same member holds nothing.
    let other = Admin::connect([etcd.node.endpoint()], format!("{}-other", etcd.ns))
        .await
        .unwrap();
    assert_eq!(other.namespace_status().await.unwrap().keys, 0);
    store.close().await;
}

#[tokio::test]
async fn an_invalid_namespace_is_refused_before_anything_is_dialled() {
    // An endpoint nothing listens on: were it dialled, connecting would take the retry
    // deadline (10 s) and fail otherwise.
    let closed = closed_endpoint().await;
    let long = "n".repeat(129);
    for bad in [
        "",
        "a//b",
        "/leading",
        "spaces are not allowed",
        long.as_str(),
    ] {
        let started = Instant::now();
        let refused = Admin::connect([closed.as_str()], bad).await;
        match refused {
            Err(AdminConnectError::Namespace(invalid)) => assert_eq!(invalid.namespace, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "nothing dialled"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_that_does_not_answer_fails_within_the_retry_deadline() {
    // A port nothing listens on (refused at once, tried again until the deadline), and one
    // that accepts connections and never answers (each attempt waits for its timeouts).
    let closed = closed_endpoint().await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    let deadline = Duration::from_secs(2);
    let options = |endpoint: &str| {
        ConnectOptions::new([endpoint])
            .with_connect_timeout(Duration::from_millis(500))
            .with_request_timeout(Duration::from_millis(500))
            .with_retry(RetryPolicy::default().with_deadline(deadline))
    };
    let attempt = |options: ConnectOptions| async move {
        let started = Instant::now();
        let result = Admin::connect_with(options, "leasehold-test").await;
        (result, started.elapsed())
    };
    // And `connect` with the defaults: the default retry deadline, 10 s.
    let defaults = async {
        let started = Instant::now();
        let result = Admin::connect([closed.as_str()], "leasehold-test").await;
        (result, started.elapsed())
    };
    let (refused, blackholed, defaulted) = tokio::join!(
        attempt(options(&closed)),
        attempt(options(&silent_endpoint)),
        defaults,
    );
    for ((result, took), bound) in [
        (refused, deadline),
        (blackholed, deadline),
        (defaulted, RetryPolicy::default().deadline),
    ] {
        println!("failed after {took:?}: {result:?}");
        match &result {
            Err(AdminConnectError::Connect(ConnectError::Unreachable { source, .. })) => {
                assert!(source.class().retry_read(), "{source:?}");
            }
            other => panic!("{other:?}"),
        }
        // What a `main` that returns the error prints: its chain on one line, no field dump.
        let shown = format!("{:?}", result.as_ref().expect_err("failed"));
        assert!(
            shown.starts_with("cannot connect to etcd: no etcd endpoint answered (")
                && !shown.contains('\n')
                && !shown.contains("Unreachable {"),
            "{shown}"
        );
        // Within the deadline, plus a last attempt's timeouts and a loaded machine's slack.
        assert!(took <= bound + Duration::from_secs(3), "took {took:?}");
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread")]
async fn drain_and_undrain_name_the_host_by_its_node_name() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::named(&etcd, &["n0", "n1"], &sessions).await;
    fleet.holding("10 each", &[10, 10]).await;
    let admin = admin(&etcd).await;

    // --- the lookup
    let n1 = admin.host_named("n1").await.expect("n1 is live");
    assert_eq!(n1.store, fleet.stores[1].id());
    assert_eq!(n1.node, "n1");
    let n0 = admin.host_named("n0").await.expect("n0 is live");
    assert_eq!(n0.store, fleet.stores[0].id());

    // --- a name no live host has: refused, nothing written
    match admin.host_named("nobody").await {
        Err(HostLookupError::NoSuchHost { node }) => assert_eq!(node, "nobody"),
        other => panic!("{other:?}"),
    }
    // Names are compared exactly.
    assert!(matches!(
        admin.host_named("n").await,
        Err(HostLookupError::NoSuchHost { .. })
    ));
    match admin.drain_node("nobody").await {
        Err(DrainError::NoSuchHost { node }) => assert_eq!(node, "nobody"),
        other => panic!("{other:?}"),
    }
    match admin.undrain_node("nobody").await {
        Err(DrainError::NoSuchHost { node }) => assert_eq!(node, "nobody"),
        other => panic!("{other:?}"),
    }
    assert_eq!(requests(&etcd).await, (0, 0), "nothing written");

    // --- drain n1 by name: its sessions move to n0
    let asked = admin.drain_node("n1").await.expect("n1 drains");
    assert_eq!(asked.store, fleet.stores[1].id());
    assert_eq!(asked.sessions, 10);
    fleet.holding("n0 holds all 20", &[20, 0]).await;
    assert!(fleet.hosts[1].is_draining() && !fleet.hosts[0].is_draining());
    wait_for("n1 listed as draining", Duration::from_secs(10), || async {
        let listed = admin.hosts().await.unwrap();
        let draining: Vec<&str> = listed
            .iter()
            .filter(|host| host.draining)
            .map(|host| host.node.as_str())
            .collect();
        (draining == ["n1"]).then_some(())
    })
    .await
    .unwrap();

    // --- undrain n1 by name: its share comes back
    let asked = admin.undrain_node("n1").await.expect("n1 undrains");
    assert_eq!(asked.store, fleet.stores[1].id());
    fleet.holding("10 each again", &[10, 10]).await;
    assert!(!fleet.hosts[1].is_draining());
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_two_live_hosts_share_is_ambiguous_and_nothing_is_written() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::named(&etcd, &["twin", "twin", "single"], &sessions).await;
    let admin = admin(&etcd).await;
    wait_for("three hosts listed", Duration::from_secs(10), || async {
        (admin.hosts().await.unwrap().len() == 3).then_some(())
    })
    .await
    .unwrap();
    let mut twins = vec![fleet.stores[0].id(), fleet.stores[1].id()];
    twins.sort();

    match admin.host_named("twin").await {
        Err(HostLookupError::Ambiguous { node, stores }) => {
            assert_eq!(node, "twin");
            assert_eq!(stores, twins, "both store ids, in order");
        }
        other => panic!("{other:?}"),
    }
    match admin.drain_node("twin").await {
        Err(DrainError::Ambiguous { node, stores }) => {
            assert_eq!(node, "twin");
            assert_eq!(stores, twins);
        }
        other => panic!("{other:?}"),
    }
    let session = sessions[0];
    match admin
        .move_session_to_node(session, "twin", Duration::from_secs(5))
        .await
    {
        Err(error @ MoveError::Ambiguous { .. }) => {
            assert!(!error.is_transient());
            assert!(error.to_string().contains(&twins[0].to_string()), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(requests(&etcd).await, (0, 0), "nothing written");
    // The single one is found, and by store id the twins still are.
    let single = admin.host_named("single").await.expect("one host");
    assert_eq!(single.store, fleet.stores[2].id());
    admin.drain(twins[0]).await.expect("drained by store id");
    admin
        .undrain(twins[0])
        .await
        .expect("undrained by store id");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn move_session_to_node_moves_the_session_to_the_named_host() {
    let etcd = common::Etcd::start().await;
    let sessions: Vec<Uuid> = (0..SESSIONS).map(|_| Uuid::new_v4()).collect();
    let fleet = Fleet::named(&etcd, &["h0", "h1"], &sessions).await;
    fleet.holding("10 each", &[10, 10]).await;
    let admin = admin(&etcd).await;
    let wait = Duration::from_secs(20);
    let (session, _) = fleet.hosts[0].held()[0];

    match admin.move_session_to_node(session, "nobody", wait).await {
        Err(MoveError::NoSuchHost { node }) => assert_eq!(node, "nobody"),
        other => panic!("{other:?}"),
    }
    assert_eq!(requests(&etcd).await, (0, 0), "nothing written");
    assert!(
        fleet.hosts[0].rig(session).is_some(),
        "it stays where it is"
    );

    let moved = admin
        .move_session_to_node(session, "h1", wait)
        .await
        .expect("the move completes");
    assert_eq!(moved.to, fleet.stores[1].id());
    assert_eq!(moved.from, Some(fleet.stores[0].id()));
    assert!(
        moved.epoch > moved.from_epoch && !moved.already,
        "{moved:?}"
    );
    wait_for("h1's rig", Duration::from_secs(5), || async {
        fleet.hosts[1].rig(session).is_some().then_some(())
    })
    .await
    .unwrap();
    // To the host that holds it already: nothing to do.
    let already = admin
        .move_session_to_node(session, "h1", wait)
        .await
        .unwrap();
    assert!(already.already && already.to == fleet.stores[1].id());
    fleet.shutdown().await;
}

/// An endpoint on a loopback port nothing listens on (one that was free a moment ago).
async fn closed_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{address}")
}
