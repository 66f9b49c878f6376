//! The documentation holds to its sources, without etcd:
//!
//! - every ratio README.md, the guide (docs/guide/) and docs/production.md state (a number,
//!   or a range of two, with `×` right after its digits) is quoted from BENCHMARKS.md, or its
//!   paragraph names the test that measures it (the rule is written at the top of
//!   BENCHMARKS.md);
//! - every `--flag` the guide's chapters on the tool (hosting, operating, production) name is
//!   defined by some command of the `leasehold` tool (its `--help`), every `LEASEHOLD_*`
//!   variable they name is one the tool's help lists, and every variable the help lists is
//!   named there; the commands they show (`leasehold journal trim`, ...) exist.

mod help;

use std::collections::BTreeSet;

use help::every_help;

/// A chapter of the guide: its path and its text.
macro_rules! chapter {
    ($file:literal) => {
        (
            concat!("docs/guide/", $file),
            include_str!(concat!("../../docs/guide/", $file)),
        )
    };
}

/// README.md, the guide's chapters and the reference pages: every text whose ratios are
/// checked, besides docs/production.md.
const DOCS: &[(&str, &str)] = &[
    ("README.md", include_str!("../../README.md")),
    (GUIDE[0].0, GUIDE[0].1),
    (GUIDE[1].0, GUIDE[1].1),
    (GUIDE[2].0, GUIDE[2].1),
    (GUIDE[3].0, GUIDE[3].1),
    (GUIDE[4].0, GUIDE[4].1),
    (GUIDE[5].0, GUIDE[5].1),
    (GUIDE[6].0, GUIDE[6].1),
    (
        "docs/guarantees.md",
        include_str!("../../docs/guarantees.md"),
    ),
    ("docs/layout.md", include_str!("../../docs/layout.md")),
    ("docs/protocol.md", include_str!("../../docs/protocol.md")),
    ("python/README.md", include_str!("../../python/README.md")),
];
/// The guide's chapters, in order.
const GUIDE: [(&str, &str); 7] = [
    chapter!("1-own-a-session.md"),
    chapter!("2-host-sessions.md"),
    chapter!("3-routing.md"),
    chapter!("4-operate.md"),
    chapter!("5-any-language.md"),
    chapter!("6-testing.md"),
    chapter!("7-production.md"),
];
/// The chapters that show the tool: their flags, variables and commands are checked against
/// its help.
const TOOL: [usize; 3] = [1, 3, 6];
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
    for (file, text) in DOCS
        .iter()
        .copied()
        .chain([("docs/production.md", PRODUCTION)])
    {
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
    for (file, text) in DOCS
        .iter()
        .copied()
        .chain([("docs/production.md", PRODUCTION)])
    {
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

/// The chapters that show the tool, each with its lines that show no other program (`cargo`,
/// `docker-compose`, etcd's own flags), whose flags are not the tool's.
fn tool_chapters() -> Vec<(&'static str, String)> {
    TOOL.iter()
        .map(|&at| {
            let (path, text) = GUIDE[at];
            let own: Vec<&str> = text
                .lines()
                .filter(|line| {
                    !["cargo ", "docker-compose", "etcd --"]
                        .iter()
                        .any(|o| line.contains(o))
                })
                .collect();
            (path, own.join("\n"))
        })
        .collect()
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

    let mut wrong = Vec::new();
    let (mut named, mut shown) = (BTreeSet::new(), BTreeSet::new());
    for (path, section) in tool_chapters() {
        for flag in mentioned_flags(&section) {
            if !defined.contains(&flag) {
                wrong.push(format!(
                    "{path} names {flag}, which no `leasehold … --help` defines"
                ));
            }
        }
        for variable in variables(&section) {
            if !listed.contains(&variable) {
                wrong.push(format!(
                    "{path} names {variable}, which no `leasehold … --help` lists"
                ));
            }
            named.insert(variable);
        }
        for command in shown_commands(&section) {
            if !commands.contains(&command) {
                wrong.push(format!(
                    "{path} shows `leasehold {}`, which is not a command",
                    command.join(" ")
                ));
            }
            shown.insert(command);
        }
    }
    // docs/cli.md, generated from the help, names every variable by construction.
    named.extend(variables(include_str!("../../docs/cli.md")));
    for variable in listed.difference(&named) {
        wrong.push(format!(
            "`leasehold --help` lists {variable}, which no chapter on the tool names"
        ));
    }
    assert!(shown.len() >= 8, "{shown:?}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The backticked words of `text` (inline code, outside code blocks; a span may run over a
/// line break, which it keeps as a space).
fn backticked(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push_str("\n\n");
            continue;
        }
        if !fenced {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    prose
        .split("\n\n")
        .flat_map(|paragraph| paragraph.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

/// Whether a backticked word is a path in the repository: no spaces, placeholders, URLs or
/// paths outside it, and a `/` or a file extension of the repository's.
fn is_repo_path(word: &str) -> bool {
    let outside = ["/", "~", "http", "$", "-", "."];
    let extension = [
        ".rs", ".md", ".sh", ".toml", ".proto", ".py", ".yml", ".txt",
    ];
    !word.is_empty()
        && !word.contains([' ', '{', '}', '…', '*', '<', '=', ':', ',', '(', '|'])
        && !outside.iter().any(|o| word.starts_with(o))
        && word.split('/').any(|segment| segment.len() > 1)
        && (word.contains('/') && word.starts_with(|c: char| c.is_ascii_lowercase())
            || extension.iter().any(|e| word.ends_with(e)) && word.contains('/'))
}

/// Every source file of the workspace (the library's and the tool's), read.
fn sources() -> Vec<(std::path::PathBuf, String)> {
    let mut files = Vec::new();
    let mut pending = vec![workspace().join("src"), workspace().join("cli/src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                files.push((path, text));
            }
        }
    }
    files
}

/// Every file and directory under the workspace's source directories, as a string.
fn tree() -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![workspace().join("src"), workspace().join("cli")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() && !path.ends_with("target") {
                pending.push(path.clone());
            }
            found.push(path.to_string_lossy().into_owned());
        }
    }
    found
}

/// Whether `Type::item` names something the workspace defines: `None` when it defines no
/// `Type` (a type of std or of a dependency, not checked), else whether a file that defines
/// `Type` has an `item` (a function, variant, constant or field).
fn resolves(sources: &[(std::path::PathBuf, String)], path: &str) -> Option<bool> {
    let (ty, item) = path.rsplit_once("::")?;
    let ty = ty.rsplit("::").next()?;
    if !ty.starts_with(|c: char| c.is_ascii_uppercase())
        || !item.chars().all(|c| c.is_alphanumeric() || c == '_')
        || item.is_empty()
    {
        return None;
    }
    let defines = |text: &str| {
        ["struct ", "enum ", "trait ", "type "].iter().any(|kind| {
            text.match_indices(&format!("{kind}{ty}")).any(|(at, m)| {
                let after = text[at + m.len()..].chars().next();
                after.is_none_or(|c| !c.is_alphanumeric() && c != '_')
            })
        })
    };
    let defining: Vec<&str> = (sources.iter())
        .map(|(_, text)| text.as_str())
        .filter(|text| defines(text))
        .collect();
    if defining.is_empty() {
        return None;
    }
    let has = |text: &str| {
        text.match_indices(item).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + item.len()..].chars().next();
            before.is_some_and(|c| !c.is_alphanumeric() && c != '_')
                && after.is_some_and(|c| !c.is_alphanumeric() && c != '_')
        })
    };
    // Methods may be defined in any file of the crate (`impl Store` is spread over several).
    Some(
        defining.iter().any(|text| has(text))
            || sources.iter().any(|(_, text)| {
                let defines_fn = [format!("fn {item}("), format!("fn {item}<")]
                    .iter()
                    .any(|f| text.contains(f.as_str()));
                defines_fn
                    && (text.contains(&format!("impl {ty}")) || text.contains(&format!("for {ty}")))
            }),
    )
}

#[test]
fn every_path_and_item_the_docs_name_exists() {
    let sources = sources();
    let tree = tree();
    let mut wrong = Vec::new();
    let (mut paths, mut items) = (0, 0);
    for (file, text) in DOCS.iter().copied().chain([
        ("docs/production.md", PRODUCTION),
        ("docs/sidecar.md", include_str!("../../docs/sidecar.md")),
        ("ARCHITECTURE.md", include_str!("../../ARCHITECTURE.md")),
    ]) {
        for word in backticked(text) {
            let word = word.as_str();
            if is_repo_path(word) {
                paths += 1;
                let path = word.split('#').next().unwrap_or(word);
                // A path from the root, or from a directory the text names around it
                // (`queue/` inside `src/journal/`): the tail of a path in the repository.
                let tail = format!("/{}", path.trim_end_matches('/'));
                if !workspace().join(path).exists()
                    && !tree.iter().any(|known| known.ends_with(&tail))
                {
                    wrong.push(format!("{file}: `{word}` is no path in the repository"));
                }
            } else if let Some(found) = resolves(&sources, word) {
                items += 1;
                if !found {
                    wrong.push(format!("{file}: `{word}` names nothing the code defines"));
                }
            }
        }
    }
    let mut links = 0;
    for (file, text) in DOCS.iter().copied().chain([
        ("docs/production.md", PRODUCTION),
        ("docs/sidecar.md", include_str!("../../docs/sidecar.md")),
        ("ARCHITECTURE.md", include_str!("../../ARCHITECTURE.md")),
        ("docs/cli.md", include_str!("../../docs/cli.md")),
    ]) {
        let dir = std::path::Path::new(file)
            .parent()
            .expect("a file in a directory");
        for (at, _) in text.match_indices("](") {
            let target = text[at + 2..].split(')').next().unwrap_or_default();
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.contains(' ') {
                continue;
            }
            links += 1;
            if !workspace().join(dir).join(target).exists() {
                wrong.push(format!("{file}: the link to {target} leads nowhere"));
            }
        }
    }
    assert!(
        paths > 50 && items > 50 && links > 30,
        "{paths} paths, {items} items, {links} links checked"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_layout_names_every_file_at_the_top_of_src_deploy_examples_and_docs() {
    let layout = include_str!("../../docs/layout.md");
    let mut missing = Vec::new();
    for dir in ["src", "deploy", "examples", "docs"] {
        for entry in std::fs::read_dir(workspace().join(dir)).expect("a directory") {
            let name = entry.expect("an entry").file_name();
            let path = format!("{dir}/{}", name.to_string_lossy());
            if !layout.contains(&format!("`{path}")) {
                missing.push(path);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/layout.md names none of {missing:?}"
    );
}

#[test]
fn the_path_check_can_fail() {
    let sources = sources();
    assert!(is_repo_path("src/journal/cas.rs") && is_repo_path("cli/tests/"));
    assert!(!is_repo_path("{ns}/owners/{session}") && !is_repo_path("http://x/y"));
    assert!(!workspace().join("src/journal/nothing.rs").exists());
    assert_eq!(resolves(&sources, "Store::acquire_lease"), Some(true));
    assert_eq!(resolves(&sources, "Store::acquire_nothing"), Some(false));
    assert_eq!(resolves(&sources, "Duration::MAX"), None);
    assert_eq!(resolves(&sources, "Admin::connec"), Some(false));
}

/// The workspace's root: the library's package, above this one.
fn workspace() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tool's package sits in the workspace")
}
