//! The dependency rule of docs/architecture.md section 9, read from the source: every
//! `crate::<module>` path in non-test code under src/ must point at a layer below its own (or at
//! one of the few same-layer edges the table allows). A violation fails naming the file, the
//! line and the forbidden edge; so does a top-level module the table does not place, and any
//! cycle between top-level modules.
//!
//! Non-test code: comments and string literals are blanked first; an item marked
//! `#[cfg(test)]` (an inline `mod tests { .. }`, a test helper fn) is skipped, and so is the file
//! of a `#[cfg(test)] mod NAME;` declaration. Doc links in comments are not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules, bottom layer first. A module may import the modules of lower layers only,
/// less the exclusions of [`FORBIDDEN`], plus the same-layer edges of [`PEER_EDGES`].
const LAYERS: &[&[&str]] = &[
    &["units", "numerics"],
    &["config"],
    &["tokenizer"],
    &["checkpoint"],
    &["backend"],
    &["devices"],
    &["model"],
    &["record"],
    &["probe", "report", "synth"],
    &["run"],
    &["cli"],
];

/// Same-layer imports that are allowed: the synthetic planted model draws its calibration text
/// from the probe's haystack generator.
const PEER_EDGES: &[(&str, &str)] = &[("synth", "probe")];

/// Lower layers a module must not import all the same: numerics and units are leaves; the
/// record schema and the report know nothing of how records were computed.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("numerics", &["units"]),
    ("units", &["numerics"]),
    (
        "record",
        &["model", "backend", "devices", "checkpoint", "tokenizer"],
    ),
    (
        "report",
        &["model", "backend", "devices", "checkpoint", "tokenizer"],
    ),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Why `from` may not import `to`, or `None` when it may.
fn forbidden(from: &str, to: &str) -> Option<String> {
    let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
        return Some(format!("`{to}` is not a module of the layer table"));
    };
    if FORBIDDEN
        .iter()
        .any(|(m, banned)| *m == from && banned.contains(&to))
    {
        return Some(format!(
            "{from} must not import {to} (docs/architecture.md section 9)"
        ));
    }
    if b < a || PEER_EDGES.contains(&(from, to)) {
        return None;
    }
    Some(if a == b {
        format!("{from} and {to} are one layer and this edge is not among the allowed ones")
    } else {
        format!("{to} is a layer above {from}")
    })
}

/// The source with comments, string and char literals replaced by spaces (newlines kept).
fn blank_comments_and_strings(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &b[i..j.min(b.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a): a lifetime has no
            // closing quote right after its first character.
            let is_char = match next {
                Some('\\') => true,
                Some(_) => b.get(i + 2) == Some(&'\''),
                None => false,
            };
            if is_char {
                let mut j = i + 1;
                if b[j] == '\\' {
                    j += 1;
                }
                j += 1;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                for _ in i..=j.min(b.len() - 1) {
                    out.push(' ');
                }
                i = j + 1;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// Blanks every item marked `#[cfg(test)]` in already-cleaned source, and returns the names of
/// out-of-line test modules (`#[cfg(test)] mod NAME;`).
fn blank_test_items(clean: &str) -> (String, Vec<String>) {
    let mut text: Vec<char> = clean.chars().collect();
    let mut test_files = Vec::new();
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + marker.len() <= text.len() {
        if text[i..i + marker.len()] != marker[..] {
            i += 1;
            continue;
        }
        // The item runs to its first `;` at depth 0, or to the `}` closing its first `{`.
        let mut j = i + marker.len();
        let mut depth = 0usize;
        while j < text.len() {
            match text[j] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        let item: String = text[i + marker.len()..j.min(text.len())].iter().collect();
        let words: Vec<&str> = item.split_whitespace().collect();
        if let Some(p) = words.iter().position(|w| *w == "mod") {
            if text.get(j) == Some(&';') {
                if let Some(name) = words.get(p + 1) {
                    test_files.push(name.trim_end_matches(';').to_string());
                }
            }
        }
        for ch in text.iter_mut().take((j + 1).min(clean.len())).skip(i) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
        i = j + 1;
    }
    (text.into_iter().collect(), test_files)
}

/// `(line, module)` of every `crate::module` path in non-test code.
fn crate_paths(src: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let (code, test_files) = blank_test_items(&blank_comments_and_strings(src));
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(p) = rest.find("crate::") {
            let before = rest[..p].chars().last();
            rest = &rest[p + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // e.g. `needlescope_crate::`
            }
            if let Some(group) = rest.strip_prefix('{') {
                // `crate::{a::X, b}`: the first segment of each entry.
                let inner = group.split('}').next().unwrap_or("");
                for entry in inner.split(',') {
                    let name: String = entry
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push((n + 1, name));
                    }
                }
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
        }
    }
    (out, test_files)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under src/ belongs to (`None`: lib.rs, main.rs).
fn top_module(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if rel.components().count() == 1 {
        let stem = first.trim_end_matches(".rs");
        return (!matches!(stem, "lib" | "main")).then(|| stem.to_string());
    }
    Some(first)
}

/// Every edge `(from, to)` with the places it occurs, over the non-test code of `src`.
fn edges(src: &Path) -> BTreeMap<(String, String), Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut test_files = BTreeSet::new();
    let mut found: Vec<(PathBuf, usize, String, String)> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let (paths, tests) = crate_paths(&text);
        let dir = if f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
        {
            f.parent().unwrap().to_path_buf()
        } else {
            f.with_extension("")
        };
        for t in tests {
            test_files.insert(dir.join(format!("{t}.rs")));
            test_files.insert(dir.join(&t).join("mod.rs"));
        }
        let rel = f.strip_prefix(src).unwrap();
        let Some(from) = top_module(rel) else {
            continue;
        };
        for (line, to) in paths {
            if to != from {
                found.push((f.clone(), line, from.clone(), to));
            }
        }
    }
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (f, line, from, to) in found {
        if test_files.contains(&f) {
            continue;
        }
        let rel = f.strip_prefix(src.parent().unwrap()).unwrap();
        let place = format!("{}:{line}", rel.display());
        out.entry((from, to)).or_default().push(place);
    }
    out
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_import_points_down_the_layers() {
    let mut violations = Vec::new();
    for ((from, to), places) in edges(&src_dir()) {
        if let Some(why) = forbidden(&from, &to) {
            for p in places {
                violations.push(format!("{p}: {from} -> {to}: {why}"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports that break the layers of docs/architecture.md section 9:\n{}",
        violations.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    let declared: Vec<String> = blank_comments_and_strings(&lib)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    assert!(!declared.is_empty(), "src/lib.rs declares no module");
    let unplaced: Vec<&String> = declared.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "src/lib.rs declares modules the layer table of tests/architecture/main.rs (and \
         docs/architecture.md section 9) does not place: {unplaced:?}"
    );
    let placed: BTreeSet<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    let gone: Vec<&&str> = placed
        .iter()
        .filter(|m| !declared.iter().any(|d| d == **m))
        .collect();
    assert!(
        gone.is_empty(),
        "the layer table names modules src/lib.rs lacks: {gone:?}"
    );
}

#[test]
fn the_top_level_module_graph_has_no_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges(&src_dir()).into_keys() {
        graph.entry(from).or_default().insert(to);
    }
    // Depth-first search for a back edge; the path to it is the cycle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(p) = path.iter().position(|n| n == node) {
            let mut cycle = path[p..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            panic!(
                "import cycle between top-level modules: {}",
                cycle.join(" -> ")
            );
        }
    }
}

/// The checker itself: it must see real imports and only those.
#[test]
fn the_checker_finds_imports_and_ignores_tests_comments_and_strings() {
    let src = r##"
//! Doc: [`crate::cli::x`] is a link, not an import.
use crate::model::Model;
use crate::{backend::Backend, numerics};
fn f() -> &'static str { let _c = '"'; let _l: &'static str = "crate::cli"; r#"crate::run"# }
fn g<'a>(x: &'a str) -> &'a str { crate::units::group_digits(1); x }
/* crate::report */
#[cfg(test)]
mod tests {
    use crate::cli::Cli;
    fn h() { let _ = "}"; }
}
#[cfg(test)]
fn helper() { crate::run::x(); }
#[cfg(test)]
mod ledger_tests;
pub fn after() { crate::devices::plan::x(); }
"##;
    let (paths, test_files) = crate_paths(src);
    let names: Vec<(usize, &str)> = paths.iter().map(|(l, m)| (*l, m.as_str())).collect();
    assert_eq!(
        names,
        [
            (3, "model"),
            (4, "backend"),
            (4, "numerics"),
            (6, "units"),
            (17, "devices")
        ]
    );
    assert_eq!(test_files, ["ledger_tests"]);
    assert!(forbidden("backend", "model").is_some());
    assert!(forbidden("model", "backend").is_none());
    assert!(forbidden("report", "model").is_some());
    assert!(forbidden("record", "backend").is_some());
    assert!(forbidden("probe", "report").is_some());
    assert!(forbidden("synth", "probe").is_none());
    assert!(forbidden("probe", "synth").is_some());
    assert!(forbidden("run", "cli").is_some());
    assert!(forbidden("numerics", "units").is_some());
    assert!(forbidden("cli", "run").is_none());
    assert!(forbidden("model", "wat").is_some());
}
