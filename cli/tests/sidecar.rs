//! The gRPC sidecar (`leasehold::sidecar`, `leasehold serve`) through a tonic client, against a
//! real etcd: every RPC, and every error reason a client can meet.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::sidecar::{Attached, Served, acquired, append, append_as, events, reason, replay};
use futures_util::StreamExt as _;
use leasehold::sidecar::proto::leasehold_client::LeaseholdClient;
use leasehold::sidecar::proto::{
    Acquire, AppendResponse, ReplayRequest, ReplayResponse, ValidateRequest, attach_request,
    attach_response, replay_response,
};
use leasehold::{Store, Uuid};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

#[tokio::test(flavor = "multi_thread")]
async fn a_client_owns_appends_retries_once_replays_follows_validates_and_releases() {
    let etcd = common::Etcd::start().await;
    let mut served = Served::start(etcd.store("sidecar", 10).await).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;

    // --- phase: acquire: fenced and ready
    let owned = acquired(attached.acquire(&session, None).await);
    assert_eq!(owned.session, session);
    assert_eq!(owned.tip_seq, 1, "a new journal holds its fence");
    assert!(owned.valid_for_ms > 0);
    assert_eq!(served.sidecar.owned_sessions(), 1);
    // Acquiring again on the same stream answers the same ownership, still valid.
    let again = acquired(attached.acquire(&session, None).await);
    assert_eq!((again.epoch, again.tip_seq), (owned.epoch, owned.tip_seq));
    assert!(again.valid_for_ms > 0, "{again:?}");

    // --- phase: append, and its retry lands once
    let client = &mut served.client;
    let first = client
        .append(append(&owned, &["a", "b", "c"], "r1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((first.first_seq, first.last_seq), (2, 4));
    let retried = client
        .append(append(&owned, &["a", "b", "c"], "r1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried, first, "the retry answers the first call");
    let reused = client
        .append(append(&owned, &["other"], "r1"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::InvalidArgument);
    assert!(reused.get_details_bad_request().is_some(), "{reused:?}");
    // Concurrent calls share transactions, and each is answered its own place.
    let calls = (0..16).map(|i| {
        let mut client = client.clone();
        let owned = owned.clone();
        async move {
            client
                .append(append(&owned, &[&format!("c{i}")], &format!("c{i}")))
                .await
                .unwrap()
                .into_inner()
        }
    });
    let answers: Vec<AppendResponse> = futures_util::future::join_all(calls).await;
    let mut seqs: Vec<u64> = answers.iter().map(|a| a.first_seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (5..21).collect::<Vec<_>>());

    // --- phase: replay, with and without fences, and follow
    let records = replay(client, &session, true).await;
    assert!(matches!(
        &records[0].kind,
        Some(replay_response::Kind::Fence(fence)) if fence.epoch == owned.epoch && fence.previous_seq == 0
    ));
    let seen = events(&records);
    assert_eq!(seen.len(), 19, "a, b, c once each, and the 16 calls");
    assert_eq!(
        seen[..3],
        [(2, "a".into()), (3, "b".into()), (4, "c".into())]
    );
    assert_eq!(replay(client, &session, false).await.len(), 19);
    let mut follow = client
        .replay(ReplayRequest {
            session: session.clone(),
            from_seq: 20,
            records: false,
            follow: true,
        })
        .await
        .unwrap()
        .into_inner();
    async fn next(follow: &mut tonic::Streaming<ReplayResponse>) -> ReplayResponse {
        tokio::time::timeout(Duration::from_secs(10), follow.message())
            .await
            .expect("a record within 10 s")
            .unwrap()
            .expect("the stream goes on")
    }
    // The snapshot's last record, then what commits after it.
    assert_eq!(next(&mut follow).await.seq, 20);
    client.append(append(&owned, &["live"], "")).await.unwrap();
    let live = next(&mut follow).await;
    assert_eq!(live.seq, 21);
    assert_eq!(
        live.kind,
        Some(replay_response::Kind::Event(b"live".to_vec()))
    );

    // --- phase: validate
    let check = |epoch| ValidateRequest {
        session: session.clone(),
        epoch,
    };
    let current = client
        .validate(check(owned.epoch))
        .await
        .unwrap()
        .into_inner();
    assert!(current.current);
    assert_eq!(current.owner_epoch, owned.epoch);
    let stale = client
        .validate(check(owned.epoch - 1))
        .await
        .unwrap()
        .into_inner();
    assert!(!stale.current);

    // --- phase: release; the epoch's appends are refused, LEASE_LOST
    assert!(matches!(
        attached.release(&session).await,
        attach_response::Event::Released(released) if released.session == session
    ));
    assert_eq!(served.sidecar.owned_sessions(), 0);
    let gone = client
        .validate(check(owned.epoch))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((gone.current, gone.owner_epoch), (false, 0));
    let refused = client
        .append(append(&owned, &["late"], ""))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let (why, metadata) = reason(&refused);
    assert_eq!(
        (why.as_str(), metadata["loss"].as_str()),
        ("LEASE_LOST", "released")
    );
    // A retry of a request made while owned still answers what it came to.
    let again = client
        .append(append(&owned, &["a", "b", "c"], "r1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first);
    // Releasing what is not held is answered all the same.
    assert!(matches!(
        attached.release(&session).await,
        attach_response::Event::Released(_)
    ));
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_ends_releases_its_sessions_and_the_next_owner_fences_the_last() {
    let etcd = common::Etcd::start().await;
    let served = Served::start(etcd.store("sidecar", 10).await).await;
    let session = Uuid::new_v4().to_string();
    let (mut one, mut two) = (served.client().await, served.client().await);
    let mut first = Attached::open(&mut one).await;
    let owned = acquired(first.acquire(&session, None).await);
    let first_call = one
        .append(append(&owned, &["first's"], "f1"))
        .await
        .unwrap()
        .into_inner();

    // --- phase: a try-acquire is told who holds it; a standby waits
    let mut second = Attached::open(&mut two).await;
    match second.acquire(&session, None).await {
        attach_response::Event::Held(held) => {
            assert_eq!(held.holder_epoch, owned.epoch);
            assert_eq!(held.holder_node, "sidecar");
        }
        other => panic!("expected Held, got {other:?}"),
    }
    second
        .send(attach_request::Request::Acquire(Acquire {
            session: session.clone(),
            wait: true,
            wait_ms: 0,
        }))
        .await;

    // --- phase: the first stream ends (its client goes away): the standby owns the session
    let ended = tokio::time::Instant::now();
    drop(first);
    let next = acquired(second.next().await);
    println!("taken over {:?} after the stream ended", ended.elapsed());
    assert!(ended.elapsed() < Duration::from_secs(2));
    assert!(next.epoch > owned.epoch);
    assert_eq!(next.tip_seq, 3, "fenced after the first owner's event");

    // --- phase: a retry of the first owner's committed call, after the handover, is still
    // answered what it came to (it must never be told it failed)
    let retried = two
        .append(append(&owned, &["first's"], "f1"))
        .await
        .expect("a retry of a committed call is answered its result")
        .into_inner();
    assert_eq!(retried, first_call);

    // --- phase: the dead stream's epoch is fenced, and nothing it sends lands
    let stale = two
        .append(append(&owned, &["stale"], ""))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    let (why, metadata) = reason(&stale);
    assert_eq!(why, "FENCED");
    assert_eq!(metadata["owner_epoch"], next.epoch.to_string());
    let records = replay(&mut two, &session, true).await;
    assert_eq!(records.len(), 3);
    assert_eq!(events(&records), [(2, "first's".to_owned())]);
    match &records[2].kind {
        Some(replay_response::Kind::Fence(fence)) => {
            assert_eq!(fence.epoch, next.epoch);
            assert_eq!((fence.previous_seq, fence.previous_epoch), (2, owned.epoch));
        }
        other => panic!("expected the fence, got {other:?}"),
    }
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_refusal_is_a_status_with_its_reason() {
    let etcd = common::Etcd::start().await;
    let mut served = Served::start(etcd.store("sidecar", 10).await).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;
    let refused = |status: tonic::Status, code: Code, expected: &str| {
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(reason(&status).0, expected, "{status:?}");
    };

    // --- phase: input the journal refuses before sending
    let empty = client.append(append(&owned, &[], "")).await.unwrap_err();
    refused(empty, Code::InvalidArgument, "EMPTY");
    let many: Vec<String> = (0..200).map(|i| i.to_string()).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let too_many = client.append(append(&owned, &many, "")).await.unwrap_err();
    refused(too_many, Code::InvalidArgument, "TOO_MANY_RECORDS");
    let big = "x".repeat(2 * 1024 * 1024);
    let too_large = client
        .append(append(&owned, &[&big], ""))
        .await
        .unwrap_err();
    refused(too_large, Code::InvalidArgument, "TOO_LARGE");

    // --- phase: a call without the ownership's token writes nothing, answers only
    let not_holder = client
        .append(append_as(&session, owned.epoch, &[], &["x"], "n1"))
        .await
        .unwrap_err();
    refused(not_holder, Code::PermissionDenied, "NOT_HOLDER");
    let empty = client
        .append(append_as(&session, owned.epoch, &[], &[], "n2"))
        .await
        .unwrap_err();
    refused(empty, Code::InvalidArgument, "EMPTY");

    // --- phase: malformed requests: INVALID_ARGUMENT with a BadRequest
    let malformed = client
        .append(append_as(
            "not-a-uuid",
            owned.epoch,
            &owned.token,
            &["x"],
            "",
        ))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    let bad = malformed.get_details_bad_request().expect("a BadRequest");
    assert_eq!(bad.field_violations[0].field, "session");
    for call in [
        client
            .validate(ValidateRequest {
                session: "nope".into(),
                epoch: 1,
            })
            .await
            .map(|_| ()),
        client
            .replay(ReplayRequest {
                session: "nope".into(),
                ..Default::default()
            })
            .await
            .map(|_| ()),
    ] {
        assert_eq!(call.unwrap_err().code(), Code::InvalidArgument);
    }

    // --- phase: ownership: another epoch, another session
    let newer = client
        .append(append_as(
            &session,
            owned.epoch + 1,
            &owned.token,
            &["x"],
            "",
        ))
        .await
        .unwrap_err();
    refused(newer, Code::FailedPrecondition, "NOT_OWNER");
    let older = client
        .append(append_as(
            &session,
            owned.epoch - 1,
            &owned.token,
            &["x"],
            "",
        ))
        .await
        .unwrap_err();
    refused(older, Code::FailedPrecondition, "FENCED");
    let elsewhere = client
        .append(append_as(
            &Uuid::new_v4().to_string(),
            5,
            &owned.token,
            &["x"],
            "",
        ))
        .await
        .unwrap_err();
    refused(elsewhere, Code::FailedPrecondition, "NOT_OWNER");

    // --- phase: an operator revokes the session: the stream is told, and appends are refused
    let admin = leasehold::Admin::new(served.sidecar.store().connection().clone(), etcd.ns.clone());
    admin
        .revoke(
            session.parse().unwrap(),
            Some(leasehold::Epoch(owned.epoch)),
        )
        .await
        .unwrap();
    match attached.next().await {
        attach_response::Event::Lost(lost) => {
            assert_eq!(
                (lost.session.as_str(), lost.reason.as_str()),
                (session.as_str(), "revoked")
            );
            assert_eq!(lost.epoch, owned.epoch);
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    let lost = client.append(append(&owned, &["x"], "")).await.unwrap_err();
    assert_eq!(reason(&lost).1["loss"], "revoked");
    refused(lost, Code::FailedPrecondition, "LEASE_LOST");

    // --- phase: a malformed Attach request ends its stream with INVALID_ARGUMENT
    attached
        .send(attach_request::Request::Acquire(Acquire {
            session: "nope".into(),
            wait: false,
            wait_ms: 0,
        }))
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(10), attached.responses.message())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(ended.code(), Code::InvalidArgument);
    served.shutdown().await;
}

/// etcd out of reach: an acquisition fails `ETCD_UNAVAILABLE` (the stream goes on), and an
/// append whose outcome stays unknown is answered OUTCOME_UNKNOWN; once etcd is back, its retry
/// with the same request id settles it: here, committed (its replies were lost), and told its
/// own sequence numbers, appended once.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_is_settled_by_its_retry_and_appended_once() {
    recorder();
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = Served::behind_proxy(&etcd, 3).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;
    client
        .append(append(&owned, &["before"], "r0"))
        .await
        .unwrap();

    // --- phase: etcd applies, its replies are lost until the lease runs out
    proxy.drop_replies();
    let unknown = client
        .append(append(&owned, &["once"], "r1"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::Unavailable, "{unknown:?}");
    assert_eq!(reason(&unknown).0, "OUTCOME_UNKNOWN");
    assert!(unknown.get_details_retry_info().is_some());
    match attached.next().await {
        attach_response::Event::Lost(lost) => assert_eq!(lost.epoch, owned.epoch),
        other => panic!("expected Lost, got {other:?}"),
    }
    // With the node lease invalid, an acquisition fails, and the stream goes on.
    match attached.acquire(&Uuid::new_v4().to_string(), None).await {
        attach_response::Event::Failed(failed) => {
            assert_eq!(failed.reason, "ETCD_UNAVAILABLE");
            assert!(failed.retryable);
        }
        other => panic!("expected Failed, got {other:?}"),
    }

    // --- phase: etcd answers again: the retry settles the outcome
    proxy.heal();
    let settled = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.append(append(&owned, &["once"], "r1")).await {
                Ok(settled) => return settled.into_inner(),
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("{status:?}"),
            }
        }
    })
    .await
    .expect("settled once etcd answers");
    assert_eq!((settled.first_seq, settled.last_seq), (3, 3));
    let seen = events(&replay(client, &session, false).await);
    assert_eq!(seen, [(2, "before".to_owned()), (3, "once".to_owned())]);
    assert_eq!(
        retries(&etcd, "journal"),
        1.0,
        "answered from the journal's records"
    );
    drop(attached);
    served.shutdown().await;
}

/// An append etcd never received, its outcome unknown until the lease is gone in etcd too: its
/// retry settles it as not applied (LEASE_LOST), and the record is not in the journal.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_that_never_applied_is_settled_lease_lost() {
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = Served::behind_proxy(&etcd, 3).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;

    proxy.blackhole();
    let unknown = client
        .append(append(&owned, &["never"], "r1"))
        .await
        .unwrap_err();
    assert_eq!(reason(&unknown).0, "OUTCOME_UNKNOWN", "{unknown:?}");
    // The node lease expires in etcd too (3 s without a renewal), deleting the owner key.
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.heal();
    let settled = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.append(append(&owned, &["never"], "r1")).await {
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    })
    .await
    .expect("settled once etcd answers")
    .unwrap_err();
    assert_eq!(settled.code(), Code::FailedPrecondition);
    assert_eq!(reason(&settled).0, "LEASE_LOST");
    assert!(events(&replay(client, &session, false).await).is_empty());
    drop(attached);
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn health_follows_the_node_lease_and_reflection_lists_the_service() {
    let etcd = common::Etcd::start().await;
    let (proxy, served) = Served::behind_proxy(&etcd, 3).await;
    let channel = Channel::from_shared(served.address.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    };
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let check = health
        .check(status("leasehold.v1.Leasehold"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(check.status, serving);

    proxy.blackhole();
    let not_serving = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let check = health.check(status("")).await.unwrap().into_inner();
            if check.status != serving {
                return check.status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("NOT_SERVING once the node lease is not valid");
    assert_eq!(
        not_serving,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
    proxy.heal();

    // Reflection lists the services without the proto file.
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    let Some(
        tonic_reflection::pb::v1::server_reflection_response::MessageResponse::ListServicesResponse(
            list,
        ),
    ) = answer.message_response
    else {
        panic!("a list of services: {answer:?}")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"leasehold.v1.Leasehold".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );
    served.shutdown().await;
}

/// A caller that goes away while its append is in flight (its deadline passed) leaves the
/// append to finish: the retry with the same request id is answered what it came to, and the
/// records are in the journal once.
#[tokio::test(flavor = "multi_thread")]
async fn a_caller_that_gives_up_mid_append_is_answered_by_its_retry() {
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = Served::behind_proxy(&etcd, 10).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;

    // --- phase: etcd's replies held; the caller's deadline passes
    proxy.hold_replies();
    let mut request = tonic::Request::new(append(&owned, &["once"], "r1"));
    request.set_timeout(Duration::from_millis(300));
    let gave_up = client.append(request).await.unwrap_err();
    assert_eq!(gave_up.code(), Code::Cancelled, "{gave_up:?}");

    // --- phase: the replies flow; the retry learns what the append came to
    proxy.heal();
    let retried = client
        .append(append(&owned, &["once"], "r1"))
        .await
        .expect("the retry is answered")
        .into_inner();
    assert_eq!((retried.first_seq, retried.last_seq), (2, 2));
    let seen = events(&replay(client, &session, false).await);
    assert_eq!(seen, [(2, "once".to_owned())]);
    drop(attached);
    served.shutdown().await;
}

/// `leasehold serve` with TLS on its listener and client certificates required: a client with
/// the CA and a certificate is served; one without a certificate is refused in the handshake.
#[tokio::test(flavor = "multi_thread")]
async fn leasehold_serve_with_tls_on_its_listener_requires_client_certificates() {
    use tokio::io::AsyncBufReadExt as _;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    let etcd = common::Etcd::start().await;
    let certificates = leasehold::testing::TestCertificates::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key) = certificates.server_pem();
    let (cert, key, ca) = (
        write("server.pem", cert),
        write("server.key", key),
        write("ca.pem", certificates.ca_pem()),
    );
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--listen-cert", &cert, "--listen-key", &key])
        .args(["--listen-client-ca", &ca])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(serve.stdout.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line
                .split("serving leasehold.v1.Leasehold on 127.0.0.1:")
                .nth(1)
            {
                return rest.split(',').next().unwrap().to_owned();
            }
        }
        panic!("leasehold serve ended before it served")
    })
    .await
    .expect("serving within 30 s");
    let address = format!("https://localhost:{port}");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(certificates.ca_pem()))
        .domain_name("localhost");

    let (client_cert, client_key) = certificates.client_pem();
    let channel = Channel::from_shared(address.clone())
        .unwrap()
        .tls_config(
            tls.clone()
                .identity(Identity::from_pem(client_cert, client_key)),
        )
        .unwrap()
        .connect()
        .await
        .expect("a client with a certificate connects");
    let checked = LeaseholdClient::new(channel)
        .validate(ValidateRequest {
            session: Uuid::new_v4().to_string(),
            epoch: 1,
        })
        .await
        .expect("served over TLS")
        .into_inner();
    assert!(!checked.current);

    let refused = match Channel::from_shared(address)
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
    {
        Err(error) => format!("{error:?}"),
        Ok(channel) => format!(
            "{:?}",
            LeaseholdClient::new(channel)
                .validate(ValidateRequest {
                    session: Uuid::new_v4().to_string(),
                    epoch: 1,
                })
                .await
                .expect_err("a client without a certificate is refused")
        ),
    };
    println!("without a client certificate: {refused}");
    serve.kill().await.unwrap();
}

/// An append that committed while its outcome stayed unknown, then lost its evidence: the
/// session moved to another owner, whose fence followed the record, and an operator trimmed
/// the record away. Its retry must not be told it never applied: it stays OUTCOME_UNKNOWN.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_whose_record_was_trimmed_away_stays_unknown() {
    let etcd = common::Etcd::start().await;
    let (proxy, mut served) = Served::behind_proxy(&etcd, 3).await;
    let session = Uuid::new_v4().to_string();
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&session, None).await);
    let client = &mut served.client;

    // --- phase: the append commits (seq 2), its replies lost until the lease runs out
    proxy.drop_replies();
    let unknown = client
        .append(append(&owned, &["committed"], "r1"))
        .await
        .unwrap_err();
    assert_eq!(reason(&unknown).0, "OUTCOME_UNKNOWN", "{unknown:?}");
    match attached.next().await {
        attach_response::Event::Lost(lost) => assert_eq!(lost.epoch, owned.epoch),
        other => panic!("expected Lost, got {other:?}"),
    }

    // --- phase: another owner fences after it (seq 3); an operator trims seq 2 away
    let other = etcd.store("other", 10).await;
    let id: Uuid = session.parse().unwrap();
    let lease = tokio::time::timeout(
        Duration::from_secs(20),
        other.acquire_lease_wait(id, Duration::from_secs(20)),
    )
    .await
    .unwrap()
    .expect("the next owner acquires once the sidecar lets go");
    let journal = other.open_journal(id, Some(&lease)).await.unwrap();
    assert_eq!(
        journal.next_seq(),
        4,
        "the fence follows the committed record"
    );
    let admin = leasehold::Admin::new(other.connection().clone(), etcd.ns.clone());
    assert_eq!(admin.trim(id, 3).await.unwrap().base, 3);

    // --- phase: the retry cannot tell: unknown, never "not applied"
    proxy.heal();
    for _ in 0..3 {
        let retried = client
            .append(append(&owned, &["committed"], "r1"))
            .await
            .unwrap_err();
        assert_eq!(retried.code(), Code::Unavailable, "{retried:?}");
        assert_eq!(reason(&retried).0, "OUTCOME_UNKNOWN", "{retried:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(attached);
    other.close().await;
    served.shutdown().await;
}

/// The process-wide Prometheus recorder of this binary, installed by the first test that asks.
fn recorder() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this binary");
        leasehold::metrics::describe();
        handle
    })
}

/// The value of `name` with labels `labels` (besides `node` and `namespace`) for `etcd`'s
/// namespace and node `sidecar`, 0 if not recorded.
fn sample(etcd: &common::Etcd, name: &str, labels: &[(&str, &str)]) -> f64 {
    let wanted: std::collections::BTreeMap<String, String> =
        [("node", "sidecar"), ("namespace", etcd.ns.as_str())]
            .into_iter()
            .chain(labels.iter().copied())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    let samples = common::prometheus::parse(&recorder().render());
    samples
        .get(&(name.to_owned(), wanted))
        .copied()
        .unwrap_or(0.0)
}

/// The sidecar's retries answered as `answer` says, for `etcd`'s namespace.
fn retries(etcd: &common::Etcd, answer: &str) -> f64 {
    sample(
        etcd,
        "leasehold_sidecar_retries_total",
        &[("answer", answer)],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_count_streams_sessions_calls_and_retries() {
    recorder();
    let etcd = common::Etcd::start().await;
    let mut served = Served::start(etcd.store("sidecar", 10).await).await;
    let calls = |rpc: &str, code: &str| {
        sample(
            &etcd,
            "leasehold_sidecar_calls_total",
            &[("rpc", rpc), ("code", code)],
        )
    };
    let (streams, sessions) = (
        || sample(&etcd, "leasehold_sidecar_streams", &[]),
        || sample(&etcd, "leasehold_sidecar_sessions", &[]),
    );
    let (one, two) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    let mut attached = Attached::open(&mut served.client).await;
    let owned = acquired(attached.acquire(&one, None).await);
    acquired(attached.acquire(&two, None).await);
    assert_eq!((streams(), sessions()), (1.0, 2.0));
    assert_eq!(calls("attach", "OK"), 1.0);

    // --- phase: appends, a retry answered from the journal, a stale epoch refused
    let client = &mut served.client;
    for request in [
        append(&owned, &["a"], "m1"),
        append(&owned, &["a"], "m1"),
        append(&owned, &["b"], ""),
    ] {
        client.append(request).await.unwrap();
    }
    let stale = client
        .append(append_as(&one, owned.epoch - 1, &owned.token, &["c"], ""))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    client
        .validate(ValidateRequest {
            session: one.clone(),
            epoch: owned.epoch,
        })
        .await
        .unwrap();
    replay(client, &one, false).await;
    assert_eq!(calls("append", "OK"), 3.0);
    assert_eq!(calls("append", "FAILED_PRECONDITION"), 1.0);
    assert_eq!(calls("validate", "OK"), 1.0);
    assert_eq!(calls("replay", "OK"), 1.0);
    assert_eq!(
        (retries(&etcd, "journal"), retries(&etcd, "waited")),
        (1.0, 0.0)
    );

    // --- phase: a release, then the stream's end
    attached.release(&two).await;
    assert_eq!(sessions(), 1.0);
    drop(attached);
    tokio::time::timeout(Duration::from_secs(10), async {
        while (streams(), sessions()) != (0.0, 0.0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the gauges fall back to 0 once the stream ends");
    served.shutdown().await;
}

/// Sets the seq of `session`'s tip in etcd to `seq` (the tip's value: a version byte, then the
/// seq, big-endian), as an operator's mistake or a very long-lived journal would leave it.
async fn forge_tip_seq(etcd: &common::Etcd, session: Uuid, seq: u64) {
    let key = etcd.ns.tip_key(session);
    let response = etcd.raw.clone().get(key.clone(), None).await.unwrap();
    let mut tip = response.kvs()[0].value().to_vec();
    tip[1..9].copy_from_slice(&seq.to_be_bytes());
    etcd.raw.clone().put(key, tip, None).await.unwrap();
}

/// The reasons met only at the edges: a journal whose sequence numbers are used up, and etcd's
/// RBAC refusing the sidecar's own user.
#[tokio::test(flavor = "multi_thread")]
async fn sequence_exhausted_and_permission_denied_carry_their_reasons() {
    // --- phase: a journal two short of the end: its fence takes the last but one, an append
    // the last would leave no next
    let etcd = common::Etcd::start().await;
    let mut served = Served::start(etcd.store("sidecar", 10).await).await;
    let session = Uuid::new_v4();
    let text = session.to_string();
    let mut attached = Attached::open(&mut served.client).await;
    acquired(attached.acquire(&text, None).await);
    attached.release(&text).await;
    forge_tip_seq(&etcd, session, u64::MAX - 2).await;
    let owned = acquired(attached.acquire(&text, None).await);
    assert_eq!(owned.tip_seq, u64::MAX - 1);
    let exhausted = served
        .client
        .append(append(&owned, &["last"], "s1"))
        .await
        .unwrap_err();
    assert_eq!(exhausted.code(), Code::FailedPrecondition, "{exhausted:?}");
    assert_eq!(reason(&exhausted).0, "SEQUENCE_EXHAUSTED");
    // A journal at its very end cannot even be fenced: the acquisition fails, not retryable.
    attached.release(&text).await;
    forge_tip_seq(&etcd, session, u64::MAX).await;
    match attached.acquire(&text, None).await {
        attach_response::Event::Failed(failed) => {
            assert_eq!(failed.reason, "SEQUENCE_EXHAUSTED", "{failed:?}");
            assert!(!failed.retryable);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    drop(attached);
    served.shutdown().await;

    // --- phase: the sidecar's user may write under A/ only; its namespace is B
    let secured = leasehold::testing::EtcdNode::builder()
        .auth("root-secret-5d1e")
        .start()
        .await
        .expect("etcd with authentication starts");
    secured
        .add_prefix_user("alice", "alice-secret-2b7c", "A/")
        .await
        .expect("user alice");
    let options = leasehold::StoreOptions::new([secured.endpoint()])
        .with_namespace(leasehold::Namespace::new("B").unwrap())
        .with_node("sidecar")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500))
        .with_user("alice", "alice-secret-2b7c");
    let store = Store::connect(options)
        .await
        .expect("connecting needs no key");
    let mut served = Served::start(store).await;
    let mut attached = Attached::open(&mut served.client).await;
    match attached.acquire(&text, None).await {
        attach_response::Event::Failed(failed) => {
            assert_eq!(failed.reason, "PERMISSION_DENIED", "{failed:?}");
            assert!(!failed.retryable);
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    let denied = served
        .client
        .validate(ValidateRequest {
            session: text.clone(),
            epoch: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert_eq!(reason(&denied).0, "PERMISSION_DENIED");
    let mut records = served
        .client
        .replay(ReplayRequest {
            session: text.clone(),
            from_seq: 0,
            records: true,
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let denied = records.message().await.unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert_eq!(reason(&denied).0, "PERMISSION_DENIED");
    drop(attached);
    served.shutdown().await;
}
