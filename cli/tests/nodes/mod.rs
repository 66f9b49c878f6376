//! `leasehold node` processes as the tool's tests run them, and what is read back from their
//! lines and from the owner keys.

#![allow(dead_code, reason = "each test binary uses a part")]

use std::collections::{HashMap, HashSet};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::testing::{AppendHistory, wait_for};
use leasehold::{Appended, Namespace, Record, Uuid};
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// `leasehold {args} --json` on `endpoint` in `namespace`, run to its end: its output, parsed
/// (it must exit 0 within 30 s).
pub(crate) async fn tool_json(
    endpoint: &str,
    namespace: &Namespace,
    args: &[&str],
) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["--endpoints", endpoint, "--namespace", namespace.as_str()])
        .args(args)
        .arg("--json")
        .env("LEASEHOLD_NO_VERSION_WARNING", "true")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .unwrap_or_else(|_| panic!("leasehold {args:?} ended"))
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "leasehold {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// One `leasehold node` process, with every line it printed so far and when each arrived.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    reader: JoinHandle<()>,
}

impl Node {
    /// `leasehold node --sessions {sessions} --print-appends` on `endpoint`, named `name`,
    /// with `args` besides.
    pub(crate) fn spawn(
        endpoint: &str,
        namespace: &Namespace,
        name: &'static str,
        sessions: usize,
        args: &[&str],
    ) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "node",
                "--sessions",
                &sessions.to_string(),
                "--endpoints",
                endpoint,
                "--namespace",
                namespace.as_str(),
                "--node",
                name,
                "--print-appends",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let reader = tokio::spawn({
            let lines = lines.clone();
            async move {
                let mut reader = tokio::io::BufReader::new(stdout).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    lines.lock().unwrap().push((Instant::now(), line));
                }
            }
        });
        Self {
            name,
            child,
            lines,
            reader,
        }
    }

    /// The lines printed so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        lines.iter().map(|(_, line)| line.clone()).collect()
    }

    /// The lines printed so far, each with when it arrived.
    pub(crate) fn timed_lines(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap().clone()
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        let pid = self.child.id().expect("the node runs");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// Waits for the process to exit and for the last of its output.
    pub(crate) async fn exited(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("node {} exits", self.name))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), &mut self.reader)
            .await
            .expect("its stdout closes")
            .unwrap();
        status
    }
}

/// The value of `key=value` in a line.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// One heartbeat a node reported: (session, epoch, seq, payload). `seq` is `None` for a
/// heartbeat whose append failed (its outcome unknown to the test).
pub(crate) type Beat = (Uuid, i64, Option<u64>, String);

/// The heartbeats in a node's lines, in the order printed: `appended session=… epoch=… seq=…
/// beat=…` and `heartbeat session=… epoch=… beat=… failed: …`.
pub(crate) fn beats(node: &str, lines: &[String]) -> Vec<Beat> {
    let parse = |line: &str, seq: Option<u64>| {
        let get = |key| field(line, key).unwrap_or_else(|| panic!("no {key} in {line:?}"));
        let (epoch, beat) = (get("epoch"), get("beat"));
        (
            get("session").parse().unwrap(),
            epoch.parse().unwrap(),
            seq,
            format!("heartbeat {node} epoch={epoch} beat={beat}"),
        )
    };
    lines
        .iter()
        .filter_map(|line| {
            if line.contains(&format!("] {node} appended session=")) {
                let seq = field(line, "seq").unwrap().parse().unwrap();
                Some(parse(line, Some(seq)))
            } else if line.contains(&format!("] {node} heartbeat session=")) {
                Some(parse(line, None))
            } else {
                None
            }
        })
        .collect()
}

/// What the nodes were told about a session's heartbeats: the history for the checker, and
/// where each acknowledged one landed (seq → payload).
#[derive(Default)]
pub(crate) struct Told {
    pub(crate) history: AppendHistory,
    pub(crate) landed: Vec<(u64, String)>,
}

/// What the nodes (each name with its lines, of every run) were told about each heartbeat,
/// per session.
pub(crate) fn told<'a>(
    runs: impl IntoIterator<Item = (&'a str, Vec<String>)>,
) -> HashMap<Uuid, Told> {
    let mut told: HashMap<Uuid, Told> = HashMap::new();
    for (name, lines) in runs {
        for (session, _, seq, payload) in beats(name, &lines) {
            let told = told.entry(session).or_default();
            match seq {
                Some(seq) => {
                    let appended = Appended {
                        first_seq: seq,
                        last_seq: seq,
                        revision: 0,
                    };
                    told.history.record(&[&payload], &Ok(appended));
                    told.landed.push((seq, payload));
                }
                None => told.history.record_unknown(&[&payload]),
            }
        }
    }
    told
}

/// Checks `session`'s journal against what its nodes were told (`told`): one sound chain (the
/// checker's verdict, which panics on a violation) holding every acknowledged heartbeat at the
/// sequence number its node was told. The checker's report.
pub(crate) async fn check_told(
    store: &leasehold::Store,
    session: Uuid,
    told: &Told,
) -> leasehold::testing::JournalReport {
    let report = leasehold::testing::check_journal(store, session, &told.history)
        .await
        .unwrap_or_else(|violation| panic!("{violation}"));
    let events = events(store, session).await;
    for (seq, payload) in &told.landed {
        assert_eq!(
            events.get(seq),
            Some(payload),
            "session {session}: {payload:?} was acknowledged at seq {seq}"
        );
    }
    report
}

/// seq → payload of every event in a session's journal.
pub(crate) async fn events(store: &leasehold::Store, session: Uuid) -> HashMap<u64, String> {
    let mut events = HashMap::new();
    let mut replay = store.replay_records(session);
    while let Some(record) = replay.next().await {
        if let Record::Event(event) = record.expect("the journal replays") {
            events.insert(
                event.seq,
                String::from_utf8_lossy(&event.payload).into_owned(),
            );
        }
    }
    events
}

/// The (session, epoch) of every heartbeat acknowledged in these lines.
pub(crate) fn acknowledged<'a>(
    runs: impl IntoIterator<Item = (&'a str, Vec<String>)>,
) -> HashSet<(Uuid, i64)> {
    runs.into_iter()
        .flat_map(|(name, lines)| beats(name, &lines))
        .filter(|(_, _, seq, _)| seq.is_some())
        .map(|(session, epoch, _, _)| (session, epoch))
        .collect()
}

/// (session, owning node, epoch) of every owner key.
pub(crate) async fn owner_keys(
    raw: &etcd_client::Client,
    namespace: &Namespace,
) -> Vec<(Uuid, String, i64)> {
    let response = raw
        .clone()
        .get(
            namespace.owners_prefix(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| {
            let key = std::str::from_utf8(kv.key()).unwrap();
            let session = key.rsplit('/').next().unwrap().parse().unwrap();
            // leasehold-owner/1 {store} {nonce} {node}
            let value = std::str::from_utf8(kv.value()).unwrap();
            let node = value.splitn(4, ' ').nth(3).unwrap().to_owned();
            (session, node, kv.create_revision())
        })
        .collect()
}

/// session → owning node, read from the owner keys themselves.
pub(crate) async fn owners(
    raw: &etcd_client::Client,
    namespace: &Namespace,
) -> HashMap<Uuid, String> {
    owner_keys(raw, namespace)
        .await
        .into_iter()
        .map(|(session, node, _)| (session, node))
        .collect()
}

/// Waits until all `sessions` are owned and `accept` takes the owners; returns them.
pub(crate) async fn wait_until_owned(
    raw: &etcd_client::Client,
    ns: &Namespace,
    sessions: usize,
    what: &str,
    timeout: Duration,
    accept: impl Fn(&HashMap<Uuid, String>) -> bool,
) -> HashMap<Uuid, String> {
    wait_for(what, timeout, || async {
        let owners = owners(raw, ns).await;
        (owners.len() == sessions && accept(&owners)).then_some(owners)
    })
    .await
    .unwrap()
}

/// How many of `owners` `node` owns.
pub(crate) fn count(owners: &HashMap<Uuid, String>, node: &str) -> usize {
    owners.values().filter(|owner| *owner == node).count()
}
