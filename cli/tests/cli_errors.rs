//! Bad input gives one clear line and exit code 2 (an unreachable etcd, 3): never a panic,
//! never a hang.

use std::process::Command;
use std::time::{Duration, Instant};

fn leasehold(args: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_ENDPOINTS")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (
        output.status.code().unwrap_or(-1),
        stderr,
        started.elapsed(),
    )
}

#[test]
fn bad_values_exit_2_with_one_line() {
    // An invalid UUID.
    let (code, stderr, _) = leasehold(&["node", "--session", "not-a-uuid"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("invalid value 'not-a-uuid'"), "{stderr}");

    // An invalid namespace.
    let (code, stderr, _) = leasehold(&["status", "--namespace", "/bad"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("empty '/'-separated segment"), "{stderr}");

    // A TTL under etcd's minimum: refused before connecting.
    let (code, stderr, _) = leasehold(&[
        "node",
        "--sessions",
        "3",
        "--ttl",
        "1",
        "--endpoints",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("TTL 1s is invalid"), "{stderr}");

    // Absurd numbers: typed errors, never a panic.
    for (flag, value, says) in [
        ("--ttl", "18446744073709551615", "is invalid"),
        ("--ttl", "9000000001", "is invalid"),
        ("--margin", "1e20", "invalid margin"),
        ("--margin", "-1", "invalid margin"),
        ("--margin", "NaN", "invalid margin"),
        ("--margin", "100", "leaves no room to renew"),
    ] {
        let (code, stderr, _) = leasehold(&[
            "node",
            "--sessions",
            "3",
            &format!("{flag}={value}"),
            "--endpoints",
            "http://127.0.0.1:9",
        ]);
        assert_eq!(code, 2, "{flag} {value}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{flag} {value}: {stderr}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    // An unreachable endpoint: exit 3, bounded by the connect timeout.
    for command in ["status", "node"] {
        let mut args = vec![
            command,
            "--endpoints",
            "http://127.0.0.1:9",
            "--connect-timeout",
            "2",
        ];
        if command == "node" {
            args.extend(["--sessions", "1"]);
        }
        let (code, stderr, took) = leasehold(&args);
        assert_eq!(code, 3, "{command}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("no etcd endpoint answered"), "{stderr}");
        assert!(took < Duration::from_secs(10), "{command} took {took:?}");
    }
}

/// Security flags that need one another are checked whether they come as flags (before or
/// after the command) or from the environment: a missing partner is one line and exit 2.
#[test]
fn security_flags_pair_up_from_flags_and_environment() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command.args(args).env_remove("LEASEHOLD_ENDPOINTS");
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code().unwrap_or(-1), stderr)
    };
    // The certificate and key from the environment, the CA as a flag after the command: the
    // flags are accepted, and the (missing) CA file is what fails.
    let (code, stderr) = run(
        &["status", "--cacert", "/nonexistent/ca.pem"],
        &[
            ("LEASEHOLD_CERT", "/nonexistent/c.pem"),
            ("LEASEHOLD_KEY", "/nonexistent/k.pem"),
        ],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot read --cacert"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    for (args, env, says) in [
        (
            vec!["status", "--cacert", "ca", "--cert", "c"],
            vec![],
            "--cert (LEASEHOLD_CERT) needs --key",
        ),
        (
            vec!["status", "--cacert", "ca"],
            vec![("LEASEHOLD_KEY", "k")],
            "--key (LEASEHOLD_KEY) needs --cert",
        ),
        (
            vec!["status", "--cert", "c", "--key", "k"],
            vec![],
            "--cert (LEASEHOLD_CERT) needs --cacert",
        ),
        (
            vec!["status"],
            vec![("LEASEHOLD_TLS_SERVER_NAME", "etcd")],
            "needs --cacert",
        ),
        (
            vec!["status", "--password-file", "p"],
            vec![],
            "--password-file (LEASEHOLD_PASSWORD_FILE) needs --user",
        ),
    ] {
        let (code, stderr) = run(&args, &env);
        assert_eq!(code, 2, "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} {env:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}
