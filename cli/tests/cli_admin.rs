//! The operator's commands against a real etcd: `owners`, `journal show|trim|delete`,
//! `revoke`, `check`; their `--json` parsed back, their exit codes (0 ok, 1 failure or
//! violation, 2 bad input, 3 etcd unreachable) and their error paths.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime};

use leasehold::testing::FaultProxy;
use leasehold::{LossReason, Namespace, Uuid};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

fn command(endpoint: &str, ns: &Namespace, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(["--endpoints", endpoint, "--namespace", ns.as_str()])
        .args(args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        // The test's etcd is older than the production minimum, knowingly.
        .env("LEASEHOLD_NO_VERSION_WARNING", "true")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the tool to its end: (exit code, stdout, stderr).
async fn run(endpoint: &str, ns: &Namespace, args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = tokio::time::timeout(
        Duration::from_secs(30),
        command(endpoint, ns, args).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("leasehold {args:?} ended"))
    .expect("runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Runs the tool, expects exit 0, and parses its stdout as JSON.
async fn json(endpoint: &str, ns: &Namespace, args: &[&str]) -> Value {
    let (code, stdout, stderr) = run(endpoint, ns, args).await;
    assert_eq!(code, 0, "{args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

/// Runs the tool, expects exit 0, and parses each line of its stdout as JSON.
async fn json_lines(endpoint: &str, ns: &Namespace, args: &[&str]) -> Vec<Value> {
    let (code, stdout, stderr) = run(endpoint, ns, args).await;
    assert_eq!(code, 0, "{args:?}: {stderr}");
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_journal_show_and_check_tell_what_etcd_holds() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = &etcd.ns;
    let a = etcd.store("node-a", 10).await;
    let b = etcd.store("node-b", 10).await;
    let (s1, s2) = (Uuid::new_v4(), Uuid::new_v4());
    let l1 = a.acquire_lease(s1).await.unwrap();
    let l2 = b.acquire_lease(s2).await.unwrap();
    let j1 = a.open_journal(s1, Some(&l1)).await.unwrap();
    let j2 = b.open_journal(s2, Some(&l2)).await.unwrap();
    for i in 0..5 {
        j1.append(format!("one {i}")).await.unwrap();
    }
    j2.append([0xff_u8, 0x00, 0x41]).await.unwrap();

    // --- owners: every owned session, its holder, epoch, since when, TTL left, tip
    let owners = json(&endpoint, ns, &["owners", "--json"]).await;
    let owners = owners["owners"].as_array().unwrap();
    assert_eq!(owners.len(), 2, "{owners:?}");
    for (owner, (session, node, lease, tip)) in owners
        .iter()
        .zip(sorted([(s1, "node-a", &l1, 6), (s2, "node-b", &l2, 2)]))
    {
        assert_eq!(owner["session"], session.to_string());
        assert_eq!(owner["node"], node);
        assert_eq!(owner["epoch"], lease.epoch().get());
        assert_eq!(owner["tip"]["seq"], tip);
        // Not held by a session host: no load published.
        assert!(owner["load"].is_null(), "{owner}");
        let ttl = owner["ttl_left_secs"].as_u64().unwrap();
        assert!((1..=10).contains(&ttl), "{owner}");
        let acquired: SystemTime =
            humantime::parse_rfc3339(owner["acquired_at"].as_str().unwrap()).unwrap();
        let age = SystemTime::now().duration_since(acquired).unwrap();
        assert!(age < Duration::from_secs(60), "{owner}");
    }
    let (code, table, _) = run(&endpoint, ns, &["owners"]).await;
    assert_eq!(code, 0);
    assert!(table.starts_with("SESSION"), "{table}");
    assert!(
        table.contains(&s1.to_string()) && table.contains("node-a"),
        "{table}"
    );
    assert!(table.contains(" ago"), "relative times: {table}");

    // --- journal show: events, or every record; from a sequence number; bytes as hex
    let s1_text = s1.to_string();
    let events = json_lines(&endpoint, ns, &["journal", "show", &s1_text, "--json"]).await;
    let payloads: Vec<&str> = events
        .iter()
        .map(|e| e["payload"].as_str().unwrap())
        .collect();
    assert_eq!(payloads, ["one 0", "one 1", "one 2", "one 3", "one 4"]);
    assert!(
        events
            .iter()
            .all(|e| e["kind"] == "event" && e["epoch"] == l1.epoch().get())
    );
    let records = json_lines(
        &endpoint,
        ns,
        &["journal", "show", &s1_text, "--records", "--json"],
    )
    .await;
    assert_eq!(records.len(), 6);
    assert_eq!(records[0]["kind"], "fence");
    assert_eq!(records[0]["previous"], Value::Null);
    let tail = json_lines(
        &endpoint,
        ns,
        &["journal", "show", &s1_text, "--from", "5", "--json"],
    )
    .await;
    assert_eq!(
        tail.iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [5, 6]
    );
    let binary = json_lines(
        &endpoint,
        ns,
        &["journal", "show", &s2.to_string(), "--json"],
    )
    .await;
    assert_eq!(binary[0]["payload_hex"], "ff0041");
    let (code, shown, _) = run(&endpoint, ns, &["journal", "show", &s1_text, "--records"]).await;
    assert_eq!(code, 0);
    assert!(
        shown.contains("records 1 to 6 (6 kept), owned by node-a"),
        "{shown}"
    );
    assert!(
        shown.contains("fence") && shown.contains("one 4"),
        "{shown}"
    );

    // --- journal show --follow: new records as they commit, until interrupted
    let mut follow = command(
        &endpoint,
        ns,
        &["journal", "show", &s1_text, "--follow", "--json"],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    for _ in 0..5 {
        lines
            .next_line()
            .await
            .unwrap()
            .expect("the replayed events");
    }
    j1.append("followed 1").await.unwrap();
    j1.append("followed 2").await.unwrap();
    for expected in ["followed 1", "followed 2"] {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("a followed record in time")
            .unwrap()
            .unwrap();
        let record: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(record["payload"], expected);
    }
    let status = common::terminate(&mut follow, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(0));

    // --- check: sound journals exit 0; a forged record is a violation: exit 1, with its seq
    let checked = json(&endpoint, ns, &["check", "--json"]).await;
    assert_eq!(checked["sound"], true, "{checked}");
    assert_eq!(checked["journals"].as_array().unwrap().len(), 2);
    // Its progress, on a stderr that is not a terminal: whole lines, nothing rewritten.
    let (code, _, stderr) = run(&endpoint, ns, &["check"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.lines().any(|line| line == "checking 2/2"),
        "{stderr:?}"
    );
    assert!(!stderr.contains('\r'), "{stderr:?}");
    let raw = etcd.raw.clone();
    let stray = etcd.ns.record_key(s2, 9);
    raw.clone()
        .put(stray, b"\x01\x00garbage".to_vec(), None)
        .await
        .unwrap();
    let (code, stdout, stderr) = run(&endpoint, ns, &["check", "--json"]).await;
    assert_eq!(code, 1, "{stderr}");
    let checked: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(checked["sound"], false);
    let broken = checked["journals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["session"] == s2.to_string())
        .unwrap();
    assert_eq!(broken["sound"], false);
    assert!(
        !broken["violations"].as_array().unwrap().is_empty(),
        "{broken}"
    );
    let (code, stdout, _) = run(&endpoint, ns, &["check", &s1_text]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains(": sound (8 records, 1 to 8; 1 fence kept)"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&endpoint, ns, &["check", &s2.to_string()]).await;
    assert_eq!(code, 1);
    assert!(stdout.contains("violations"), "{stdout}");
}

fn sorted<T>(mut owners: [(Uuid, &str, T, u64); 2]) -> [(Uuid, &str, T, u64); 2] {
    owners.sort_by_key(|(session, ..)| *session);
    owners
}

#[tokio::test(flavor = "multi_thread")]
async fn trim_delete_and_revoke_act_as_the_library_does() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = &etcd.ns;
    let store = etcd.store("node-a", 10).await;
    let session = Uuid::new_v4();
    let text = session.to_string();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let payloads: Vec<String> = (0..19).map(|i| format!("e{i}")).collect();
    journal.append_batch(&payloads).await.unwrap();

    // --- trim: the records before 11 go; the owner appends on, unfenced
    let trimmed = json(
        &endpoint,
        ns,
        &["journal", "trim", &text, "--before", "11", "--json"],
    )
    .await;
    assert_eq!(trimmed["base"], 11);
    assert_eq!(trimmed["removed"], 10);
    assert_eq!(
        common::count(&etcd.raw, &ns.records_prefix(session)).await,
        10
    );
    journal.append("after the trim").await.unwrap();
    let (code, _, stderr) = run(&endpoint, ns, &["journal", "trim", &text, "--before", "99"]).await;
    assert_eq!(code, 2, "past the tip is bad input: {stderr}");
    assert!(stderr.contains("last record is always kept"), "{stderr}");

    // --- delete is refused while the session is owned
    let (code, _, stderr) = run(&endpoint, ns, &["journal", "delete", &text, "--yes"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("is owned"), "{stderr}");

    // --- revoke: the holder loses it, as revoked
    let revoked = json(&endpoint, ns, &["revoke", &text, "--yes", "--json"]).await;
    assert_eq!(revoked["epoch"], lease.epoch().get());
    assert_eq!(revoked["node"], "node-a");
    let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("the holder learns of it");
    assert_eq!(reason, LossReason::Revoked);
    let (code, _, stderr) = run(&endpoint, ns, &["revoke", &text, "--yes"]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("is not owned"), "{stderr}");

    // --- and then the journal can be deleted, every key of it
    let deleted = json(
        &endpoint,
        ns,
        &["journal", "delete", &text, "--yes", "--json"],
    )
    .await;
    assert_eq!(deleted["deleted_keys"], 11 + 2, "records, tip and base");
    assert_eq!(
        common::count(&etcd.raw, &ns.journal_prefix(session)).await,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_exits_2_and_unknown_sessions_exit_1() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = &etcd.ns;
    for args in [
        &["journal", "show", "not-a-uuid"][..],
        &["revoke", "42", "--yes"],
        &["check", "nope"],
        &[
            "journal",
            "trim",
            "00000000-0000-0000-0000-00000000000g",
            "--before",
            "2",
        ],
        &[
            "journal",
            "trim",
            &Uuid::new_v4().to_string(),
            "--before",
            "0",
        ],
        &[
            "journal",
            "show",
            &Uuid::new_v4().to_string(),
            "--from",
            "0",
        ],
    ] {
        let (code, _, stderr) = run(&endpoint, ns, args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("invalid value"), "{args:?}: {stderr}");
    }
    let unknown = Uuid::new_v4().to_string();
    for (args, says) in [
        (&["journal", "show", &unknown][..], "has no journal"),
        (
            &["journal", "trim", &unknown, "--before", "2"],
            "has no journal",
        ),
        (&["check", &unknown], "has no journal"),
        (&["revoke", &unknown, "--yes"], "is not owned"),
    ] {
        let (code, stdout, stderr) = run(&endpoint, ns, args).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    // Deleting a journal that does not exist is done already.
    let deleted = json(
        &endpoint,
        ns,
        &["journal", "delete", &unknown, "--yes", "--json"],
    )
    .await;
    assert_eq!(deleted["deleted_keys"], 0);
    let owners = json(&endpoint, ns, &["owners", "--json"]).await;
    assert_eq!(owners["owners"], Value::Array(vec![]));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_etcd_exits_3_within_the_connect_timeout() {
    let etcd = common::Etcd::start().await;
    let ns = &etcd.ns;
    // A blackhole: connections are accepted, and nothing ever answers.
    let proxy = FaultProxy::start(etcd.node.endpoint()).await.unwrap();
    proxy.blackhole();
    let session = Uuid::new_v4().to_string();
    for endpoint in [proxy.endpoint(), "http://127.0.0.1:9".to_owned()] {
        for args in [
            &["status"][..],
            &["owners", "--json"],
            &["journal", "show", &session],
            &["journal", "trim", &session, "--before", "2"],
            &["journal", "delete", &session, "--yes"],
            &["revoke", &session, "--yes"],
            &["check"],
        ] {
            let mut all = args.to_vec();
            all.extend(["--connect-timeout", "2"]);
            let started = Instant::now();
            let (code, stdout, stderr) = run(&endpoint, ns, &all).await;
            let took = started.elapsed();
            assert_eq!(code, 3, "{endpoint} {args:?}: {stderr}");
            assert!(stderr.contains("no etcd endpoint answered"), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stdout.is_empty(), "{stdout}");
            assert!(
                took < Duration::from_secs(4),
                "{endpoint} {args:?} took {took:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_flags_a_tip_behind_its_last_record() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = &etcd.ns;
    let store = etcd.store("node-a", 10).await;
    let session = Uuid::new_v4();
    let lease = store.acquire_lease(session).await.unwrap();
    let journal = store.open_journal(session, Some(&lease)).await.unwrap();
    let tip_key = ns.tip_key(session);
    let raw = etcd.raw.clone();
    let behind = raw.clone().get(tip_key.as_str(), None).await.unwrap().kvs()[0]
        .value()
        .to_vec();
    journal.append("the last record").await.unwrap();
    drop(journal);
    lease.release().await.unwrap();
    raw.clone().put(tip_key, behind, None).await.unwrap();

    // --- check: exit 1, the journal's violation says its tip is behind, at the tip's seq
    let (code, stdout, stderr) = run(&endpoint, ns, &["check", "--json"]).await;
    assert_eq!(code, 1, "{stderr}");
    let checked: Value = serde_json::from_str(&stdout).unwrap();
    let journal = &checked["journals"][0];
    assert_eq!(journal["session"], session.to_string());
    assert_eq!(journal["sound"], false);
    let violations = journal["violations"].as_array().unwrap();
    assert_eq!(violations.len(), 1, "{journal}");
    assert_eq!(violations[0]["seq"], 1);
    let message = violations[0]["message"].as_str().unwrap();
    assert!(
        message.contains("behind the last record") && message.contains("no owner can open"),
        "{message}"
    );
    let (code, stdout, _) = run(&endpoint, ns, &["check", &session.to_string()]).await;
    assert_eq!(code, 1);
    assert!(stdout.contains("behind the last record"), "{stdout}");
}
