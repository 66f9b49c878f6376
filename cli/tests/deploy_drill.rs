//! The deployment as shipped fails over in time: `deploy/drill.sh` builds the images, brings
//! up `deploy/compose.yml` (three etcd members, three `leasehold node` containers), kills one
//! node with SIGKILL and prints how long each of its sessions took to move to another node.
//! The drill must exit 0 and every move it printed must take at most the compose file's TTL
//! (5 s) + 2 s. Without Docker or docker-compose this test fails, it never skips.

use std::process::Command;
use std::time::{Duration, Instant};

/// The node lease TTL that `deploy/compose.yml` gives the nodes.
const TTL: Duration = Duration::from_secs(5);
/// A crashed node's sessions move within its TTL plus an election and a round trip.
const BOUND: Duration = Duration::from_secs(TTL.as_secs() + 2);
/// The whole drill: images, compose up, balance, kill, takeover, compose down.
const DRILL_TIMEOUT_SECS: u64 = 240;

/// Runs `program args` and panics, naming what the drill needs, when it does not succeed.
fn require(program: &str, args: &[&str], why: &str) -> Result<(), String> {
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{program} {}` failed ({}): {}; {why}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(error) => Err(format!("cannot run `{program}`: {error}; {why}")),
    }
}

/// What the drill printed about one session of the killed node.
#[derive(Debug)]
struct Move {
    line: String,
    after: Option<Duration>,
}

/// The drill's `killed … ttl Ns …` line: how many sessions the killed node held, and its TTL.
fn killed_line(stdout: &str) -> Option<(usize, u64)> {
    let line = stdout.lines().find(|l| l.starts_with("killed "))?;
    let (_, rest) = line.split_once(": ")?;
    let mut words = rest.split_whitespace();
    let sessions = words.next()?.parse().ok()?;
    let ttl = rest
        .split(", ")
        .find_map(|part| part.strip_prefix("ttl "))?
        .trim_end_matches('s')
        .parse()
        .ok()?;
    Some((sessions, ttl))
}

/// One entry per `moved …` or `stayed …` line; `after` is `after=4.512s` read as a duration.
fn moves(stdout: &str) -> Vec<Move> {
    stdout
        .lines()
        .filter(|l| l.starts_with("moved ") || l.starts_with("stayed "))
        .map(|line| Move {
            line: line.to_owned(),
            after: line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("after="))
                .and_then(|t| t.strip_suffix('s'))
                .and_then(|t| t.parse::<f64>().ok())
                .and_then(|t| Duration::try_from_secs_f64(t).ok()),
        })
        .collect()
}

#[test]
fn a_killed_nodes_sessions_move_within_ttl_plus_two_seconds() {
    let missing: Vec<String> = [
        require(
            "docker",
            &["info"],
            "the drill runs etcd and leasehold in containers: it needs a running Docker engine",
        ),
        require("docker-compose", &["version"], "")
            .or_else(|_| require("docker", &["compose", "version"], ""))
            .map_err(|_| {
                "neither `docker-compose` nor `docker compose` works: the drill needs one \
                 (deploy/dev.sh installs docker-compose)"
                    .to_owned()
            }),
        require(
            "timeout",
            &["--version"],
            "the drill is bounded with coreutils' timeout",
        ),
    ]
    .into_iter()
    .filter_map(Result::err)
    .collect();
    assert!(
        missing.is_empty(),
        "the deployment drill cannot run: {}",
        missing.join("; ")
    );

    let project = format!("leasehold-test-drill-{}", std::process::id());
    let started = Instant::now();
    let output = Command::new("timeout")
        .args([
            "--signal=TERM",
            "--kill-after=60",
            &DRILL_TIMEOUT_SECS.to_string(),
            "bash",
            "deploy/drill.sh",
            "-p",
            &project,
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        // The binary this test run built: images.sh packs it instead of running cargo.
        .env("LEASEHOLD_BIN", env!("CARGO_BIN_EXE_leasehold"))
        .output()
        .expect("runs deploy/drill.sh");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report = format!(
        "--- drill stdout ---\n{stdout}--- drill stderr (last 60 lines) ---\n{}",
        stderr
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );

    assert_ne!(
        output.status.code(),
        Some(124),
        "deploy/drill.sh ran past {DRILL_TIMEOUT_SECS} s and was stopped\n{report}"
    );
    assert!(
        output.status.success(),
        "deploy/drill.sh failed ({}) after {took:.1?}\n{report}",
        output.status
    );

    let (held, ttl) = killed_line(&stdout)
        .unwrap_or_else(|| panic!("the drill printed no `killed …` line\n{report}"));
    let moves = moves(&stdout);
    assert!(held > 0, "the killed node held no session\n{report}");
    assert_eq!(
        moves.len(),
        held,
        "the drill reported {} sessions of the {held} the killed node held\n{report}",
        moves.len()
    );
    let late: Vec<String> = moves
        .iter()
        .filter(|m| m.after.is_none_or(|after| after > BOUND))
        .map(|m| m.line.clone())
        .collect();
    assert!(
        late.is_empty(),
        "sessions of the killed node that did not move within TTL {TTL:?} + 2 s = {BOUND:?}:\n{}\n{report}",
        late.join("\n")
    );
    assert_eq!(
        ttl,
        TTL.as_secs(),
        "deploy/compose.yml runs the nodes with TTL {ttl} s, this test expects {TTL:?}\n{report}"
    );

    let slowest = moves.iter().filter_map(|m| m.after).max().unwrap();
    println!(
        "drill took {took:.1?}: {held} sessions moved, slowest after {slowest:.3?} (bound {BOUND:?})"
    );
    for m in &moves {
        println!("{}", m.line);
    }
}

#[test]
fn drill_output_parses() {
    let out = "killed node-2 at 2026-01-01T00:00:00.000000000Z: 2 sessions, ttl 5s, bound 7s\n\
               moved session=a from=node-2 epoch=8 to=node-3 epoch=136 after=4.447s appended_after=4.461s\n\
               stayed session=b from=node-2 epoch=9 (no other node acquired it)\n\
               drill: FAILED: …\n";
    assert_eq!(killed_line(out), Some((2, 5)));
    let moves = moves(out);
    assert_eq!(moves.len(), 2);
    assert_eq!(moves[0].after, Some(Duration::from_millis(4447)));
    assert_eq!(moves[1].after, None);
}
