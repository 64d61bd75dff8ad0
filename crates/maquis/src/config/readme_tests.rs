//! The README's configuration tables against the code: every option's dotted key, its
//! environment variable and its default.
//!
//! A table is any table of README.md whose header is `| key | environment | flag | default |
//! meaning |`. In a row, the key is the first backticked word of the first cell, followed for an
//! overlay's option by the overlay in parentheses (`` `overlay.active_size` (peer-to-peer) ``);
//! the environment variable is the first backticked word of the second cell; the default is the
//! first backticked word of the fourth cell (quotes aside), or no backticked word for an option
//! that is unset by default.

use std::collections::{BTreeMap, HashMap};

use super::keys::{self, env_name};
use super::{Config, OverlayConfig, OverlayKind};

/// One row of a configuration table.
#[derive(Debug)]
struct Row {
    line: usize,
    env: Option<String>,
    default: Option<String>,
}

/// An option: its dotted key and, for an overlay's option, the overlay's name.
type Key = (String, Option<String>);

const HEADER: [&str; 5] = ["key", "environment", "flag", "default", "meaning"];

/// The cells of a table line (a `\|` inside a cell is not a separator).
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The first backticked word of a cell, and what follows it.
fn code(cell: &str) -> Option<(String, &str)> {
    let (_, rest) = cell.split_once('`')?;
    let (word, after) = rest.split_once('`')?;
    Some((word.trim().to_string(), after))
}

/// The rows of every configuration table of `readme`, by key; a key listed twice is an error.
fn readme_rows(readme: &str) -> (BTreeMap<Key, Row>, Vec<String>) {
    let mut rows = BTreeMap::new();
    let mut problems = Vec::new();
    let mut in_table = false;
    for (i, line) in readme.lines().enumerate() {
        let line_no = i + 1;
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let c = cells(line);
        if c.iter().map(String::as_str).eq(HEADER) {
            in_table = true;
            continue;
        }
        if !in_table || c.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':')) {
            continue;
        }
        let Some((key, after)) = code(&c[0]) else {
            problems.push(format!(
                "README.md:{line_no}: a row without a backticked key"
            ));
            continue;
        };
        let kind = after
            .trim()
            .strip_prefix('(')
            .and_then(|s| s.split_once(')'))
            .map(|(k, _)| k.trim().to_string());
        let row = Row {
            line: line_no,
            env: c.get(1).and_then(|c| code(c)).map(|(w, _)| w),
            default: c.get(3).and_then(|c| code(c)).map(|(w, _)| w),
        };
        if let Some(first) = rows.insert((key.clone(), kind), row) {
            problems.push(format!(
                "README.md:{line_no}: `{key}` is listed again (first on line {})",
                first.line
            ));
        }
    }
    (rows, problems)
}

/// Every option of the code with its default as TOML (`None`: unset by default).
fn code_defaults() -> BTreeMap<Key, Option<String>> {
    let config = toml::Table::try_from(Config::default()).unwrap();
    let overlays: HashMap<OverlayKind, toml::Table> = OverlayKind::ALL
        .into_iter()
        .map(|k| (k, toml::Table::try_from(OverlayConfig::from(k)).unwrap()))
        .collect();
    keys::all()
        .into_iter()
        .map(|(key, kind)| {
            let (section, name) = key.split_once('.').unwrap();
            let value = match kind {
                Some(kind) => overlays[&kind].get(name),
                None => config.get(section).and_then(|s| s.get(name)),
            };
            let kind = kind.map(|k| k.as_str().to_string());
            ((key, kind), value.map(toml::Value::to_string))
        })
        .collect()
}

fn unquoted(s: &str) -> &str {
    s.trim().trim_matches('"')
}

fn show(key: &Key) -> String {
    match &key.1 {
        Some(kind) => format!("`{}` ({kind})", key.0),
        None => format!("`{}`", key.0),
    }
}

/// The disagreements between the README's tables and the code.
fn mismatches(readme: &str) -> Vec<String> {
    let (rows, mut problems) = readme_rows(readme);
    let code = code_defaults();
    for (key, default) in &code {
        let env = env_name(&key.0);
        let default_cell = default
            .as_deref()
            .map_or("none".into(), |d| format!("`{d}`"));
        let Some(row) = rows.get(key) else {
            problems.push(format!(
                "{} is missing from the README (environment `{env}`, default {default_cell})",
                show(key)
            ));
            continue;
        };
        if row.env.as_deref() != Some(env.as_str()) {
            problems.push(format!(
                "README.md:{}: {} has environment {:?}, the code reads `{env}`",
                row.line,
                show(key),
                row.env
            ));
        }
        let same = match (default, &row.default) {
            (Some(d), Some(r)) => unquoted(d) == unquoted(r),
            (None, None) => true,
            _ => false,
        };
        if !same {
            let readme = row
                .default
                .as_deref()
                .map_or("none".into(), |d| format!("`{d}`"));
            problems.push(format!(
                "README.md:{}: {} has default {readme}, the code has {default_cell}",
                row.line,
                show(key)
            ));
        }
    }
    for (key, row) in &rows {
        if !code.contains_key(key) {
            problems.push(format!(
                "README.md:{}: {} is not an option of the code",
                row.line,
                show(key)
            ));
        }
    }
    problems
}

#[test]
fn readme_tables_match_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let problems = mismatches(&readme);
    assert!(
        problems.is_empty(),
        "README.md's configuration tables (header `| key | environment | flag | default | \
         meaning |`) disagree with the code:\n  - {}\n",
        problems.join("\n  - ")
    );
}

#[test]
fn readme_toml_examples_are_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let mut blocks = 0;
    let mut lines = readme.lines().enumerate();
    while let Some((start, line)) = lines.next() {
        if line.trim() != "```toml" {
            continue;
        }
        let text: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim() != "```")
            .collect();
        let config = Config::from_toml(&text.join("\n"))
            .unwrap_or_else(|e| panic!("README.md:{}: {e}", start + 1));
        config
            .validate()
            .unwrap_or_else(|e| panic!("README.md:{}: {e}", start + 1));
        blocks += 1;
    }
    assert!(blocks >= 3, "the README's TOML examples: {blocks} found");
}

#[test]
fn the_readme_check_sees_a_changed_default() {
    let rows = |body: &str| {
        format!("| key | environment | flag | default | meaning |\n|---|---|---|---|---|\n{body}")
    };
    let good = "| `transport.parallelism` | `MAQUIS_TRANSPORT_PARALLELISM` | | `1` | lanes |\n\
                | `node.admin` | `MAQUIS_NODE_ADMIN` | | none | |\n\
                | `overlay.active_size` (peer-to-peer) | `MAQUIS_OVERLAY_ACTIVE_SIZE` | | `5` | |";
    let problems = mismatches(&rows(good));
    assert!(
        !problems
            .iter()
            .any(|p| p.contains("`transport.parallelism`")
                || p.contains("`node.admin`")
                || p.contains("`overlay.active_size` (peer-to-peer)")),
        "{problems:#?}"
    );
    let bad = "| `transport.parallelism` | `MAQUIS_PARALLELISM` | | `2` | lanes |\n\
               | `node.admin` | `MAQUIS_NODE_ADMIN` | | `127.0.0.1:1` | |\n\
               | `overlay.active_size` | `MAQUIS_OVERLAY_ACTIVE_SIZE` | | `5` | |\n\
               | `transport.lanes` | `MAQUIS_TRANSPORT_LANES` | | `1` | |";
    let problems = mismatches(&rows(bad)).join("\n");
    for expected in [
        "`transport.parallelism` has default `2`, the code has `1`",
        "`transport.parallelism` has environment Some(\"MAQUIS_PARALLELISM\")",
        "`node.admin` has default `127.0.0.1:1`, the code has none",
        "`overlay.active_size` is not an option of the code",
        "`overlay.active_size` (peer-to-peer) is missing from the README",
        "`transport.lanes` is not an option of the code",
    ] {
        assert!(
            problems.contains(expected),
            "{expected}\nnot in\n{problems}"
        );
    }
}
