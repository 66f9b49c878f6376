//! docs/cli.md, the reference of the `leasehold` tool, is generated from the tool's own
//! `--help`: one section per command and subcommand, so that each flag is documented once, in
//! the clap definitions (cli/src), and the reference cannot drift from them.
//!
//! The test renders the reference and fails when the checked-in docs/cli.md differs; with
//! `LEASEHOLD_WRITE_CLI_REFERENCE=1` it writes the file instead:
//!
//! ```text
//! LEASEHOLD_WRITE_CLI_REFERENCE=1 cargo test -p leasehold-cli --all-features --test cli_reference
//! ```
//!
//! The help is made the same on every machine: the tool runs with an empty environment (no
//! `LEASEHOLD_*` variable shows up as `[env: LEASEHOLD_NODE=...]`, no `NO_COLOR` or
//! `CLICOLOR_FORCE`) and `COLUMNS=100`; no default of the tool is computed from the machine
//! (`--node`'s default, `node-{process id}`, is a sentence of its help, not a value), which
//! [`the_reference_holds_nothing_of_this_machine`] checks. Lines are wrapped at
//! [`WIDTH`] columns here (the tool's clap has no `wrap_help`, so its help is not wrapped) and
//! stripped of trailing spaces.

mod help;

use std::path::{Path, PathBuf};

use help::{WIDTH, every_help};

/// Where the reference lives, from the workspace's root.
const REFERENCE: &str = "docs/cli.md";

/// The variable that makes the test write the reference instead of comparing it.
const WRITE: &str = "LEASEHOLD_WRITE_CLI_REFERENCE";

/// The command that rewrites the reference.
const REGENERATE: &str = "LEASEHOLD_WRITE_CLI_REFERENCE=1 cargo test -p leasehold-cli --all-features --test cli_reference";

/// The entries of a help text's `Options:` section, each as its lines (the `--flag <VALUE>`
/// line, then its help, indented deeper), without the blank lines that end it.
fn option_entries(help: &str) -> Vec<Vec<&str>> {
    let mut entries: Vec<Vec<&str>> = Vec::new();
    for line in help
        .lines()
        .skip_while(|line| *line != "Options:")
        .skip(1)
        .take_while(|line| line.trim().is_empty() || line.starts_with(' '))
    {
        if is_entry_start(line) {
            entries.push(vec![line]);
        } else if let Some(entry) = entries.last_mut() {
            entry.push(line);
        }
    }
    for entry in &mut entries {
        while entry.last().is_some_and(|line| line.trim().is_empty()) {
            entry.pop();
        }
    }
    entries
}

/// Whether `line` starts an option's entry: `  -h, --help` or `      --ttl <TTL>`.
fn is_entry_start(line: &str) -> bool {
    let indent = line.len() - line.trim_start().len();
    (2..=6).contains(&indent) && line.trim_start().starts_with('-')
}

/// `help` without the entries of `global` (the options of `leasehold` itself, which the
/// commands take too): the lines of the other entries, and the rest, as they were; and the long
/// flags of the entries of `global` that `help` does not have (a command's own argument of the
/// same name takes the place of a global option: `drain <NODE>` has no `--node`).
fn without_global(help: &str, global: &[Vec<&str>]) -> (String, Vec<String>) {
    let entries = option_entries(help);
    let missing = global
        .iter()
        .filter(|entry| !entries.contains(entry))
        .map(|entry| long_flag(entry[0]))
        .collect();
    let mut kept = Vec::new();
    let mut in_options = false;
    let mut skipping = false;
    for line in help.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            in_options = line == "Options:";
            skipping = false;
        } else if in_options && is_entry_start(line) {
            let entry = entries
                .iter()
                .find(|entry| entry[0] == line)
                .expect("an entry");
            skipping = global.contains(entry);
        }
        if !skipping {
            kept.push(line);
        }
    }
    // No two blank lines in a row, and no `Options:` heading left with no entry.
    let mut lines: Vec<&str> = Vec::new();
    for line in kept {
        if !(line.trim().is_empty() && lines.last().is_some_and(|last| last.trim().is_empty())) {
            lines.push(line);
        }
    }
    if let Some(at) = lines.iter().position(|line| *line == "Options:")
        && !lines.get(at + 1).is_some_and(|line| is_entry_start(line))
    {
        let end = (at + 1..lines.len())
            .find(|&i| !lines[i].trim().is_empty())
            .unwrap_or(lines.len());
        lines.drain(at..end);
    }
    (lines.join("\n"), missing)
}

/// The long flag an entry's first line defines: `--help` of `  -h, --help`.
fn long_flag(line: &str) -> String {
    line.split_whitespace()
        .find(|word| word.starts_with("--"))
        .unwrap_or(line.trim())
        .to_owned()
}

/// `line` wrapped at [`WIDTH`] columns: its continuation lines indented like it, or, for an
/// item of a `Commands:` list (`  name    what it does`) and of a list of values
/// (`- text: For people`), to the column its text starts at.
fn wrap(line: &str, commands: bool) -> Vec<String> {
    if line.chars().count() <= WIDTH {
        return vec![line.to_owned()];
    }
    let body = line.trim_start();
    let mut indent = line.len() - body.len();
    if commands && let Some((name, rest)) = body.split_once("  ") {
        indent += name.len() + 2 + (rest.len() - rest.trim_start().len());
    } else if body.starts_with("- ") {
        indent += 2;
    }
    let mut lines = Vec::new();
    let mut current = line[..line.len() - body.len()].to_owned();
    let mut empty = true;
    for word in body.split(' ') {
        if !empty && current.chars().count() + 1 + word.chars().count() > WIDTH {
            lines.push(std::mem::replace(&mut current, " ".repeat(indent)));
            empty = true;
        }
        if !empty {
            current.push(' ');
        }
        current.push_str(word);
        empty = false;
    }
    lines.push(current);
    lines
}

/// A help text as it goes into the reference: wrapped, without trailing spaces.
fn rendered(help: &str) -> String {
    let mut out = Vec::new();
    let mut commands = false;
    for line in help.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            commands = line == "Commands:";
        }
        out.extend(wrap(line.trim_end(), commands));
    }
    let mut text = out.join("\n");
    text.truncate(text.trim_end().len());
    text
}

/// `leasehold journal show`.
fn command_line(path: &[String]) -> String {
    std::iter::once("leasehold")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The anchor GitHub gives the heading `` `leasehold journal show` ``.
fn anchor(path: &[String]) -> String {
    command_line(path).replace(' ', "-")
}

/// The reference: a heading, how it is made, a list of the commands, and a section for each.
fn reference() -> String {
    let helps = every_help();
    // `-V, --version` is the one option of `leasehold` the subcommands do not take.
    let global: Vec<Vec<&str>> = option_entries(&helps[0].1)
        .into_iter()
        .filter(|entry| !entry[0].contains("--version"))
        .collect();
    assert!(
        global.iter().any(|entry| entry[0].contains("--endpoints")),
        "the options of `leasehold --help`: {global:?}"
    );
    let mut out = String::new();
    out.push_str("# The `leasehold` command-line reference\n\n");
    out.push_str(&format!(
        "Generated from the tool's own `--help` by `cli/tests/cli_reference.rs`, which fails when \
         this file differs from what the tool says: to change it, edit the clap definitions in \
         `cli/src`, then run `{REGENERATE}`. The options of `leasehold` itself, its global \
         options, are taken by every command too and are listed once, under \
         [`leasehold`](#leasehold).\n\n"
    ));
    for (path, _) in &helps {
        out.push_str(&format!(
            "{}- [`{}`](#{})\n",
            "  ".repeat(path.len()),
            command_line(path),
            anchor(path)
        ));
    }
    for (path, text) in &helps {
        out.push_str(&format!("\n## `{}`\n\n", command_line(path)));
        if path.is_empty() {
            out.push_str(&format!("```text\n{}\n```\n", rendered(text)));
            continue;
        }
        let (text, missing) = without_global(text, &global);
        // A few at most: more means the help is no longer parsed right.
        assert!(
            missing.len() <= 2,
            "`{} --help` lacks the global options {missing:?}:\n{text}",
            command_line(path)
        );
        out.push_str(&format!("```text\n{}\n```\n", rendered(&text)));
        out.push_str("\nAnd the [global options](#leasehold)");
        if !missing.is_empty() {
            let missing: Vec<String> = missing.iter().map(|flag| format!("`{flag}`")).collect();
            out.push_str(&format!(", except {}", missing.join(", ")));
        }
        out.push_str(".\n");
    }
    out
}

/// The workspace's root: the library's package, above this one.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tool's package sits in the workspace")
        .to_owned()
}

#[test]
fn docs_cli_md_is_the_reference_the_tool_generates() {
    let path = workspace().join(REFERENCE);
    let generated = reference();
    if std::env::var_os(WRITE).is_some_and(|value| !value.is_empty() && value != "0") {
        std::fs::write(&path, &generated).expect("docs/cli.md is written");
        eprintln!("wrote {} ({} bytes)", path.display(), generated.len());
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let first = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "{REFERENCE} is not the reference the tool's --help generates (first difference at \
             line {}:\n  checked in: {:?}\n  generated:  {:?}\n); rewrite it with:\n\n    {REGENERATE}\n",
            first + 1,
            checked_in.lines().nth(first).unwrap_or("<end of file>"),
            generated.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn the_reference_holds_nothing_of_this_machine() {
    let generated = reference();
    let mut machine = vec![
        std::env::temp_dir().display().to_string(),
        workspace().display().to_string(),
    ];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        machine.push(host.trim().to_owned());
    }
    machine.extend(["HOSTNAME", "HOME"].map(|name| std::env::var(name).unwrap_or_default()));
    for value in machine.iter().filter(|value| value.len() >= 4) {
        assert!(
            !generated.contains(value.as_str()),
            "the reference holds {value:?}, which is this machine's"
        );
    }
    // A variable set in the environment shows in the help as `[env: NAME=value]`; the tool
    // runs with none set.
    let env: Vec<&str> = generated
        .match_indices("[env: LEASEHOLD_")
        .map(|(at, _)| generated[at..].split(']').next().unwrap_or_default())
        .collect();
    assert!(env.len() >= 10, "{env:?}");
    assert!(
        env.iter().all(|shown| shown.ends_with('=')),
        "a variable's value in the reference: {env:?}"
    );
}

#[test]
fn help_lines_wrap_at_the_width_with_their_indent() {
    let long = format!("          {}", "word ".repeat(30).trim_end());
    let wrapped = wrap(&long, false);
    assert!(wrapped.len() > 1 && wrapped.iter().all(|line| line.len() <= WIDTH));
    assert!(wrapped[1].starts_with("          word"));
    let item = format!("  status    {}", "word ".repeat(30).trim_end());
    assert!(wrap(&item, true)[1].starts_with(&format!("{}word", " ".repeat(12))));
    let value = format!("          - json: {}", "word ".repeat(30).trim_end());
    assert!(wrap(&value, false)[1].starts_with(&format!("{}word", " ".repeat(12))));
    assert_eq!(wrap("short", false), ["short"]);
}
