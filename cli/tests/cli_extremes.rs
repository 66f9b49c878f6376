//! Every numeric flag of every command at its extremes, `0` and `18446744073709551615`: each
//! run exits 0, 1, 2 or 3 with its error on one line, never with a panic (101), never hangs.
//! `--connect-timeout 18446744073709551615` waits for etcd forever: those runs are stopped
//! after a while, and must not have panicked meanwhile.
//!
//! The commands and their flags are read from the tool's own help, so a command or a flag
//! added later fails this test until it is listed here.

#[path = "../../tests/common/mod.rs"]
mod common;
mod help;

use std::collections::BTreeSet;
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// An endpoint that refuses connections at once.
const REFUSING: &str = "http://127.0.0.1:1";

const U64_MAX: &str = "18446744073709551615";

/// Flags that take a number (a count, seconds, a sequence number) or a duration.
const NUMERIC: &[&str] = &[
    "ttl",
    "margin",
    "connect-timeout",
    "max-in-flight",
    "sessions",
    "max-sessions",
    "interval",
    "keep",
    "from",
    "before",
    "rounds",
    "scale-sessions",
    "client-keepalive",
    "weight",
    "settle",
    "wait",
    "max-request-id",
    "max-request-ids",
    "max-streams",
    "max-sessions-per-stream",
    "max-replays",
    "max-watches",
    "max-bytes-in-flight",
    "shutdown-timeout",
];

/// Flags that take a value that is not a number.
const NOT_NUMERIC: &[&str] = &[
    "endpoints",
    "namespace",
    "node",
    "log-format",
    "cacert",
    "cert",
    "key",
    "tls-server-name",
    "user",
    "password-file",
    "session",
    "metrics-addr",
    "listen",
    "listen-cert",
    "listen-key",
    "listen-client-ca",
    "advertise",
    "store",
    "metadata",
    "to",
];

/// Beside the flag under test, what each command needs to get as far as it can.
fn needs(command: &[&str]) -> Option<&'static [&'static str]> {
    const SESSION: &str = "0193e5a0-0000-7000-8000-000000000001";
    Some(match command {
        ["status"] | ["demo"] | ["owners"] | ["hosts"] | ["check"] => &[],
        ["node"] => &["--sessions", "1"],
        ["serve"] => &["--listen", "127.0.0.1:0"],
        ["bench"] => &["append"],
        ["drain"] | ["undrain"] => &["n1"],
        ["move"] => &[SESSION, "--to", "n1"],
        ["sessions", "create"] | ["sessions", "list"] => &[],
        ["sessions", "finish"] => &[SESSION],
        ["journal", "show"] => &[SESSION],
        ["journal", "trim"] => &[SESSION, "--before", "1"],
        ["journal", "delete"] | ["revoke"] => &[SESSION, "--yes"],
        _ => return None,
    })
}

/// The values each numeric flag is tried at.
fn values(flag: &str) -> Vec<&'static str> {
    match flag {
        // A duration: a bare number needs a unit (but 0), and the largest one with a unit.
        "interval" | "client-keepalive" | "settle" | "wait" | "shutdown-timeout" => vec![
            "0",
            U64_MAX,
            "18446744073709551615s",
            "18446744073709551616s",
        ],
        // A u32: its own largest value too.
        "sessions" => vec!["0", U64_MAX, "4294967295"],
        _ => vec!["0", U64_MAX],
    }
}

/// The long flags a help text lists that take a value.
fn flags_with_values(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = match line.strip_prefix('-') {
                Some(rest) if !rest.starts_with('-') => rest.split_once(", ")?.1,
                _ => line,
            };
            let mut words = line.strip_prefix("--")?.split_whitespace();
            let flag = words.next()?;
            words
                .next()
                .is_some_and(|value| value.starts_with('<'))
                .then(|| flag.to_owned())
        })
        .collect()
}

/// Every command (as its words) that runs, with the flags it takes a value for.
fn commands() -> Vec<(Vec<String>, BTreeSet<String>)> {
    let mut found: Vec<_> = (help::every_help().into_iter())
        .filter(|(_, text)| help::subcommands(text).is_empty())
        .map(|(path, text)| (path, flags_with_values(&text)))
        .collect();
    found.sort();
    found
}

/// How one run ended.
#[derive(Debug)]
enum Ended {
    Exited(i32),
    /// Still running when stopped.
    Stopped,
}

struct Run {
    args: Vec<String>,
    ended: Ended,
    stderr: String,
}

/// What to do with a run still going after its bound.
#[derive(Clone, Copy)]
enum AtBound {
    /// Kill it: it was still running ([`Ended::Stopped`]).
    Kill,
    /// Send SIGTERM and wait for its orderly exit.
    Terminate,
}

/// Runs the tool with `args`, killed after `bound`.
fn run(args: Vec<String>, bound: Duration) -> Run {
    run_until(args, bound, AtBound::Kill)
}

fn run_until(args: Vec<String>, bound: Duration, at_bound: AtBound) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(&args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .env_remove("LEASEHOLD_NAMESPACE")
        .env_remove("LEASEHOLD_NODE")
        .env_remove("LEASEHOLD_METRICS_ADDR")
        .env("LEASEHOLD_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut pipe = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let ended = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break Ended::Exited(status.code().unwrap_or(-1));
        }
        if started.elapsed() > bound {
            if let AtBound::Terminate = at_bound {
                let pid = child.id().to_string();
                let sent = Command::new("kill").args(["-TERM", &pid]).status();
                assert!(sent.is_ok_and(|s| s.success()), "SIGTERM {args:?}");
                let code = wait_at_most(&mut child, Duration::from_secs(30));
                break code.map_or(Ended::Stopped, Ended::Exited);
            }
            child.kill().expect("kills");
            child.wait().expect("reaps");
            break Ended::Stopped;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = reader.join().expect("reads");
    Run {
        args,
        ended,
        stderr,
    }
}

/// The exit code of `child` if it exits within `bound`; else it is killed.
fn wait_at_most(child: &mut std::process::Child, bound: Duration) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < bound {
        if let Some(status) = child.try_wait().expect("waits") {
            return Some(status.code().unwrap_or(-1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("kills");
    child.wait().expect("reaps");
    None
}

/// The lines of an error: clap's trailers (usage, where to read more) left out.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .filter(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .filter(|line| !line.trim_start().starts_with("tip:"))
        .collect()
}

#[test]
fn every_numeric_flag_at_its_extremes_exits_with_one_line_and_never_panics() {
    // --- phase: the commands and flags, from the help
    let commands = commands();
    assert!(commands.len() >= 10, "{commands:?}");
    let mut runs = Vec::new();
    let mut forever = Vec::new();
    for (command, flags) in &commands {
        let words: Vec<&str> = command.iter().map(String::as_str).collect();
        let needed = needs(&words).unwrap_or_else(|| {
            panic!("{command:?} is a new command: say in `needs` what it needs to run")
        });
        for flag in flags {
            assert!(
                NUMERIC.contains(&flag.as_str()) || NOT_NUMERIC.contains(&flag.as_str()),
                "{command:?} --{flag} is a new flag: list it in NUMERIC or NOT_NUMERIC"
            );
        }
        for flag in flags.iter().filter(|f| NUMERIC.contains(&f.as_str())) {
            for value in values(flag) {
                let mut args: Vec<String> = command.clone();
                // The flag under test replaces the one the command needs, if it is that one.
                let mut needed = needed.iter().peekable();
                while let Some(arg) = needed.next() {
                    if *arg == format!("--{flag}") {
                        needed.next();
                    } else {
                        args.push((*arg).to_owned());
                    }
                }
                args.extend(["--endpoints".to_owned(), REFUSING.to_owned()]);
                if flag != "connect-timeout" {
                    args.extend(["--connect-timeout".to_owned(), "1".to_owned()]);
                }
                args.push(format!("--{flag}={value}"));
                if flag == "connect-timeout" && value == U64_MAX {
                    forever.push(args);
                } else {
                    runs.push(args);
                }
            }
        }
    }
    // Each numeric flag was found on some command.
    let seen: BTreeSet<&str> = commands
        .iter()
        .flat_map(|(_, flags)| flags.iter().map(String::as_str))
        .collect();
    for flag in NUMERIC {
        assert!(
            seen.contains(flag),
            "--{flag} is listed but no command takes it"
        );
    }

    // --- phase: every run ends on its own, a few at a time
    let mut ended = Vec::new();
    for batch in runs.chunks(6) {
        let batch: Vec<Run> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|args| scope.spawn(|| run(args.clone(), Duration::from_secs(30))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        ended.extend(batch);
    }
    for Run {
        args,
        ended,
        stderr,
    } in &ended
    {
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        let Ended::Exited(code) = ended else {
            panic!("{args:?} did not end within 30 s: {stderr}");
        };
        assert!((0..=3).contains(code), "{args:?} exited {code}: {stderr}");
        if *code != 0 {
            let lines = error_lines(stderr);
            assert_eq!(lines.len(), 1, "{args:?} exited {code}: {stderr}");
        }
    }

    eprintln!("{} runs ended on their own", ended.len());

    // --- phase: waiting forever for etcd waits, and does not panic while it waits
    let waited: Vec<Run> = std::thread::scope(|scope| {
        let handles: Vec<_> = forever
            .iter()
            .map(|args| scope.spawn(|| run(args.clone(), Duration::from_secs(4))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for Run {
        args,
        ended,
        stderr,
    } in &waited
    {
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        match ended {
            Ended::Stopped => {}
            Ended::Exited(code) => {
                assert!((0..=3).contains(code), "{args:?} exited {code}: {stderr}");
                // Commands that wait for etcd through the connect timeout wait forever.
                assert!(
                    !["status", "node", "owners", "check"].contains(&args[0].as_str()),
                    "{args:?} gave up waiting: {stderr}"
                );
            }
        }
    }
}

/// The bytes of a record or tip as the journal writes them (format version 1).
fn header(kind: u8, seq: u64, epoch: u64) -> Vec<u8> {
    let mut out = vec![1, kind];
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&[7; 16]);
    out
}

/// Numbers that reach etcd at their extremes: a journal at the end of the sequence
/// (`r/18446744073709551615`) read, followed, checked, trimmed and deleted; a node with the
/// largest `--keep`, `--max-sessions` and `--interval`. Each run exits 0, 1 or 2 with one line
/// of error, never a panic.
#[tokio::test(flavor = "multi_thread")]
async fn numbers_that_reach_etcd_at_their_extremes_never_panic() {
    let etcd = common::Etcd::start().await;
    let endpoint = etcd.node.endpoint().to_owned();
    let ns = etcd.ns.clone();
    let session = leasehold::Uuid::new_v4();

    // --- phase: a journal whose last records are u64::MAX - 1 and u64::MAX
    let (last, before) = (u64::MAX, u64::MAX - 1);
    let mut fence = header(1, before, 1);
    fence.push(0);
    let mut event = header(0, last, 1);
    event.extend_from_slice(b"last");
    let mut tip = vec![1];
    tip.extend_from_slice(&last.to_be_bytes());
    tip.extend_from_slice(&1u64.to_be_bytes());
    tip.extend_from_slice(&[7; 16]);
    let mut base = vec![1];
    base.extend_from_slice(&before.to_be_bytes());
    let mut raw = etcd.raw.clone();
    for (key, value) in [
        (ns.record_key(session, before), fence),
        (ns.record_key(session, last), event),
        (ns.tip_key(session), tip),
        (ns.base_key(session), base),
    ] {
        raw.put(key, value, None).await.expect("put");
    }

    let s = session.to_string();
    let common_args = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend([
            "--endpoints".into(),
            endpoint.clone(),
            "--namespace".into(),
            ns.to_string(),
        ]);
        all
    };
    let sequence_runs = [
        (common_args(&["journal", "show", &s, "--records"]), 0),
        (
            common_args(&["journal", "show", &s, "--records", "--json"]),
            0,
        ),
        // The follow ends after the record at u64::MAX: none can follow it.
        (common_args(&["journal", "show", &s, "--follow"]), 0),
        (
            common_args(&["journal", "show", &s, "--from", U64_MAX, "--follow"]),
            0,
        ),
        (common_args(&["owners"]), 0),
        (common_args(&["check", &s]), 0),
        (
            common_args(&["journal", "trim", &s, "--before", U64_MAX]),
            0,
        ),
        (
            common_args(&["journal", "trim", &s, "--before", U64_MAX, "--json"]),
            0,
        ),
        (common_args(&["journal", "show", &s, "--from", U64_MAX]), 0),
        (common_args(&["journal", "delete", &s, "--yes"]), 0),
    ];
    let ran = tokio::task::spawn_blocking(move || {
        sequence_runs
            .into_iter()
            .map(|(args, expected)| (run(args, Duration::from_secs(30)), expected))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (
        Run {
            args,
            ended,
            stderr,
        },
        expected,
    ) in &ran
    {
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        let Ended::Exited(code) = ended else {
            panic!("{args:?} did not end within 30 s: {stderr}");
        };
        assert_eq!(code, expected, "{args:?}: {stderr}");
    }

    // --- phase: a node with the largest numbers it takes, stopped with SIGTERM
    // Each node in a namespace of its own, so that each owns its sessions and appends.
    let spaces: Vec<leasehold::Namespace> = (0..3)
        .map(|i| leasehold::Namespace::new(format!("{ns}/node-{i}")).unwrap())
        .collect();
    let node = |space: &leasehold::Namespace, args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = ["node", "--endpoints", &endpoint, "--namespace"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        all.push(space.to_string());
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    };
    let node_runs = [
        node(
            &spaces[0],
            &[
                "--sessions",
                "1",
                "--keep",
                U64_MAX,
                "--max-sessions",
                U64_MAX,
                "--interval",
                "1ms",
                "--margin",
                "0",
                "--ttl",
                "2",
                "--settle",
                "0s",
            ],
        ),
        node(
            &spaces[1],
            &[
                "--sessions",
                "2",
                "--interval",
                "18446744073709551615s",
                "--settle",
                "0s",
            ],
        ),
        node(
            &spaces[2],
            &[
                "--sessions",
                "1",
                "--keep",
                "1",
                "--interval",
                "1ms",
                "--settle",
                "0s",
            ],
        ),
    ];
    let ran = tokio::task::spawn_blocking(move || {
        std::thread::scope(|scope| {
            let handles: Vec<_> = node_runs
                .iter()
                .map(|args| {
                    scope.spawn(|| {
                        run_until(args.clone(), Duration::from_secs(4), AtBound::Terminate)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    })
    .await
    .unwrap();
    for Run {
        args,
        ended,
        stderr,
    } in &ran
    {
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
        assert!(
            matches!(ended, Ended::Exited(0)),
            "{args:?} ended {ended:?}: {stderr}"
        );
    }
    // Each node got as far as its journals: fenced and heartbeating.
    for space in &spaces {
        let keys = common::count(&etcd.raw, &space.prefix()).await;
        assert!(keys >= 3, "{space}: {keys} keys");
    }
}
