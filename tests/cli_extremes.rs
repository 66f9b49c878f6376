//! Every numeric flag of every command at its extremes, `0` and `18446744073709551615`: each
//! run exits 0, 1, 2 or 3 with its error on one line, never with a panic (101), never hangs.
//! `--connect-timeout 18446744073709551615` waits for etcd forever: those runs are stopped
//! after a while, and must not have panicked meanwhile.
//!
//! The commands and their flags are read from the tool's own help, so a command or a flag
//! added later fails this test until it is listed here.

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
    "sessions",
    "max-sessions",
    "interval",
    "keep",
    "from",
    "before",
    "rounds",
    "scale-sessions",
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
];

/// Beside the flag under test, what each command needs to get as far as it can.
fn needs(command: &[&str]) -> Option<&'static [&'static str]> {
    const SESSION: &str = "0193e5a0-0000-7000-8000-000000000001";
    Some(match command {
        ["status"] | ["demo"] | ["owners"] | ["check"] => &[],
        ["node"] => &["--sessions", "1"],
        ["bench"] => &["append"],
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
        "interval" => vec![
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

fn help(command: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(command)
        .arg("--help")
        .output()
        .expect("runs");
    assert!(output.status.success(), "{command:?} --help");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// The subcommands a help text lists (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
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
    let mut found = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(path) = pending.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&words);
        let children = subcommands(&text);
        if children.is_empty() {
            found.push((path.clone(), flags_with_values(&text)));
        }
        for child in children {
            let mut child_path = path.clone();
            child_path.push(child);
            pending.push(child_path);
        }
    }
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

/// Runs the tool with `args`, stopped after `bound`.
fn run(args: Vec<String>, bound: Duration) -> Run {
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
