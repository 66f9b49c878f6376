//! The guide's shell commands, run as written against a test etcd: chapter 2's three nodes and
//! the commands after them, then chapter 4's operator commands, in order, with their
//! placeholders filled in (`S`: the session chapter 2 created, `n1` and `n2`: two of its
//! nodes, `SEQ`: a sequence number of its journal). The endpoints and namespace come from the environment, as a reader's shell would
//! have them. A command that runs until stopped (`--watch`, `--follow`) is left out.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Stdio;
use std::time::Duration;

use leasehold::testing::wait_for;
use tokio::process::{Child, Command};

const HOSTING: &str = include_str!("../../docs/guide/2-host-sessions.md");
const OPERATING: &str = include_str!("../../docs/guide/4-operate.md");

/// The `leasehold …` lines of `text`'s `sh` blocks, as words (double quotes group words;
/// a `#` after a space starts a comment).
fn commands(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut in_sh = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh" && !in_sh;
            continue;
        }
        if !in_sh || !line.starts_with("leasehold ") {
            continue;
        }
        let line = line.split(" #").next().unwrap_or(line);
        let mut words = Vec::new();
        let mut word = String::new();
        let (mut quoted, mut started) = (false, false);
        for c in line.chars() {
            match c {
                '"' => (quoted, started) = (!quoted, true),
                c if c.is_whitespace() && !quoted => {
                    if started {
                        words.push(std::mem::take(&mut word));
                    }
                    started = false;
                }
                c => {
                    word.push(c);
                    started = true;
                }
            }
        }
        if started {
            words.push(word);
        }
        found.push(words);
    }
    found
}

/// The tool, with the test etcd's endpoint and namespace in its environment.
fn tool(etcd: &common::Etcd, words: &[String]) -> Command {
    let binary = env!("CARGO_BIN_EXE_leasehold");
    assert_eq!(words[0], "leasehold");
    let mut command = Command::new(binary);
    command
        .args(&words[1..])
        .env("LEASEHOLD_ENDPOINTS", etcd.node.endpoint())
        .env("LEASEHOLD_NAMESPACE", etcd.ns.as_str())
        .env("LEASEHOLD_NO_VERSION_WARNING", "true")
        .stdin(Stdio::null());
    command
}

/// Runs one command line to its end: its exit code and output.
async fn run(etcd: &common::Etcd, words: &[String]) -> (i32, String) {
    let output = tool(etcd, words).output().await.expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn the_guide_shows_the_commands_this_test_runs() {
    let hosting = commands(HOSTING);
    assert_eq!(hosting.len(), 6, "{hosting:?}");
    assert_eq!(
        hosting[0],
        ["leasehold", "node", "--node", "a", "--registry"]
    );
    assert_eq!(
        hosting[3],
        ["leasehold", "sessions", "create", "--metadata", "user 7"]
    );
    assert!(commands(OPERATING).len() >= 12);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_guides_shell_commands_run_as_written() {
    let etcd = common::Etcd::start().await;

    // Chapter 2: three nodes, then a session created, its owner and the hosts.
    let hosting = commands(HOSTING);
    let (nodes, after): (Vec<_>, Vec<_>) = hosting.iter().partition(|words| words[1] == "node");
    assert_eq!(nodes.len(), 3);
    let mut running: Vec<Child> = nodes
        .iter()
        .map(|words| {
            let mut command = tool(&etcd, words);
            command.stdout(Stdio::null()).stderr(Stdio::null());
            command.kill_on_drop(true).spawn().expect("a node starts")
        })
        .collect();
    let mut session = None;
    for words in &after {
        let (code, out) = run(&etcd, words).await;
        assert_eq!(code, 0, "{words:?}: {out}");
        if words[1] == "sessions" {
            // `created session=… revision=…`
            session = out
                .split(|c: char| c.is_whitespace() || c == '=')
                .find_map(|word| leasehold::Uuid::parse_str(word).ok());
        }
    }
    let session = session
        .expect("`sessions create` prints the new session")
        .to_string();
    // The nodes settle (twice the TTL, as the chapter says) and one of them takes it.
    let owners = ["leasehold".to_owned(), "owners".into()];
    wait_for(
        "the created session owned",
        Duration::from_secs(60),
        || async {
            let (code, out) = run(&etcd, &owners).await;
            (code == 0 && out.contains(&session)).then_some(())
        },
    )
    .await
    .unwrap();

    // Chapter 4, in order, on that session and nodes a and b.
    let mut ran = 0;
    for words in commands(OPERATING) {
        if words.iter().any(|w| w == "--watch" || w == "--follow") {
            continue;
        }
        let words: Vec<String> = (words.into_iter())
            .map(|word| match word.as_str() {
                "S" => session.clone(),
                "n1" => "a".into(),
                "n2" => "b".into(),
                // The fence and the first heartbeat are there by now.
                "SEQ" => "2".into(),
                _ => word,
            })
            .collect();
        let (code, out) = run(&etcd, &words).await;
        // "refused while S is owned", as its comment says: the nodes still host it.
        let expected = if words.get(1..3) == Some(&["journal".to_owned(), "delete".into()]) {
            1
        } else {
            0
        };
        assert_eq!(code, expected, "{words:?}: {out}");
        ran += 1;
    }
    assert!(ran >= 12, "{ran} commands ran");
    for node in &mut running {
        node.kill().await.expect("the node stops");
    }
}
