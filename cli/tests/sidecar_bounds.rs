//! What a client controls is bounded: payload bytes in flight, WatchOwners streams; a client
//! that stops reading its stream loses that stream (its sessions released) and holds up no
//! other client, and no shutdown past its bound. (Request ids, streams, sessions per stream
//! and replays: tests/python/guarantees_test.py, through reflection.)

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::sidecar::{Attached, Served, acquired, append, reason};
use leasehold::Uuid;
use leasehold::sidecar::SidecarOptions;
use leasehold::sidecar::proto::{Acquire, ValidateRequest, WatchOwnersRequest, attach_request};
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn payload_bytes_in_flight_and_watches_are_bounded() {
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = {
        let proxy = leasehold::testing::FaultProxy::start(etcd.node.endpoint())
            .await
            .unwrap();
        let store = common::store(&[proxy.endpoint()], &etcd.ns, "sidecar", 10).await;
        let options = SidecarOptions::default()
            .with_max_bytes_in_flight(100)
            .with_max_watches(1);
        (proxy, Served::start_with(store, options).await)
    };
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;

    // --- phase: one append past the bound alone; two that fit one at a time, not together
    let big = "x".repeat(101);
    let refused = client
        .append(append(&owned, &[&big], "big"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(reason(&refused).0, "TOO_MANY_BYTES_IN_FLIGHT");
    assert!(tonic_types::StatusExt::get_details_retry_info(&refused).is_some());
    let sixty = "y".repeat(60);
    proxy.hold_replies();
    let mut first = client.clone();
    let request = append(&owned, &[&sixty], "a");
    let under_way = tokio::spawn(async move { first.append(request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = client
        .append(append(&owned, &[&sixty], "b"))
        .await
        .unwrap_err();
    assert_eq!(reason(&second).0, "TOO_MANY_BYTES_IN_FLIGHT");
    proxy.heal();
    under_way.await.unwrap().expect("the first is answered");
    client
        .append(append(&owned, &[&sixty], "b"))
        .await
        .expect("room again once the first is done");

    // --- phase: one WatchOwners stream at a time
    let mut watching = client
        .watch_owners(WatchOwnersRequest {})
        .await
        .unwrap()
        .into_inner();
    watching.message().await.unwrap();
    let second = client
        .watch_owners(WatchOwnersRequest {})
        .await
        .unwrap_err();
    assert_eq!(second.code(), Code::ResourceExhausted);
    assert_eq!(reason(&second).0, "TOO_MANY_WATCHES");
    drop(watching);
    tokio::time::timeout(Duration::from_secs(10), async {
        while client.watch_owners(WatchOwnersRequest {}).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a watch again once the first is gone");
    drop(attached);
    served.shutdown().await;
}

/// A client that stops reading its Attach stream: once its events have waited
/// `stalled_reader`, its stream ends and its session is released; another client goes on
/// meanwhile; and the sidecar's shutdown ends within its timeout although that client's
/// connection still has unread data.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_reading_holds_up_nothing_but_itself() {
    let etcd = common::Etcd::start().await;
    let options = SidecarOptions::default()
        .with_stalled_reader(Duration::from_secs(1))
        .with_shutdown_timeout(Duration::from_secs(2));
    let mut served = Served::start_with(etcd.store("sidecar", 10).await, options).await;
    let (stalled, healthy) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    let mut reader = served.client().await;
    let mut sleeper = Attached::open(&mut reader).await;
    acquired(sleeper.acquire(&stalled, None).await);

    // --- phase: it asks again and again, and reads none of the answers, until the sidecar
    // stops taking its requests (every buffer on the way full)
    let mut asked = 0;
    loop {
        let request = leasehold::sidecar::proto::AttachRequest {
            request: Some(attach_request::Request::Acquire(Acquire {
                session: stalled.clone(),
                wait: false,
                wait_ms: 0,
            })),
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), sleeper.requests.send(request));
        match sent.await {
            Ok(Ok(())) => asked += 1,
            Ok(Err(_)) | Err(_) => break,
        }
        assert!(
            asked < 1_000_000,
            "the sidecar never stopped taking requests"
        );
    }
    println!("{asked} requests sent before the sidecar stopped taking them");
    let mut other = Attached::open(&mut served.client).await;
    let owned = acquired(other.acquire(&healthy, None).await);
    served
        .client
        .append(append(&owned, &["meanwhile"], "m"))
        .await
        .expect("another client goes on");

    // --- phase: its stream ends, and its session is released
    let validate = |session: &str| ValidateRequest {
        session: session.to_owned(),
        epoch: 0,
    };
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let owner = served
                .client
                .validate(validate(&stalled))
                .await
                .unwrap()
                .into_inner();
            if owner.owner_epoch == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("released within 15 s of its stream stalling");
    assert_eq!(
        served.sidecar.owned_sessions(),
        1,
        "the other client's session"
    );

    // --- phase: the shutdown ends within its timeout
    let started = tokio::time::Instant::now();
    served.shutdown().await;
    let took = started.elapsed();
    println!("shut down in {took:?} with a client that reads nothing");
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(sleeper);
    drop(other);
}

/// `leasehold serve --shutdown-timeout 2s` with a client that reads nothing of its stream:
/// SIGTERM ends the process within the bound, exit 0.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_leasehold_serve_within_its_shutdown_timeout() {
    use tokio::io::AsyncBufReadExt as _;

    let etcd = common::Etcd::start().await;
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shutdown-timeout",
            "2s",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(serve.stdout.take().unwrap()).lines();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("serving leasehold.v1.Leasehold on ").nth(1) {
                return rest.split(',').next().unwrap().to_owned();
            }
        }
        panic!("leasehold serve ended before it served")
    })
    .await
    .expect("serving within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut client = leasehold::sidecar::proto::leasehold_client::LeaseholdClient::connect(
        format!("http://{address}"),
    )
    .await
    .unwrap();
    let session = Uuid::new_v4().to_string();
    let mut sleeper = Attached::open(&mut client).await;
    acquired(sleeper.acquire(&session, None).await);
    // It asks and asks, and reads none of the answers.
    loop {
        let request = leasehold::sidecar::proto::AttachRequest {
            request: Some(attach_request::Request::Acquire(Acquire {
                session: session.clone(),
                wait: false,
                wait_ms: 0,
            })),
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), sleeper.requests.send(request));
        if !matches!(sent.await, Ok(Ok(()))) {
            break;
        }
    }
    let started = tokio::time::Instant::now();
    let exit = common::terminate(&mut serve, Duration::from_secs(10)).await;
    let took = started.elapsed();
    println!("exited {exit:?} {took:?} after SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    drop(sleeper);
}
