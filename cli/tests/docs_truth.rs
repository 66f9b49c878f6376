//! The documentation holds to its sources, without etcd:
//!
//! - every ratio README.md, the guide (docs/guide/) and docs/production.md state (a number,
//!   or a range of two, with `×` right after its digits) is quoted from BENCHMARKS.md, or its
//!   paragraph names the test that measures it (the rule is written at the top of
//!   BENCHMARKS.md);
//! - every `--flag` the guide's chapter on the tool (docs/guide/tool.md) names is defined by
//!   some command of the `leasehold` tool (its `--help`), every `LEASEHOLD_*` variable it names is one the tool's
//!   help lists, and every variable the help lists is named there; the commands it shows
//!   (`leasehold journal trim`, ...) exist.

use std::collections::BTreeSet;
use std::process::Command;

/// README.md and the guide's chapters: every text whose ratios are checked, besides
/// docs/production.md.
const DOCS: [(&str, &str); 8] = [
    ("README.md", include_str!("../../README.md")),
    (
        "docs/guide/guarantees.md",
        include_str!("../../docs/guide/guarantees.md"),
    ),
    ("docs/guide/tool.md", TOOL),
    (
        "docs/guide/any-language.md",
        include_str!("../../docs/guide/any-language.md"),
    ),
    (
        "docs/guide/routing.md",
        include_str!("../../docs/guide/routing.md"),
    ),
    (
        "docs/guide/testing.md",
        include_str!("../../docs/guide/testing.md"),
    ),
    (
        "docs/guide/operating.md",
        include_str!("../../docs/guide/operating.md"),
    ),
    (
        "docs/guide/layout.md",
        include_str!("../../docs/guide/layout.md"),
    ),
];
/// The guide's chapter on the tool.
const TOOL: &str = include_str!("../../docs/guide/tool.md");
const PRODUCTION: &str = include_str!("../../docs/production.md");
const BENCHMARKS: &str = include_str!("../../BENCHMARKS.md");

/// A ratio as written: one figure, or the two ends of a range.
#[derive(Debug)]
struct Ratio {
    /// The text as written, `×` included (`1.441–1.725×`).
    text: String,
    /// Its figures: one, or the range's two ends.
    figures: Vec<String>,
}

/// The ratios of `text`: a number (digits, `.` and `,`) with `×` right after it, and the
/// number before it when the two are joined by a dash (`–` or `-`, spaces allowed) into a
/// range. `1.5 × election timeout` (a space before `×`) is a product, not a ratio.
fn ratios(text: &str) -> Vec<Ratio> {
    let chars: Vec<char> = text.chars().collect();
    let is_number_char = |c: char| c.is_ascii_digit() || c == '.' || c == ',';
    // The number ending just before `end` (exclusive), trimmed of a trailing `.` or `,`.
    let number_before = |end: usize| -> Option<(usize, String)> {
        let mut start = end;
        while start > 0 && is_number_char(chars[start - 1]) {
            start -= 1;
        }
        let number: String = chars[start..end].iter().collect();
        let number = number.trim_start_matches(['.', ',']);
        (!number.is_empty() && number.starts_with(|c: char| c.is_ascii_digit()))
            .then(|| (end - number.chars().count(), number.to_owned()))
    };
    let mut found = Vec::new();
    for (i, &c) in chars.iter().enumerate() {
        if c != '×' || i == 0 || !chars[i - 1].is_ascii_digit() {
            continue;
        }
        let Some((start, last)) = number_before(i) else {
            continue;
        };
        let mut figures = vec![last];
        let mut from = start;
        // `a–b×`: a dash, maybe between spaces, and a number before it.
        let mut j = start;
        while j > 0 && chars[j - 1] == ' ' {
            j -= 1;
        }
        if j > 0 && matches!(chars[j - 1], '–' | '-') {
            let mut k = j - 1;
            while k > 0 && chars[k - 1] == ' ' {
                k -= 1;
            }
            if let Some((first_start, first)) = number_before(k) {
                figures.insert(0, first);
                from = first_start;
            }
        }
        found.push(Ratio {
            text: chars[from..=i].iter().collect(),
            figures,
        });
    }
    found
}

/// The units a figure is judged in: paragraphs, list items and table rows, and each line of a
/// fenced code block on its own.
fn units(markdown: &str) -> Vec<String> {
    let mut units = Vec::new();
    let mut current = String::new();
    let mut fenced = false;
    let flush = |current: &mut String, units: &mut Vec<String>| {
        if !current.trim().is_empty() {
            units.push(std::mem::take(current));
        }
        current.clear();
    };
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            flush(&mut current, &mut units);
            fenced = !fenced;
            continue;
        }
        let starts_item = trimmed.starts_with("- ")
            || trimmed.starts_with("* ")
            || trimmed.starts_with('|')
            || trimmed
                .split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if fenced || trimmed.is_empty() || starts_item {
            flush(&mut current, &mut units);
        }
        if fenced {
            units.push(line.to_owned());
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    flush(&mut current, &mut units);
    units
}

/// Whether a unit names a test file of the library or the tool, `tests/{name}.rs` or
/// `cli/tests/{name}.rs`, that exists.
fn names_a_test(unit: &str) -> bool {
    unit.match_indices("tests/").any(|(at, _)| {
        let at = if unit[..at].ends_with("cli/") {
            at - "cli/".len()
        } else {
            at
        };
        let path: String = unit[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '/' | '.'))
            .collect();
        path.len() > "tests/.rs".len() && path.ends_with(".rs") && workspace().join(&path).is_file()
    })
}

/// The two runs' ratios of each row of BENCHMARKS.md's table.
fn benchmark_ratios() -> Vec<(String, String)> {
    let cells = |line: &str| -> Vec<String> {
        line.trim()
            .trim_matches('|')
            .split('|')
            .map(|cell| cell.trim().to_owned())
            .collect()
    };
    let mut lines = BENCHMARKS.lines();
    let header = lines
        .by_ref()
        .find(|line| line.starts_with('|') && line.contains("| ratio, second run |"))
        .expect("BENCHMARKS.md has the table of a run, with `ratio` and `ratio, second run`");
    let header = cells(header);
    let column = |name: &str| header.iter().position(|cell| cell == name).unwrap();
    let (first, second) = (column("ratio"), column("ratio, second run"));
    lines
        .skip(1) // the |---| line
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let row = cells(line);
            (row[first].clone(), row[second].clone())
        })
        .collect()
}

/// Whether `ratio` is quoted from BENCHMARKS.md: the same text there, or the figures of one
/// row of its table (a range: both runs, in either order; one figure: either run).
fn quoted(ratio: &Ratio, rows: &[(String, String)]) -> bool {
    let normalize = |text: &str| text.replace(" – ", "–").replace('-', "–");
    if normalize(BENCHMARKS).contains(&normalize(&ratio.text)) {
        return true;
    }
    rows.iter().any(|(a, b)| match ratio.figures.as_slice() {
        [one] => one == a || one == b,
        [low, high] => (low == a && high == b) || (low == b && high == a),
        _ => false,
    })
}

#[test]
fn every_ratio_in_readme_and_production_is_quoted_from_benchmarks_or_names_its_test() {
    let rows = benchmark_ratios();
    assert!(rows.len() >= 9, "BENCHMARKS.md's table: {rows:?}");
    let mut unquoted = Vec::new();
    let mut checked = 0;
    for (file, text) in DOCS.into_iter().chain([("docs/production.md", PRODUCTION)]) {
        for unit in units(text) {
            for ratio in ratios(&unit) {
                checked += 1;
                if !quoted(&ratio, &rows) && !names_a_test(&unit) {
                    unquoted.push(format!(
                        "{file}: `{}` is not in BENCHMARKS.md (nor the two runs of one row of its table), and its paragraph names no tests/….rs:\n    {}",
                        ratio.text,
                        unit.trim().replace('\n', "\n    ")
                    ));
                }
            }
        }
    }
    // The scanner finds the docs' tables and prose figures; if it finds none, it is broken.
    assert!(checked >= 12, "only {checked} ratios found");
    // A table with a `ratio` column writes each ratio with its `×`, so that the rule sees it.
    for (file, text) in DOCS.into_iter().chain([("docs/production.md", PRODUCTION)]) {
        let mut column = None;
        for line in text.lines() {
            let Some(row) = line.trim().strip_prefix('|') else {
                column = None;
                continue;
            };
            let cells: Vec<&str> = row
                .trim_end_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            match column {
                None => column = Some(cells.iter().position(|cell| *cell == "ratio")),
                Some(Some(at)) if !cells[at].starts_with('-') && !cells[at].contains('×') => {
                    unquoted.push(format!("{file}: a ratio without its ×: {line}"));
                }
                Some(_) => {}
            }
        }
    }
    eprintln!("{checked} ratios checked");
    assert!(
        unquoted.is_empty(),
        "ratios not quoted from BENCHMARKS.md (the rule is at its top):\n{}",
        unquoted.join("\n")
    );
}

#[test]
fn the_ratio_scanner_reads_figures_ranges_and_leaves_products_alone() {
    let found = |text: &str| -> Vec<String> { ratios(text).into_iter().map(|r| r.text).collect() };
    assert_eq!(found("get 1.441–1.725× the"), ["1.441–1.725×"]);
    assert_eq!(
        found("(1.00× without), 24 - 28× and 0.0001×"),
        ["1.00×", "24 - 28×", "0.0001×"]
    );
    assert_eq!(found("10,000× less"), ["10,000×"]);
    assert!(found("⌈1.5 × election timeout⌉, 64 tasks × 20").is_empty());
    assert_eq!(ratios("1.441–1.725×")[0].figures, ["1.441", "1.725"]);
    let units = units("a\nb 2×\n\n- item `cli/tests/docs_truth.rs` 3×\n- other 4×\n| row | 5× |\n");
    assert_eq!(units.len(), 4, "{units:?}");
    assert!(names_a_test(&units[1]) && !names_a_test(&units[2]));
    assert!(!names_a_test("tests/….rs, tests/no_such_test.rs"));
    assert!(names_a_test("`tests/layers.rs`") && !names_a_test("`tests/docs_truth.rs`"));
    let rows = [("1.725".to_owned(), "1.441".to_owned())];
    let ratio = |text: &str| ratios(text).remove(0);
    assert!(quoted(&ratio("1.441–1.725×"), &rows));
    assert!(quoted(&ratio("1.725×"), &rows));
    assert!(!quoted(&ratio("1.5–1.9×"), &rows));
}

/// `leasehold … --help` for `command` (words).
fn help(command: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(command)
        .arg("--help")
        .env_clear()
        .output()
        .expect("the tool runs");
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

/// Every command path of the tool (`[]`, `["journal"]`, `["journal", "show"]`, ...) and its
/// help text.
fn every_help() -> Vec<(Vec<String>, String)> {
    let mut found = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    while let Some(path) = pending.pop() {
        let words: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&words);
        for child in subcommands(&text) {
            let mut child_path = path.clone();
            child_path.push(child);
            pending.push(child_path);
        }
        found.push((path, text));
    }
    found
}

/// The long flags a help text defines (`      --keep <N>`, `  -h, --help`), not those its
/// prose mentions.
fn defined_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = match line.strip_prefix('-') {
                Some(rest) if !rest.starts_with('-') => rest.split_once(", ")?.1,
                _ => line,
            };
            let flag = line.strip_prefix("--")?.split_whitespace().next()?;
            Some(format!("--{flag}"))
        })
        .collect()
}

/// The `--flag` words of `text`: `--` then a lowercase letter, at the start of a word.
fn mentioned_flags(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for (at, _) in text.match_indices("--") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = text[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let name = name.trim_end_matches('-');
        if name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.insert(format!("--{name}"));
        }
    }
    flags
}

/// The `LEASEHOLD_*` variable names in `text`.
fn variables(text: &str) -> BTreeSet<String> {
    text.match_indices("LEASEHOLD_")
        .map(|(at, _)| {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            name.trim_end_matches('_').to_owned()
        })
        .filter(|name| name.len() > "LEASEHOLD_".len())
        .collect()
}

/// The guide's chapter on the tool.
fn command_section() -> &'static str {
    assert!(
        TOOL.starts_with("# The `leasehold` command"),
        "docs/guide/tool.md's title"
    );
    TOOL
}

/// The commands the section shows: `leasehold WORD` in backticks or at the start of a line of
/// a code block, with the second word for `journal`.
fn shown_commands(section: &str) -> BTreeSet<Vec<String>> {
    let mut shown = BTreeSet::new();
    let mut fenced = false;
    for line in section.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let mut starts: Vec<&str> = line
            .match_indices("`leasehold ")
            .map(|(at, _)| &line[at + 1..])
            .collect();
        if fenced && line.starts_with("leasehold ") {
            starts.push(line);
        }
        for start in starts {
            let mut words = start
                .split(|c: char| c.is_whitespace() || c == '`')
                .skip(1)
                .take_while(|word| word.starts_with(|c: char| c.is_ascii_lowercase()));
            let Some(first) = words.next() else { continue };
            let mut command = vec![first.to_owned()];
            if first == "journal"
                && let Some(second) = words.next()
            {
                command.push(second.split('|').next().unwrap_or(second).to_owned());
            }
            shown.insert(command);
        }
    }
    shown
}

#[test]
fn readme_names_only_flags_commands_and_variables_the_tool_has() {
    let helps = every_help();
    let defined: BTreeSet<String> = helps.iter().flat_map(|(_, h)| defined_flags(h)).collect();
    let listed: BTreeSet<String> = helps.iter().flat_map(|(_, h)| variables(h)).collect();
    let commands: BTreeSet<Vec<String>> = helps.iter().map(|(path, _)| path.clone()).collect();
    assert!(
        defined.contains("--keep") && defined.contains("--endpoints"),
        "{defined:?}"
    );

    let section = command_section();
    let mut wrong = Vec::new();
    for flag in mentioned_flags(section) {
        if !defined.contains(&flag) {
            wrong.push(format!(
                "docs/guide/tool.md names {flag}, which no `leasehold … --help` defines"
            ));
        }
    }
    let named = variables(section);
    for variable in named.difference(&listed) {
        wrong.push(format!(
            "docs/guide/tool.md names {variable}, which no `leasehold … --help` lists"
        ));
    }
    for variable in listed.difference(&named) {
        wrong.push(format!(
            "`leasehold --help` lists {variable}, which docs/guide/tool.md does not name"
        ));
    }
    let shown = shown_commands(section);
    assert!(shown.len() >= 8, "{shown:?}");
    for command in shown {
        if !commands.contains(&command) {
            wrong.push(format!(
                "docs/guide/tool.md shows `leasehold {}`, which is not a command",
                command.join(" ")
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The workspace's root: the library's package, above this one.
fn workspace() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tool's package sits in the workspace")
}
