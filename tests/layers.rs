//! The crate's layers, checked from its imports: no module imports from a layer above its own,
//! and no two top-level modules import each other, directly or round a loop. The layers are
//! those the crate docs (`src/lib.rs`) state, bottom up.
//!
//! A path is read wherever code names it: `use crate::…` and `crate::…` in expressions and
//! types (doc comments and line comments are skipped). A name taken from the crate root
//! (`crate::Store`) counts as an import of the module that `lib.rs` re-exports it from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom up; modules in one layer may import each other unless that makes a loop.
const LAYERS: &[&[&str]] = &[
    &[
        "keys", "fault", "deadline", "clock", "backoff", "hooks", "sync",
    ],
    &["etcd"],
    &["metrics"],
    &["lease"],
    &["journal"],
    &["store"],
    &["admin", "directory", "rig"],
    &["host", "sidecar"],
    &["testing"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// One import: where it is, and the top-level module it takes from.
#[derive(Debug, Clone)]
struct Import {
    file: PathBuf,
    line: usize,
    from: String,
    to: String,
    text: String,
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The top-level module `file` (under `src`) belongs to; `None` for the crate root files.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative
        .components()
        .next()?
        .as_os_str()
        .to_str()?
        .to_owned();
    let module = first.trim_end_matches(".rs").to_owned();
    (module != "lib" && module != "main").then_some(module)
}

/// The names `lib.rs` re-exports, and the module each comes from (`pub use store::{Store, …}`).
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let mut rest = lib;
    while let Some(at) = rest.find("pub use ") {
        rest = &rest[at + "pub use ".len()..];
        let end = rest.find(';').unwrap();
        let statement: String = rest[..end].split_whitespace().collect();
        rest = &rest[end..];
        let Some((module, items)) = statement.split_once("::") else {
            continue;
        };
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',').filter(|i| !i.is_empty()) {
            let name = item.rsplit("::").next().unwrap().to_owned();
            names.insert(name, module.to_owned());
        }
    }
    names
}

/// The top-level modules a line of code takes from, read off its `crate::` paths.
fn targets(code: &str, root: &BTreeMap<String, String>) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `$crate::` in macros, and `leasehold_crate::` or the like, are not this crate's paths.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            group[..end]
                .split(',')
                .map(|item| item.trim().split("::").next().unwrap_or("").to_owned())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![rest[..end].to_owned()]
        };
        for name in names.into_iter().filter(|n| !n.is_empty()) {
            if layer_of(&name).is_some() {
                found.push(name);
            } else if let Some(module) = root.get(&name) {
                found.push(module.clone());
            }
        }
    }
    found
}

fn imports() -> Vec<Import> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let root = root_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut all = Vec::new();
    for file in files {
        let Some(from) = module_of(&src, &file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let code = code.split(" // ").next().unwrap();
            for to in targets(code, &root) {
                if to != from {
                    all.push(Import {
                        file: file.strip_prefix(src.parent().unwrap()).unwrap().to_owned(),
                        line: i + 1,
                        from: from.clone(),
                        to,
                        text: code.to_owned(),
                    });
                }
            }
        }
    }
    all
}

#[test]
fn every_module_of_the_crate_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let unplaced: BTreeSet<String> = files
        .iter()
        .filter_map(|file| module_of(&src, file))
        .filter(|module| layer_of(module).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/layers.rs (and src/lib.rs's docs): {unplaced:?}"
    );
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let up: Vec<String> = imports()
        .into_iter()
        .filter(|i| layer_of(&i.to) > layer_of(&i.from))
        .map(|i| {
            format!(
                "{}:{}: {} imports from {}, a layer above it: {}",
                i.file.display(),
                i.line,
                i.from,
                i.to,
                i.text
            )
        })
        .collect();
    assert!(up.is_empty(), "imports that run up:\n{}", up.join("\n"));
}

#[test]
fn no_two_modules_import_each_other_round_a_loop() {
    let imports = imports();
    let mut edges: BTreeMap<&str, BTreeMap<&str, &Import>> = BTreeMap::new();
    for import in &imports {
        edges
            .entry(import.from.as_str())
            .or_default()
            .entry(import.to.as_str())
            .or_insert(import);
    }
    // A loop through `start`: a path from one of its imports back to it.
    let mut loops = Vec::new();
    for &start in edges.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start]];
        let mut seen = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let at = *path.last().unwrap();
            for &next in edges.get(at).map(|e| e.keys()).into_iter().flatten() {
                if next == start {
                    let witness: Vec<String> = path
                        .iter()
                        .zip(path.iter().skip(1).chain([&start]))
                        .map(|(a, b)| {
                            let import = edges[a][b];
                            format!("{a} -> {b} ({}:{})", import.file.display(), import.line)
                        })
                        .collect();
                    loops.push(witness.join(", "));
                } else if seen.insert(next) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    assert!(loops.is_empty(), "modules in a loop:\n{}", loops.join("\n"));
}

#[test]
fn the_reader_sees_paths_in_use_lists_code_and_root_names() {
    let root =
        root_names("pub use store::{Store, StoreOptions};\npub use etcd::{\n    Connection,\n};");
    assert_eq!(
        targets("use crate::journal::{Journal, Record};", &root),
        ["journal"]
    );
    assert_eq!(targets("let s: crate::Store = x;", &root), ["store"]);
    assert_eq!(
        targets("use crate::{Connection, Store};", &root),
        ["etcd", "store"]
    );
    assert_eq!(targets("$crate::journal::x", &root), Vec::<String>::new());
    assert_eq!(targets("use super::x;", &root), Vec::<String>::new());
}

/// The longest file in `src/`, in lines.
const MAX_FILE_LINES: usize = 750;
/// The longest function in `src/`, in lines (its signature to its closing brace).
const MAX_FN_LINES: usize = 100;

/// The functions of `code` longer than `MAX_FN_LINES`: a line that starts a `fn` (not a
/// declaration ending in `;`) runs to the first line after it that closes at its own indent.
fn long_functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut long = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let starts = [
            "fn ",
            "pub fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) fn ",
            "pub(crate) async fn ",
            "pub(super) fn ",
            "pub(super) async fn ",
            "const fn ",
            "pub const fn ",
        ];
        if !starts.iter().any(|s| trimmed.starts_with(s)) || trimmed.ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[at + 1..].iter().position(|l| l.trim_end() == close) {
            let length = end + 2;
            if length > MAX_FN_LINES {
                let name = trimmed.split('(').next().unwrap_or(trimmed).to_owned();
                long.push((name, length));
            }
        }
    }
    long
}

#[test]
fn no_file_in_src_is_over_750_lines_and_no_function_over_100() {
    let mut files = Vec::new();
    rust_files(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        &mut files,
    );
    let mut wrong = Vec::new();
    for file in &files {
        let code = std::fs::read_to_string(file).unwrap();
        let lines = code.lines().count();
        if lines > MAX_FILE_LINES {
            wrong.push(format!("{}: {lines} lines", file.display()));
        }
        for (name, length) in long_functions(&code) {
            wrong.push(format!("{}: {name}: {length} lines", file.display()));
        }
    }
    assert!(files.len() > 100, "{} files read", files.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_length_check_sees_a_long_function() {
    let body = "    x();\n".repeat(MAX_FN_LINES);
    let code = format!("impl A {{\n    pub async fn long(&self) {{\n{body}    }}\n}}\n");
    assert_eq!(
        long_functions(&code),
        [("pub async fn long".to_owned(), MAX_FN_LINES + 2)]
    );
    assert!(long_functions("fn short() {\n}\n").is_empty());
}
