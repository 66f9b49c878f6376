//! The tool's help, read from the built binary: each command's `--help`, the subcommands it
//! lists, and every command of the tool. Shared by the tests that hold the docs, the reference
//! and the flags to it.

use std::process::Command;

/// The width the help is wrapped at (`COLUMNS`).
pub(crate) const WIDTH: usize = 100;

/// `leasehold … --help` for `command` (words), in an empty environment but for `COLUMNS`, so
/// that no variable of the machine shows in it.
pub(crate) fn help(command: &[String]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(command)
        .arg("--help")
        .env_clear()
        .env("COLUMNS", WIDTH.to_string())
        .output()
        .expect("the tool runs");
    assert!(
        output.status.success(),
        "leasehold {} --help: {}",
        command.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// The subcommands a help text lists (without `help`).
pub(crate) fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path of the tool (`[]`, `["journal"]`, `["journal", "show"]`, ...) and its
/// help text, each command before its subcommands, in the order the help lists them.
pub(crate) fn every_help() -> Vec<(Vec<String>, String)> {
    fn walk(path: Vec<String>, found: &mut Vec<(Vec<String>, String)>) {
        let text = help(&path);
        let children = subcommands(&text);
        found.push((path.clone(), text));
        for child in children {
            let mut child_path = path.clone();
            child_path.push(child);
            walk(child_path, found);
        }
    }
    let mut found = Vec::new();
    walk(Vec::new(), &mut found);
    found
}
