//! The router example (examples/router.rs) as three processes on one etcd: a request that
//! reaches a node not owning its session is forwarded to the owner and answered by it, once
//! (a forwarded request is never forwarded again); after the owner is killed, the session's
//! requests are answered by its new owner within TTL + 1 s, and its journal goes on after the
//! records the old owner appended.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use leasehold::Uuid;
use leasehold::testing::wait_for;
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};
use tokio::time::Instant;

const SESSIONS: u128 = 30;
/// The node lease's TTL, in seconds.
const TTL: u64 = 3;
/// How often the test asks for the killed node's session.
const POLL: Duration = Duration::from_millis(100);

type Http = Client<HttpConnector, Full<Bytes>>;

/// One router process. Killed when dropped, whatever way the test ends.
struct Node {
    name: &'static str,
    /// The address it serves and advertises.
    addr: String,
    child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl Node {
    /// Starts a router on a free port and waits for its `listening on ADDR as NAME` line.
    async fn start(binary: &Path, etcd: &common::Etcd, name: &'static str) -> Self {
        let mut child = Command::new(binary)
            .args(["--endpoints", etcd.node.endpoint()])
            .args(["--namespace", etcd.ns.as_str(), "--node", name])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--sessions",
                &SESSIONS.to_string(),
            ])
            .args(["--ttl", &TTL.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the router example starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("router {name} is listening within 30 s"))
            .unwrap()
            .unwrap_or_else(|| panic!("router {name} exited before listening"));
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|rest| rest.strip_suffix(&format!(" as {name}")))
            .unwrap_or_else(|| panic!("not a listening line: {line:?}"))
            .to_owned();
        // Whatever else it prints is read, so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { name, addr, child }
    }
}

/// The router example, built now: `cargo test --test router_example` builds no examples, and
/// one left by an earlier build would be old code. Cargo puts it beside this test's directory:
/// tests run from `target/{profile}/deps/`, examples go to `target/{profile}/examples/`.
async fn router_example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/{profile}");
    let profile = match dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") => "dev",
        Some(profile) => profile,
        None => panic!("no profile directory above {}", exe.display()),
    };
    let mut cargo = Command::new(env!("CARGO"));
    // Without the variables cargo set for this test: some build scripts (ring's) run again when
    // one changes, and all that depends on them would be compiled again.
    let set_by_cargo = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_CRATE_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "OUT_DIR",
    ];
    for (name, _) in std::env::vars() {
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || set_by_cargo.contains(&name.as_str())
        {
            cargo.env_remove(name);
        }
    }
    let built = cargo
        .args([
            "build",
            "--all-features",
            "--example",
            "router",
            "--profile",
            profile,
        ])
        .args([
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ])
        .output()
        .await
        .expect("cargo runs");
    assert!(
        built.status.success(),
        "the router example does not build:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let binary = dir
        .join("examples")
        .join(format!("router{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the router example is not at {} after building it",
        binary.display()
    );
    binary
}

/// A request to `addr`: its status, its `Retry-After` and its body.
async fn request(
    http: &Http,
    method: Method,
    addr: &str,
    path: &str,
    forwarded_by: Option<&str>,
    body: &str,
) -> (StatusCode, Option<String>, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if let Some(node) = forwarded_by {
        request = request.header("x-leasehold-forwarded", node);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), async {
        let response = http.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        (parts, body.collect().await.unwrap().to_bytes())
    })
    .await
    .unwrap_or_else(|_| panic!("{addr}{path} answers within 10 s"));
    let (parts, body) = response;
    let retry_after = parts.headers.get("retry-after");
    (
        parts.status,
        retry_after.map(|value| value.to_str().unwrap().to_owned()),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// An append to `session` sent to `addr`, answered 200: (node, epoch, seq) of the answer.
async fn append(http: &Http, addr: &str, session: Uuid, body: &str) -> (String, u64, u64) {
    let path = format!("/sessions/{session}");
    let (status, _, answer) = request(http, Method::POST, addr, &path, None, body).await;
    assert_eq!(status, StatusCode::OK, "{addr}{path}: {answer}");
    answered(&answer, session)
}

/// (node, epoch, seq) of a 200 answer to an append to `session`.
fn answered(answer: &str, session: Uuid) -> (String, u64, u64) {
    let json: Value = serde_json::from_str(answer).unwrap();
    assert_eq!(json["session"], session.to_string(), "{answer}");
    let number = |key: &str| {
        json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {answer}"))
    };
    let node = json["node"].as_str().unwrap().to_owned();
    (node, number("epoch"), number("seq"))
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_are_answered_by_the_owner_and_by_a_killed_owners_successor_within_ttl_and_1s() {
    let (binary, etcd) = tokio::join!(router_example(), common::Etcd::start());
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        nodes.push(Node::start(&binary, &etcd, name).await);
    }
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    let sessions: Vec<Uuid> = (1..=SESSIONS).map(Uuid::from_u128).collect();

    // --- balanced: every session owned, ten by each node, as node a's directory tells
    let owners: HashMap<Uuid, (String, u64)> = wait_for(
        "every session owned by a live host, ten by each node",
        Duration::from_secs(30),
        || async {
            let mut owners = HashMap::new();
            for &session in &sessions {
                let path = format!("/sessions/{session}/owner");
                let (status, _, body) =
                    request(&http, Method::GET, &nodes[0].addr, &path, None, "").await;
                if status != StatusCode::OK {
                    return None;
                }
                let json: Value = serde_json::from_str(&body).unwrap();
                let node = json["node"].as_str().unwrap().to_owned();
                let advertise = nodes.iter().find(|n| n.name == node).unwrap().addr.clone();
                assert_eq!(json["advertise"], format!("http://{advertise}"), "{body}");
                if json["host_alive"] != true {
                    return None;
                }
                owners.insert(session, (node, json["epoch"].as_u64().unwrap()));
            }
            let held = |name: &str| owners.values().filter(|(n, _)| n == name).count();
            (held("a") == 10 && held("b") == 10 && held("c") == 10).then_some(owners)
        },
    )
    .await
    .unwrap();
    let owned_by = |name: &str| {
        let (session, (_, epoch)) = owners.iter().find(|(_, (n, _))| n == name).unwrap();
        (*session, *epoch)
    };
    let ((of_a, _), (of_b, epoch_of_b)) = (owned_by("a"), owned_by("b"));

    // --- forwarded: b's session through a and through c is answered by b, at b's epoch
    let mut seqs = Vec::new();
    for (i, via) in [0, 2, 0].into_iter().enumerate() {
        let body = format!("before the kill {i}");
        let (node, epoch, seq) = append(&http, &nodes[via].addr, of_b, &body).await;
        assert_eq!(
            (node.as_str(), epoch),
            ("b", epoch_of_b),
            "via {}",
            nodes[via].name
        );
        seqs.push(seq);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    println!("b's session {of_b}, sent to a and c, was answered by b: seqs {seqs:?}");
    // a's own session is answered by a.
    assert_eq!(append(&http, &nodes[0].addr, of_a, "own").await.0, "a");
    // A request forwarded once already is not forwarded again: a does not own b's session.
    let path = format!("/sessions/{of_b}");
    let (status, retry_after, body) = request(
        &http,
        Method::POST,
        &nodes[0].addr,
        &path,
        Some("c"),
        "again",
    )
    .await;
    assert_eq!(
        (status, retry_after.as_deref()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("1")),
        "{body}"
    );

    // --- b killed: its session is answered by its new owner within TTL + 1 s
    //
    // b renewed its node lease at most TTL/3 before the kill, so the lease expires at most TTL
    // after it (etcd looks for expired leases every 500 ms); etcd then deletes b's owner keys
    // and host key in one revision, the survivors' shares grow, a standby (on a or c) acquires
    // the session and opens its journal, and a's directory learns the new owner. The 1 s is for
    // those steps. The slowest of them is a host that finds its share grown only at its next
    // balance tick (every TTL/3): the sessions it takes then are answered about TTL + 1 s after
    // the kill. The one allowance is the poll: an answer possible at one instant is asked for
    // up to one POLL later.
    let bound = Duration::from_secs(TTL + 1) + POLL;
    let killed = Instant::now();
    nodes[1].child.kill().await.unwrap();
    let mut refused = 0;
    // The last time a still tried b (its directory still named b, alive): before b's lease
    // ended, as a sees it.
    let mut tried_b = Duration::ZERO;
    let mut polls = tokio::time::interval(POLL);
    let (node, epoch, seq, took) = loop {
        polls.tick().await;
        let waited = killed.elapsed();
        assert!(
            waited < bound + Duration::from_secs(10),
            "no answer for b's session {waited:?} after the kill ({refused} refusals)"
        );
        let (status, retry_after, body) = request(
            &http,
            Method::POST,
            &nodes[0].addr,
            &path,
            None,
            "after the kill",
        )
        .await;
        match status {
            StatusCode::OK => {
                let (node, epoch, seq) = answered(&body, of_b);
                break (node, epoch, seq, killed.elapsed());
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
                refused += 1;
                if body.contains("forwarding to \"b\"") {
                    tried_b = waited;
                }
            }
            other => panic!("{other}: {body}"),
        }
    };
    println!(
        "b killed: its session answered by {node} at epoch {epoch}, seq {seq}, {took:?} after \
         the kill (bound {bound:?}); a tried b until {tried_b:?}, {refused} requests answered \
         503 meanwhile"
    );
    assert!(node == "a" || node == "c", "answered by {node}");
    assert!(
        took <= bound,
        "answered {took:?} after the kill, over TTL + 1 s (+ {POLL:?})"
    );

    // --- the journal goes on: the new owner appends after the old owner's records
    assert!(epoch > epoch_of_b, "epoch {epoch} after {epoch_of_b}");
    assert!(seq > *seqs.last().unwrap(), "seq {seq} after {seqs:?}");

    // --- the survivors shut down cleanly on SIGTERM
    for survivor in [0, 2] {
        let node = &mut nodes[survivor];
        let status = common::terminate(&mut node.child, Duration::from_secs(20)).await;
        assert!(
            status.success(),
            "router {} exited with {status}",
            node.name
        );
    }
}
