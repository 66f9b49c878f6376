//! The library's code (its unit tests aside) makes no deadline by adding a duration to the
//! clock unchecked, and adds nothing unchecked to a stored sequence number or revision: a
//! caller's `Duration::MAX` and a key `r/18446744073709551615` must not panic. Deadlines come
//! from the saturating `deadline(now, timeout)` helper; sequence numbers and revisions use
//! `checked_add` or `saturating_add`.

use std::path::{Path, PathBuf};

/// What an unchecked addition looks like in the source.
const UNCHECKED: &[&str] = &["Instant::now() +", "seq + 1", "seq() + 1", "revision + 1"];

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reads src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_unchecked_deadline_or_sequence_addition_in_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    files.sort();
    assert!(files.len() > 20, "{files:?}");
    let mut found = Vec::new();
    for file in &files {
        let name = file
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(file).expect("reads");
        // Unit tests build instants and sequence numbers of their own.
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for (i, line) in code.lines().enumerate() {
            let line_code = line.split("//").next().unwrap_or_default();
            for pattern in UNCHECKED {
                if line_code.contains(pattern) {
                    found.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "unchecked additions (use crate::deadline::deadline, checked_add or saturating_add):\n{}",
        found.join("\n")
    );
}
