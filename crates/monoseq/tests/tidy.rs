//! The documents that map the code, kept true and short: ARCHITECTURE.md's code map names every
//! `.rs` file under a crate's `src` once and nothing else, ARCHITECTURE.md fits in
//! `ARCHITECTURE_BYTES_MAX`, DESIGN.md in `DESIGN_BYTES_MAX` and README.md in
//! `README_LINES_MAX`. Reads files only (no build, no `cargo metadata`); the unit tests at the
//! end break each rule on purpose.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Longest ARCHITECTURE.md: a map a reader takes in at once.
const ARCHITECTURE_BYTES_MAX: usize = 15 * 1024;
/// Longest DESIGN.md: each question with the figure that decided it; measurements and their
/// history go to the benchmark pages under docs/benchmarks/.
const DESIGN_BYTES_MAX: usize = 30 * 1024;
/// Longest README.md: what it is, how to run it, where to go next.
const README_LINES_MAX: usize = 150;
/// The heading after which ARCHITECTURE.md lists the files.
const CODE_MAP_HEADING: &str = "## Code map";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|e| panic!("finding the workspace root: {e}"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The files ARCHITECTURE.md's code map names, as `crates/<crate>/src/<path>`, each as often as
/// it is named. A section heading "### `crates/<crate>/src`" sets the directory of the lines
/// "- `<path>.rs`: ..." below it.
fn code_map(text: &str) -> Vec<String> {
    let Some(start) = text.find(CODE_MAP_HEADING) else {
        return Vec::new();
    };
    let mut dir: Option<&str> = None;
    let mut named = Vec::new();
    for line in text[start + CODE_MAP_HEADING.len()..].lines() {
        if line.starts_with("## ") {
            break;
        }
        if let Some(heading) = line.strip_prefix("### ") {
            dir = heading
                .trim()
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .filter(|h| h.starts_with("crates/") && h.ends_with("/src"));
            continue;
        }
        let Some(file) = line
            .strip_prefix("- `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(file, _)| file)
            .filter(|file| file.ends_with(".rs"))
        else {
            continue;
        };
        match dir {
            Some(dir) => named.push(format!("{dir}/{file}")),
            None => named.push(format!("(no `crates/<crate>/src` heading above)/{file}")),
        }
    }
    named
}

/// Every `.rs` file under `crates/*/src` of `root`, as `crates/<crate>/src/<path>`.
fn src_files(root: &Path) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    let crates = root.join("crates");
    let entries =
        std::fs::read_dir(&crates).unwrap_or_else(|e| panic!("listing {}: {e}", crates.display()));
    let mut stack: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("src")).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(root).unwrap_or(&path);
                files.insert(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    files
}

/// What keeps the code map and the tree apart, one line per file.
fn code_map_mismatches(named: &[String], present: &BTreeSet<String>) -> Vec<String> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for file in named {
        if !seen.insert(file) {
            found.push(format!(
                "ARCHITECTURE.md names {file} twice: keep one line per file"
            ));
        } else if !present.contains(file) {
            found.push(format!(
                "ARCHITECTURE.md names {file}, which does not exist: fix or remove its line"
            ));
        }
    }
    for file in present.iter().filter(|f| !seen.contains(f)) {
        found.push(format!(
            "{file} is not in ARCHITECTURE.md's code map: add a line under its crate's heading"
        ));
    }
    found
}

fn assert_none(rule: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{rule}:\n  {}", found.join("\n  "));
}

#[test]
fn every_src_file_has_its_line_in_the_code_map_and_every_line_its_file() {
    let root = root();
    let named = code_map(&read(&root.join("ARCHITECTURE.md")));
    assert!(
        !named.is_empty(),
        "ARCHITECTURE.md has no `{CODE_MAP_HEADING}` section listing files"
    );
    assert_none(
        "ARCHITECTURE.md's code map and the tree differ",
        code_map_mismatches(&named, &src_files(&root)),
    );
}

#[test]
fn architecture_md_fits_on_one_screen() {
    let bytes = read(&root().join("ARCHITECTURE.md")).len();
    assert!(
        bytes <= ARCHITECTURE_BYTES_MAX,
        "ARCHITECTURE.md has {bytes} bytes, over {ARCHITECTURE_BYTES_MAX}: shorten lines \
         rather than drop files; details belong in DESIGN.md or the module's `//!`"
    );
}

#[test]
fn design_md_keeps_to_decisions_and_their_figures() {
    let bytes = read(&root().join("DESIGN.md")).len();
    assert!(
        bytes <= DESIGN_BYTES_MAX,
        "DESIGN.md has {bytes} bytes, over {DESIGN_BYTES_MAX}: keep each answer to the decision \
         and its deciding figure; move measurements and history to the benchmark page it links"
    );
}

#[test]
fn readme_stays_a_first_read() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= README_LINES_MAX,
        "README.md has {lines} lines, over {README_LINES_MAX}: operating details belong in \
         docs/operating.md"
    );
}

// ---------------------------------------------------------------------------------------------
// The rules, broken on purpose.

const MAP: &str = "# Architecture\n\n- `lib.rs`: not in the code map, ignored.\n\n## Code map\n\n\
### `crates/a/src`\n\n- `lib.rs`: a.\n- `gone.rs`: a file that was removed.\n\
- `m/n.rs` (`feature`): nested.\n\n### `crates/b/src`\n\n- `lib.rs`: b.\n\n## Cross-cutting\n\n\
- `after.rs`: past the map, ignored.\n";

fn present(files: &[&str]) -> BTreeSet<String> {
    files.iter().map(|f| (*f).to_owned()).collect()
}

#[test]
fn the_code_map_is_read_per_crate_heading_and_only_in_its_section() {
    assert_eq!(
        code_map(MAP),
        [
            "crates/a/src/lib.rs",
            "crates/a/src/gone.rs",
            "crates/a/src/m/n.rs",
            "crates/b/src/lib.rs"
        ]
    );
}

#[test]
fn a_file_without_a_line_and_a_line_without_a_file_are_both_reported() {
    let tree = present(&[
        "crates/a/src/lib.rs",
        "crates/a/src/m/n.rs",
        "crates/a/src/new.rs",
        "crates/b/src/lib.rs",
    ]);
    let found = code_map_mismatches(&code_map(MAP), &tree);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("names crates/a/src/gone.rs, which does not exist"));
    assert!(found[1].contains("crates/a/src/new.rs is not in ARCHITECTURE.md's code map"));
}

#[test]
fn a_file_named_twice_is_reported() {
    let map = "## Code map\n### `crates/a/src`\n- `lib.rs`: a.\n- `lib.rs`: again.\n";
    let found = code_map_mismatches(&code_map(map), &present(&["crates/a/src/lib.rs"]));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("twice"));
}

#[test]
fn a_map_that_equals_the_tree_reports_nothing() {
    let tree = present(&[
        "crates/a/src/lib.rs",
        "crates/a/src/gone.rs",
        "crates/a/src/m/n.rs",
        "crates/b/src/lib.rs",
    ]);
    assert!(code_map_mismatches(&code_map(MAP), &tree).is_empty());
}
