//! TLS: with the right CA and a client certificate, leasehold works end to end over
//! `https://`; a wrong CA, and a client certificate the member refuses (expired, missing, or
//! from another CA), are refused with typed TLS errors, by the library and by the `leasehold`
//! command (exit code 3, one line saying the handshake was refused); `--tls-server-name`
//! checks the member's certificate against a name of its own.

use std::process::Command;
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::testing::{EtcdNode, TestCertificates, random_namespace};
use leasehold::{
    ConnectError, ConnectOptions, Connection, FailureClass, LossReason, RetryPolicy, Store,
    StoreError, TlsOptions, Uuid,
};
use tokio::time::timeout;

async fn tls_etcd() -> (EtcdNode, TestCertificates) {
    let certificates = TestCertificates::generate().expect("certificates");
    let etcd = EtcdNode::builder()
        .tls(certificates.clone())
        .start()
        .await
        .expect("a TLS etcd starts");
    assert!(
        etcd.endpoint().starts_with("https://"),
        "{}",
        etcd.endpoint()
    );
    (etcd, certificates)
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_right_ca_everything_works_over_tls() {
    let (etcd, _) = tls_etcd().await;
    let ns = random_namespace();
    // TTL 3 s: renewals every second, over the keepalive stream (TLS too).
    let options = etcd
        .store_options(&ns, "a")
        .with_ttl(Duration::from_secs(3), Duration::from_millis(500));
    let store = Store::connect(options).await.expect("connects over TLS");

    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.expect("acquires");
    let journal = store
        .open_journal(session, Some(&lease))
        .await
        .expect("opens");
    for i in 0..5 {
        journal.append(format!("event {i}")).await.expect("appends");
    }
    let events: Vec<_> = store
        .replay(session)
        .map(|event| String::from_utf8(event.expect("replays").payload).unwrap())
        .collect()
        .await;
    assert_eq!(
        events,
        (0..5).map(|i| format!("event {i}")).collect::<Vec<_>>()
    );

    // Past the node lease's TTL: the keepalive stream renews it.
    let more: Vec<_> = [
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
        store.acquire_lease(Uuid::new_v4()).await.unwrap(),
    ]
    .into();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(lease.is_valid(), "renewed over TLS");

    // The owner watch runs over TLS too: each delete from outside is a loss at once. (A watch
    // that cannot open is restarted every 2 s at most and its snapshot finds the delete: three
    // deletes each seen within 400 ms tell the two apart.)
    let mut raw = etcd.raw_client().await.expect("raw client over TLS");
    for lease in std::iter::once(&lease).chain(&more) {
        tokio::time::sleep(Duration::from_millis(700)).await;
        raw.delete(lease.owner_key(), None).await.unwrap();
        let reason = timeout(Duration::from_millis(400), lease.lost())
            .await
            .expect("the watch tells at once");
        assert_eq!(reason, LossReason::Revoked);
    }
    store.close().await;
}

/// Options that give up quickly: a refused handshake is retried until the deadline.
fn quick(tls: TlsOptions, etcd: &EtcdNode) -> leasehold::StoreOptions {
    let mut options = etcd.store_options(&random_namespace(), "a").with_tls(tls);
    options.retry = RetryPolicy::default().with_deadline(Duration::from_secs(2));
    options
}

/// A refused handshake: `ConnectError::Tls` (exit code 3 from the command), a TLS failure
/// (`is_tls`) that sent nothing. `client_certificate`: the member refused the client's
/// certificate, rather than the client the member's.
fn refused_by_tls(result: Result<Store, StoreError>, what: &str, client_certificate: bool) {
    match result {
        Err(StoreError::Connect(ConnectError::Tls { source, .. })) => {
            println!("{what}: {source:?}");
            assert!(source.is_tls(), "{what}: {source:?}");
            assert_eq!(
                source.is_client_certificate_refused(),
                client_certificate,
                "{what}: {source:?}"
            );
            assert!(!source.is_auth_failed() && !source.is_permission_denied());
            assert_eq!(source.class(), FailureClass::NotSent, "{what}: {source:?}");
        }
        Err(other) => panic!("{what}: another error: {other:?}"),
        Ok(_) => panic!("{what}: connected"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_ca_an_expired_and_a_missing_client_certificate_are_refused() {
    let (etcd, certificates) = tls_etcd().await;
    let (cert, key) = certificates.client_pem();

    // A CA that did not sign the member's certificate.
    let other = TestCertificates::generate().unwrap();
    let wrong_ca = TlsOptions::new(other.ca_pem()).with_client_identity(cert, key);
    refused_by_tls(
        Store::connect(quick(wrong_ca, &etcd)).await,
        "a wrong CA",
        false,
    );

    // The member refuses the client certificate: expired, missing, or signed by another CA.
    let (expired, expired_key) = certificates.expired_client_certificate().unwrap();
    let (foreign, foreign_key) = other.client_pem();
    let refusals = [
        (
            "an expired client certificate",
            TlsOptions::new(certificates.ca_pem()).with_client_identity(expired, expired_key),
        ),
        (
            "a missing client certificate",
            TlsOptions::new(certificates.ca_pem()),
        ),
        (
            "a client certificate from another CA",
            TlsOptions::new(certificates.ca_pem()).with_client_identity(foreign, foreign_key),
        ),
    ];
    for (what, tls) in &refusals {
        refused_by_tls(Store::connect(quick(tls.clone(), &etcd)).await, what, true);
        // TLS 1.3 tells the client after its half of the handshake, and a request may meet
        // the closed connection before the alert: either way, every attempt is a typed
        // refusal. One attempt each (a long backoff), many times.
        for _ in 0..8 {
            let options = ConnectOptions::new([etcd.endpoint()])
                .with_tls(tls.clone())
                .with_retry(
                    RetryPolicy::default()
                        .with_deadline(Duration::from_secs(2))
                        .with_backoff(Duration::from_secs(10), Duration::from_secs(10)),
                );
            match Connection::connect(options).await {
                Err(ConnectError::Tls { source, .. }) => {
                    assert!(source.is_client_certificate_refused(), "{what}: {source:?}");
                    assert_eq!(source.class(), FailureClass::NotSent, "{what}: {source:?}");
                }
                other => panic!("{what}: not a refused handshake: {other:?}"),
            }
        }
    }

    // The command says the same with exit code 3, for `status` and `owners`.
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let ca = write("ca.pem", certificates.ca_pem());
    let wrong_ca = write("wrong-ca.pem", other.ca_pem());
    let cert = write("client.pem", cert);
    let key = write("client-key.pem", key);
    let (expired, expired_key) = certificates.expired_client_certificate().unwrap();
    let expired = write("expired.pem", &expired);
    let expired_key = write("expired-key.pem", &expired_key);
    let (foreign, foreign_key) = other.client_pem();
    let foreign = write("foreign.pem", foreign);
    let foreign_key = write("foreign-key.pem", foreign_key);
    let leasehold = |command: &str, flags: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg(command)
            .args(["--endpoints", etcd.endpoint(), "--connect-timeout", "2"])
            .args(flags)
            .env_remove("LEASEHOLD_ENDPOINTS")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code().unwrap_or(-1), stderr)
    };
    for command in ["status", "owners"] {
        let (code, stderr) = leasehold(command, &["--cacert", &ca, "--cert", &cert, "--key", &key]);
        assert_eq!(code, 0, "{command} with the right CA: {stderr}");
        for (what, flags, client_certificate) in [
            (
                "a wrong CA",
                vec!["--cacert", &wrong_ca, "--cert", &cert, "--key", &key],
                false,
            ),
            (
                "an expired client certificate",
                vec!["--cacert", &ca, "--cert", &expired, "--key", &expired_key],
                true,
            ),
            ("a missing client certificate", vec!["--cacert", &ca], true),
            (
                "a client certificate from another CA",
                vec!["--cacert", &ca, "--cert", &foreign, "--key", &foreign_key],
                true,
            ),
        ] {
            // Several runs: each must tell the refusal, however the connection ended.
            for _ in 0..3 {
                let (code, stderr) = leasehold(command, &flags);
                assert_eq!(code, 3, "{command} with {what}: {stderr}");
                assert_eq!(stderr.lines().count(), 1, "{stderr}");
                assert!(
                    stderr.contains("TLS handshake"),
                    "{command} with {what}: {stderr}"
                );
                assert_eq!(
                    stderr.contains("refused the TLS handshake: the client certificate"),
                    client_certificate,
                    "{command} with {what}: {stderr}"
                );
                println!("{command} with {what}: {stderr}");
            }
        }
    }
}

/// `--tls-server-name` (or `LEASEHOLD_TLS_SERVER_NAME`): an endpoint given by an address that
/// the member's certificate does not name is refused, unless the certificate is checked
/// against a name it does hold.
#[tokio::test(flavor = "multi_thread")]
async fn the_tls_server_name_flag_checks_the_certificate_against_the_name_given() {
    let (etcd, certificates) = tls_etcd().await;
    // 127.0.0.2 is a loopback address too, and Docker publishes the member's port on every
    // address; the member's certificate names only localhost, 127.0.0.1 and ::1.
    let (_, port) = etcd.endpoint().rsplit_once(':').unwrap();
    let endpoint = format!("https://127.0.0.2:{port}");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (cert, key) = certificates.client_pem();
    let ca = write("ca.pem", certificates.ca_pem());
    let cert = write("client.pem", cert);
    let key = write("client-key.pem", key);
    let leasehold = |command: &str, flags: &[&str], name_env: Option<&str>| {
        let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        run.arg(command)
            .args(["--endpoints", &endpoint, "--connect-timeout", "2"])
            .args(["--cacert", &ca, "--cert", &cert, "--key", &key])
            .args(flags)
            .env_remove("LEASEHOLD_ENDPOINTS")
            .env_remove("LEASEHOLD_TLS_SERVER_NAME");
        if let Some(name) = name_env {
            run.env("LEASEHOLD_TLS_SERVER_NAME", name);
        }
        let output = run.output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code().unwrap_or(-1), stderr)
    };
    for command in ["status", "owners"] {
        // By address: the certificate does not name 127.0.0.2.
        let (code, stderr) = leasehold(command, &[], None);
        println!("{command} by address: {stderr}");
        assert_eq!(code, 3, "{command} by address: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("TLS handshake"), "{stderr}");
        // Checked against a name the certificate holds: it works, by flag and by variable.
        let (code, stderr) = leasehold(command, &["--tls-server-name", "localhost"], None);
        assert_eq!(code, 0, "{command} --tls-server-name localhost: {stderr}");
        let (code, stderr) = leasehold(command, &[], Some("localhost"));
        assert_eq!(
            code, 0,
            "{command} LEASEHOLD_TLS_SERVER_NAME=localhost: {stderr}"
        );
        // A name the certificate does not hold: refused like the address.
        let (code, stderr) = leasehold(command, &["--tls-server-name", "etcd.example"], None);
        assert_eq!(
            code, 3,
            "{command} --tls-server-name etcd.example: {stderr}"
        );
        assert!(stderr.contains("TLS handshake"), "{stderr}");
    }
    // Not a name at all: bad input.
    let (code, stderr) = leasehold("status", &["--tls-server-name", "not a name"], None);
    assert_eq!(code, 2, "{stderr}");
    // Only with TLS.
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "status",
            "--endpoints",
            &endpoint,
            "--tls-server-name",
            "localhost",
        ])
        .env_remove("LEASEHOLD_CACERT")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}
