//! Python clients of a real `leasehold serve` over a real etcd (tests/python/sidecar_test.py):
//! a race, a SIGKILLed holder taken over within 2 s behind a fence, a stale epoch refused, a
//! SIGSTOPped client losing its session by keepalive, a retry landing once, health, and a call
//! built from server reflection alone.
//!
//! The Python side needs grpcio and friends (tests/python/requirements.txt): `deploy/dev.sh
//! test` installs them into `~/.cache/leasehold/venv`; `LEASEHOLD_PYTHON` names another
//! interpreter. Without one, the test fails: it is never skipped.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("LEASEHOLD_PYTHON") {
        return python.into();
    }
    let home = std::env::var_os("HOME").expect("HOME is set");
    let venv = PathBuf::from(home).join(".cache/leasehold/venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with grpcio at {}: run ./deploy/dev.sh test (it creates that virtual \
         environment from tests/python/requirements.txt), or set LEASEHOLD_PYTHON",
        venv.display()
    );
    venv
}

/// Runs `tests/python/{script}` with `args` (within `within` seconds), printing what it said;
/// fails unless it exits 0 having said that every check held.
async fn run_python(python: &PathBuf, script: &str, args: &[&str], within: u64) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/python")
        .join(script);
    let run = tokio::time::timeout(
        Duration::from_secs(within),
        tokio::process::Command::new(python)
            .arg(&script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} ends within {within} s", script.display()))
    .expect("python runs");
    println!("{}", String::from_utf8_lossy(&run.stdout));
    eprintln!("{}", String::from_utf8_lossy(&run.stderr));
    assert!(
        run.status.success(),
        "the Python test failed: {:?}",
        run.status
    );
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(said.contains(r#""check": "all""#), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn python_clients_race_die_freeze_and_retry_through_leasehold_serve() {
    let python = python();
    let etcd = common::Etcd::start().await;
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args(["--node", "sidecar-1", "--ttl", "5"])
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--client-keepalive",
            "1s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("leasehold serve starts");
    let mut stdout = BufReader::new(serve.stdout.take().unwrap()).lines();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            println!("serve: {line}");
            if let Some(rest) = line.split("serving leasehold.v1.Leasehold on ").nth(1) {
                return rest.split(',').next().unwrap().to_owned();
            }
        }
        panic!("leasehold serve ended before it served")
    })
    .await
    .expect("serving within 30 s");
    let stderr = tokio::spawn({
        let mut lines = BufReader::new(serve.stderr.take().unwrap()).lines();
        async move {
            let mut all = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                all.push(line);
            }
            all
        }
    });

    run_python(&python, "sidecar_test.py", &[address.as_str()], 180).await;

    // --- SIGTERM: every stream's sessions released, then the store closed; exit 0
    let pid = serve.id().expect("running") as i32;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), serve.wait())
        .await
        .expect("stopped within 30 s of SIGTERM")
        .unwrap();
    while let Ok(Some(line)) = stdout.next_line().await {
        println!("serve: {line}");
    }
    let logs = stderr.await.unwrap();
    for line in &logs {
        eprintln!("serve: {line}");
    }
    assert!(exit.success(), "{exit:?}");
    for said in ["attached", "acquired", "detached"] {
        assert!(
            logs.iter().any(|line| line.contains(said)),
            "a log line per {said}"
        );
    }
}

/// `leasehold serve --listen unix:PATH`: served on a Unix socket (a stale socket file there is
/// replaced), and the file removed on SIGTERM.
#[tokio::test(flavor = "multi_thread")]
async fn leasehold_serve_listens_on_a_unix_socket() {
    let python = python();
    let etcd = common::Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("leasehold.sock");
    // A socket file left behind by an earlier run.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let listen = format!("unix:{}", socket.display());
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", etcd.node.endpoint()])
        .args(["--namespace", etcd.ns.as_str()])
        .args(["serve", "--listen", &listen])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(serve.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            if line.contains(&format!("serving leasehold.v1.Leasehold on {listen}")) {
                return;
            }
        }
        panic!("leasehold serve ended before it served")
    })
    .await
    .expect("serving within 30 s");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/sidecar_test.py"
    );
    let run = tokio::process::Command::new(&python)
        .args([script, "one-call", &listen])
        .output()
        .await
        .unwrap();
    println!("{}", String::from_utf8_lossy(&run.stdout));
    eprintln!("{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{:?}", run.status);
    std::process::Command::new("kill")
        .args(["-TERM", &serve.id().unwrap().to_string()])
        .status()
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), serve.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert!(!socket.exists(), "the socket file is removed on shutdown");
}

/// The sidecar's guarantees for every client (tests/python/guarantees_test.py), through a
/// Python client that builds every message from server reflection: nobody but the holder
/// writes; a retry after 1,200 other request ids, after a SIGKILL and restart of its sidecar,
/// on another sidecar, after a release and 1,200 junk ids, is answered from the journal, once;
/// a 1 MiB request id is refused without growing the sidecar, and streams, sessions per stream
/// and replays are bounded by their flags.
#[tokio::test(flavor = "multi_thread")]
async fn the_sidecars_guarantees_hold_for_a_client_that_knows_only_reflection() {
    let python = python();
    let etcd = common::Etcd::start().await;
    let args = [
        env!("CARGO_BIN_EXE_leasehold"),
        etcd.node.endpoint(),
        etcd.ns.as_str(),
    ];
    run_python(&python, "guarantees_test.py", &args, 240).await;
}
