//! etcd authentication and RBAC: a user whose role may write only under `A/` works in
//! namespace `A` and gets typed, permanent permission errors (fast, never retried) in `B`; a
//! store whose role stops covering its namespace loses every lease with a permission reason,
//! lets its owner keys go and acquires nothing more; a node outside its role says so once, at
//! error level, and its owner watch does not restart; a wrong password is refused with a
//! typed error; a token that expires every 2 s never costs a lease; no password or key
//! reaches the command's output, even with debug logging; and a read that would settle an
//! append's outcome, refused for permission, is not sent again.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use leasehold::testing::{EtcdNode, TestCertificates};
use leasehold::{
    AcquireError, ConnectError, FailureClass, LossReason, Namespace, ReplayError, Store,
    StoreError, StoreOptions, Uuid,
};
use tokio::time::timeout;

const ROOT_PASSWORD: &str = "root-secret-7f3a";
const PASSWORD: &str = "alice-secret-91c2";

/// A member with authentication; user `alice` may read and write under `A/` only.
async fn auth_etcd(extra: &[&str]) -> EtcdNode {
    let etcd = EtcdNode::builder()
        .auth(ROOT_PASSWORD)
        .args(extra.iter().copied())
        .start()
        .await
        .expect("etcd with authentication starts");
    etcd.add_prefix_user("alice", PASSWORD, "A/")
        .await
        .expect("user alice");
    etcd
}

fn alice(etcd: &EtcdNode, namespace: &str, password: &str) -> StoreOptions {
    StoreOptions::new([etcd.endpoint()])
        .with_namespace(Namespace::new(namespace).unwrap())
        .with_node("alice-node")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500))
        .with_user("alice", password)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_works_in_its_prefix_and_is_denied_elsewhere_with_typed_errors() {
    let etcd = auth_etcd(&[]).await;

    // Namespace A: the role's prefix.
    let store = Store::connect(alice(&etcd, "A", PASSWORD))
        .await
        .expect("alice connects");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.expect("acquires in A");
    let journal = store
        .open_journal(session, Some(&lease))
        .await
        .expect("opens in A");
    journal.append("one").await.expect("appends in A");
    journal.append("two").await.expect("appends in A");
    let events: Vec<_> = store
        .replay(session)
        .map(|event| event.expect("replays in A").payload)
        .collect()
        .await;
    assert_eq!(events, vec![b"one".to_vec(), b"two".to_vec()]);

    // Namespace B: outside the role. Connecting (status, a node lease) needs no key
    // permission; the first key is refused, permanently, at once.
    let denied = Store::connect(alice(&etcd, "B", PASSWORD))
        .await
        .expect("connecting needs no key permission");
    let started = Instant::now();
    let error = timeout(Duration::from_secs(5), denied.acquire_lease(Uuid::new_v4()))
        .await
        .expect("refused at once, never re-sent")
        .expect_err("B is outside alice's role");
    let took = started.elapsed();
    match &error {
        AcquireError::Etcd(etcd_error) => {
            assert!(etcd_error.is_permission_denied(), "{etcd_error:?}");
            assert!(!etcd_error.is_auth_failed());
            assert_eq!(etcd_error.class(), FailureClass::Permanent);
        }
        other => panic!("not a permission error: {other:?}"),
    }
    assert!(!error.is_transient(), "a permission error is never retried");
    assert!(took < Duration::from_secs(1), "not retried: {took:?}");
    // acquire_lease_wait does not stand by on it either.
    let started = Instant::now();
    let error = timeout(
        Duration::from_secs(5),
        denied.acquire_lease_wait(Uuid::new_v4(), Duration::from_secs(30)),
    )
    .await
    .expect("refused at once, never stood by")
    .expect_err("denied");
    assert!(matches!(error, AcquireError::Etcd(ref e) if e.is_permission_denied()));
    assert!(started.elapsed() < Duration::from_secs(1));
    // A replay in B: the same typed error.
    let replayed = Box::pin(denied.replay(Uuid::new_v4())).next().await;
    match replayed {
        Some(Err(ReplayError::Etcd(e))) => assert!(e.is_permission_denied(), "{e:?}"),
        other => panic!("not a permission error: {other:?}"),
    }
    denied.close().await;
    store.close().await;
}

/// The user's role stops covering the namespace while the store holds sessions. The owner
/// watch finds out at its next restart (etcd checks a watch's permission when it is created):
/// every lease is lost with a permission reason, the owner keys go with the node lease, and
/// every acquisition fails at once with the permission error.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_whose_role_no_longer_covers_its_namespace_loses_every_lease() {
    let etcd = auth_etcd(&[]).await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let options = alice(&etcd, "A", PASSWORD).with_endpoints([proxy.endpoint()]);
    let store = Store::connect(options).await.expect("alice connects");
    let mut leases = Vec::new();
    for _ in 0..2 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.expect("acquires"));
    }

    // --- phase: the role loses A/, and the watch restarts (its connections are cut)
    let mut root = etcd.raw_client().await.unwrap();
    root.role_revoke_permission(
        "alice",
        "A/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    proxy.cut();
    for lease in &leases {
        let reason = timeout(Duration::from_secs(5), lease.lost())
            .await
            .expect("lost once the watch is refused");
        assert_eq!(reason, LossReason::PermissionDenied);
        assert!(!lease.is_valid());
    }

    // --- phase: acquisitions fail at once, typed and permanent; no standby
    let started = Instant::now();
    match store.acquire_lease(Uuid::new_v4()).await {
        Err(AcquireError::Etcd(error)) => {
            assert!(error.is_permission_denied(), "{error:?}");
            assert_eq!(error.class(), FailureClass::Permanent);
        }
        other => panic!("not the permission error: {other:?}"),
    }
    // A refusal for permission says nothing about space.
    assert!(!*store.nospace_alarm().borrow());
    let waited = timeout(
        Duration::from_secs(5),
        store.acquire_lease_wait(Uuid::new_v4(), Duration::from_secs(30)),
    )
    .await
    .expect("never stood by");
    assert!(
        matches!(&waited, Err(AcquireError::Etcd(e)) if e.is_permission_denied()),
        "{waited:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(!store.is_node_lease_valid(), "no node lease is kept");

    // --- phase: no zombie ownership: the owner keys go with the node lease (revoked, or
    // expired after its TTL of 3 s since it is never renewed again)
    let count = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    timeout(Duration::from_secs(6), async {
        while root
            .get("A/owners/", Some(count.clone()))
            .await
            .unwrap()
            .count()
            > 0
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the owner keys are gone");
    store.close().await;
}

/// `leasehold node` in a namespace outside the user's role: one error line naming the
/// namespace, no restart of the owner watch afterwards (with debug logging, where each
/// restart would show), and the node exits 1 by itself, its last line saying why.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_outside_its_role_says_so_once_and_exits_1() {
    let etcd = auth_etcd(&[]).await;
    let node = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["node", "--session", &Uuid::new_v4().to_string()])
        .args(["--ttl", "3", "--namespace", "B", "--node", "alice-node"])
        .env("LEASEHOLD_ENDPOINTS", etcd.endpoint())
        .env("LEASEHOLD_USER", "alice")
        .env("LEASEHOLD_PASSWORD", PASSWORD)
        .env("LEASEHOLD_LOG", "debug")
        .env("NO_COLOR", "1")
        .env_remove("LEASEHOLD_PASSWORD_FILE")
        .env_remove("LEASEHOLD_CACERT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It stops by itself; a node that stayed up (holding nothing) is killed after 20 s.
    let pid = node.id().to_string();
    let output = tokio::task::spawn_blocking(move || node.wait_with_output());
    let output = match tokio::time::timeout(Duration::from_secs(20), output).await {
        Ok(output) => output.unwrap().unwrap(),
        Err(_) => {
            Command::new("kill").args(["-KILL", &pid]).status().unwrap();
            panic!("the node stayed up in a namespace outside its role");
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("leasehold: "))
        .collect();
    assert_eq!(said.len(), 1, "one line of the tool's own:\n{stderr}");
    assert!(
        said[0].contains("roles do not cover namespace B") && said[0].contains("permission denied"),
        "{}",
        said[0]
    );
    let refused: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("ERROR") && line.contains("owner keys"))
        .collect();
    assert_eq!(refused.len(), 1, "one error line:\n{stderr}");
    assert!(refused[0].contains("namespace=B"), "{}", refused[0]);
    assert!(refused[0].contains("permission denied"), "{}", refused[0]);
    assert!(
        !stderr.contains("owner watch restarting"),
        "the watch was restarted:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_is_refused_with_a_typed_error() {
    let etcd = auth_etcd(&[]).await;
    let started = Instant::now();
    let error = Store::connect(alice(&etcd, "A", "not-the-password"))
        .await
        .expect_err("refused");
    match &error {
        StoreError::Connect(ConnectError::Refused { source, .. }) => {
            assert!(source.is_auth_failed(), "{source:?}");
            assert_eq!(source.class(), FailureClass::Permanent);
        }
        other => panic!("not refused credentials: {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "never retried: {:?}",
        started.elapsed()
    );
    assert!(!format!("{error:?}").contains("not-the-password"));
}

/// Simple tokens that expire 2 s after their last use (checked every second): with 4 s
/// between appends, every append finds its token expired. etcd-client fetches a fresh one and
/// sends the request again; nothing is lost, and the store keeps its lease.
#[tokio::test(flavor = "multi_thread")]
async fn an_expiring_token_never_costs_the_lease() {
    let etcd = auth_etcd(&["--auth-token=simple", "--auth-token-ttl=2"]).await;
    let store = Store::connect(alice(&etcd, "A", PASSWORD))
        .await
        .expect("alice connects");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.expect("acquires");
    let journal = store
        .open_journal(session, Some(&lease))
        .await
        .expect("opens");
    let started = Instant::now();
    let mut appended = 0;
    while started.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_secs(4)).await;
        journal
            .append(format!("after {:?}", started.elapsed()))
            .await
            .expect("an append after the token expired");
        appended += 1;
        assert!(lease.is_valid(), "the lease stays valid");
        assert!(
            timeout(Duration::ZERO, lease.lost()).await.is_err(),
            "no loss"
        );
    }
    assert!(appended >= 3);
    // A standby acquisition on another session, with its own (expired) token: fine too.
    let other = store
        .acquire_lease(Uuid::new_v4())
        .await
        .expect("acquires later");
    // The owner watch, opened long ago with a token that has since expired, still reports.
    let mut raw = etcd.raw_client().await.unwrap();
    raw.delete(lease.owner_key(), None).await.unwrap();
    let reason = timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the watch tells at once");
    assert_eq!(reason, LossReason::Revoked);
    assert!(other.is_valid());
    store.close().await;
}

/// The command on a member with TLS and authentication, with debug logging: neither the
/// password nor the private key appears in anything it prints, `--help` included.
#[tokio::test(flavor = "multi_thread")]
async fn no_secret_reaches_the_commands_output() {
    let certificates = TestCertificates::generate().unwrap();
    let etcd = EtcdNode::builder()
        .tls(certificates.clone())
        .auth(ROOT_PASSWORD)
        .start()
        .await
        .expect("etcd with TLS and authentication starts");
    etcd.add_prefix_user("alice", PASSWORD, "A/").await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key) = certificates.client_pem();
    let ca = write("ca.pem", certificates.ca_pem());
    let cert_path = write("client.pem", cert);
    let key_path = write("client-key.pem", key);
    let password_file = write("password", &format!("{PASSWORD}\n"));
    // The key's base64 lines: none may be printed.
    let key_lines: Vec<&str> = key
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() > 16)
        .collect();
    assert!(!key_lines.is_empty());

    let command = |args: &[&str], password_env: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(args)
            .env("LEASEHOLD_ENDPOINTS", etcd.endpoint())
            .env("LEASEHOLD_CACERT", &ca)
            .env("LEASEHOLD_CERT", &cert_path)
            .env("LEASEHOLD_KEY", &key_path)
            .env("LEASEHOLD_USER", "alice")
            .env("LEASEHOLD_NAMESPACE", "A")
            .env("LEASEHOLD_LOG", "debug")
            .env_remove("LEASEHOLD_PASSWORD")
            .env_remove("LEASEHOLD_PASSWORD_FILE");
        if let Some(password) = password_env {
            command.env("LEASEHOLD_PASSWORD", password);
        }
        command
    };
    let check = |what: &str, output: std::process::Output| -> (i32, String) {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        for secret in [PASSWORD, ROOT_PASSWORD, "wrong-password-55e1"] {
            assert!(!text.contains(secret), "{what} printed a password:\n{text}");
        }
        for line in &key_lines {
            assert!(!text.contains(line), "{what} printed key material:\n{text}");
        }
        (output.status.code().unwrap_or(-1), text)
    };

    for (what, args, password) in [
        ("status (env password)", vec!["status"], Some(PASSWORD)),
        (
            "status (password file)",
            vec!["status", "--password-file", password_file.as_str()],
            None,
        ),
        ("owners", vec!["owners"], Some(PASSWORD)),
        ("owners --json", vec!["owners", "--json"], Some(PASSWORD)),
        ("check", vec!["check"], Some(PASSWORD)),
    ] {
        let output = command(&args, password).output().expect("runs");
        let (code, text) = check(what, output);
        assert_eq!(code, 0, "{what}:\n{text}");
        assert!(text.contains("DEBUG"), "{what} logged at debug:\n{text}");
    }

    // Refusals: a wrong password (exit 2), a namespace outside the role (exit 1).
    let output = command(&["status"], Some("wrong-password-55e1"))
        .output()
        .unwrap();
    let (code, text) = check("a wrong password", output);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("refused the credentials"), "{text}");
    let output = command(&["owners", "--namespace", "B"], Some(PASSWORD))
        .output()
        .unwrap();
    let (code, text) = check("a namespace outside the role", output);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("permission denied"), "{text}");

    // `--help`, with every variable set.
    let output = command(&["--help"], Some(PASSWORD)).output().unwrap();
    let (code, text) = check("--help", output);
    assert_eq!(code, 0);
    assert!(text.contains("--password-file"), "{text}");

    // A node that owns a session for a few seconds, then stops on SIGTERM.
    let session = Uuid::new_v4().to_string();
    let mut node = command(
        &[
            "node",
            "--session",
            &session,
            "--ttl",
            "3",
            "--settle",
            "0s",
        ],
        Some(PASSWORD),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stopped = Command::new("kill")
        .args(["-TERM", &node.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let _ = node.try_wait();
    let output = node.wait_with_output().unwrap();
    let (code, text) = check("node", output);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("acquired session="), "{text}");
}

/// Streams carry the token they were opened with. After the token expired, a cut connection
/// makes the store re-open its keepalive stream and its owner watch: each authenticates
/// afresh, so the lease is kept and the watch still reports.
#[tokio::test(flavor = "multi_thread")]
async fn streams_reopened_after_the_token_expired_authenticate_afresh() {
    let etcd = auth_etcd(&["--auth-token=simple", "--auth-token-ttl=2"]).await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let options = alice(&etcd, "A", PASSWORD).with_endpoints([proxy.endpoint()]);
    let store = Store::connect(options).await.expect("alice connects");
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(store.acquire_lease(Uuid::new_v4()).await.expect("acquires"));
    }
    // Every token of the store expires; then every connection is cut.
    tokio::time::sleep(Duration::from_secs(4)).await;
    proxy.cut();
    // Longer than the node lease's TTL (3 s): the keepalive stream was re-opened.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for lease in &leases {
        assert!(lease.is_valid(), "the lease was kept");
        assert!(timeout(Duration::ZERO, lease.lost()).await.is_err());
    }
    // The re-opened watch reports each delete from outside at once. (A watch that could not
    // be re-opened would be restarted every 2 s, and each restart's snapshot would find the
    // delete within 2 s: three deletes each seen within 400 ms tell the two apart.)
    let mut raw = etcd.raw_client().await.unwrap();
    for lease in &leases {
        tokio::time::sleep(Duration::from_millis(700)).await;
        raw.delete(lease.owner_key(), None).await.unwrap();
        let reason = timeout(Duration::from_millis(400), lease.lost())
            .await
            .expect("the re-opened watch tells at once");
        assert_eq!(reason, LossReason::Revoked);
    }
    store.close().await;
}

/// How many `Authenticate` requests etcd has started.
async fn authentications(etcd: &EtcdNode) -> f64 {
    leasehold::testing::etcd_metric(
        etcd.endpoint(),
        "grpc_server_started_total",
        &["grpc_method=\"Authenticate\""],
    )
    .await
    .unwrap()
    .unwrap_or(0.0)
}

/// Each re-opening of the keepalive stream and the owner watch (here after every connection
/// is cut, ten times) reuses the member's stream token instead of authenticating again:
/// authenticating costs the member a bcrypt hash, and while a member is down openings are
/// hedged every 250 ms by every node at once.
#[tokio::test(flavor = "multi_thread")]
async fn reopened_streams_reuse_their_token_instead_of_authenticating_each_time() {
    let etcd = auth_etcd(&[]).await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let options = alice(&etcd, "A", PASSWORD).with_endpoints([proxy.endpoint()]);
    let store = Store::connect(options).await.expect("alice connects");
    let lease = store.acquire_lease(Uuid::new_v4()).await.expect("acquires");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = authentications(&etcd).await;
    for _ in 0..10 {
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let during = authentications(&etcd).await - before;
    println!("10 cuts: {during} authentications");
    assert!(lease.is_valid(), "the lease was kept");
    assert!(
        during <= 2.0,
        "{during} authentications for 10 re-openings of two streams"
    );
    // The streams still work: the watch reports a delete from outside at once.
    let mut raw = etcd.raw_client().await.unwrap();
    raw.delete(lease.owner_key(), None).await.unwrap();
    let reason = timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("the re-opened watch tells at once");
    assert_eq!(reason, LossReason::Revoked);
    store.close().await;
}

/// How many `Txn` requests etcd has refused for permission.
async fn denied_txns(etcd: &EtcdNode) -> f64 {
    leasehold::testing::etcd_metric(
        etcd.endpoint(),
        "grpc_server_handled_total",
        &["grpc_method=\"Txn\"", "grpc_code=\"PermissionDenied\""],
    )
    .await
    .unwrap()
    .unwrap_or(0.0)
}

/// An append commits and its reply is lost; before the writer hears back, its role stops
/// covering the journal (it keeps the owner keys, so the lease stays). The next re-send is
/// refused for permission, and so is the read that would settle the outcome: the append is
/// reported unknown, never fenced, and the refused read is not tried again, since it would
/// be refused the same way (one refused re-send, one refused read).
#[tokio::test(flavor = "multi_thread")]
async fn a_resolving_read_refused_for_permission_is_not_tried_again() {
    let etcd = auth_etcd(&[]).await;
    let proxy = leasehold::testing::FaultProxy::start(etcd.endpoint())
        .await
        .unwrap();
    let options = alice(&etcd, "A", PASSWORD)
        .with_endpoints([proxy.endpoint()])
        .with_ttl(Duration::from_secs(30), Duration::from_secs(1));
    let store = Store::connect(options).await.expect("alice connects");
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = std::sync::Arc::new(store.open_journal(session, Some(&lease)).await.unwrap());
    let namespace = Namespace::new("A").unwrap();
    let mut root = etcd.raw_client().await.unwrap();

    // --- phase: x commits; its reply is lost; then nothing reaches etcd
    proxy.drop_replies();
    let pending = tokio::spawn({
        let journal = journal.clone();
        async move { journal.append("x").await }
    });
    let record = namespace.record_key(session, 2);
    leasehold::testing::wait_for("x to commit", Duration::from_secs(5), || {
        let mut root = root.clone();
        let record = record.clone();
        async move { (root.get(record, None).await.unwrap().count() == 1).then_some(()) }
    })
    .await
    .unwrap();
    proxy.blackhole();

    // --- phase: the role keeps the owner keys but loses the journals
    let prefix = Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix());
    root.role_revoke_permission("alice", "A/", prefix)
        .await
        .unwrap();
    let owners = etcd_client::Permission::read_write(namespace.owners_prefix()).with_prefix();
    root.role_grant_permission("alice", owners).await.unwrap();
    let before = denied_txns(&etcd).await;

    // --- phase: the writer hears back
    proxy.cut();
    proxy.heal();
    let error = timeout(Duration::from_secs(20), pending)
        .await
        .expect("the append ends")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(error, leasehold::JournalWriteError::OutcomeUnknown(_)),
        "unknown, never fenced: {error:?}"
    );
    let denied = denied_txns(&etcd).await - before;
    assert_eq!(denied, 2.0, "one refused re-send and one refused read");
    assert!(lease.is_valid(), "the owner key is still ours");
    store.close().await;
}
