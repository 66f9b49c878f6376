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
