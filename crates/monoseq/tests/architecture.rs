//! ARCHITECTURE.md, enforced. Reads `cargo metadata` (no build) and the workspace's sources and
//! fails on a dependency the crate graph does not draw (normal or dev), a cycle among the
//! workspace's crates (dev-dependencies count), an HTTP, CLI or JSON library outside the edge
//! crates, a storage engine outside the kv crate, a server framework, storage engine or database
//! driver anywhere in the client's dependency tree, a `json!` body in the server crate (every
//! body is a `monoseq-wire` type), a clock read or a sleep in the core's state machine, a bare literal where the crate names that limit, a function in `src` longer
//! than `FUNCTION_LINES_MAX`, and two modules of a crate importing each other
//! (`MODULE_CIRCLES`). Each rule is a
//! pure function over parsed inputs; the unit tests at the end break each rule on purpose and
//! check that it is reported.

mod architecture {
    pub mod source;
}

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use architecture::source::{self, Source};

// ---------------------------------------------------------------------------------------------
// The rules' data: what ARCHITECTURE.md says, as constants.

/// Per workspace crate: the workspace crates it may depend on, and those it may also
/// dev-depend on (a dev-dependency on a normal dependency, or on itself, is always allowed).
/// This is the crate graph ARCHITECTURE.md draws; change both together.
const ALLOWED: &[(&str, &[&str], &[&str])] = &[
    ("monoseq-core", &["monoseq-wire"], &[]),
    ("monoseq-kv", &[], &[]),
    ("monoseq-backoff", &[], &[]),
    ("monoseq-seglog", &[], &[]),
    ("monoseq-membership", &["monoseq-backoff"], &[]),
    ("monoseq-wire", &[], &[]),
    ("monoseq-pg", &["monoseq-kv"], &[]),
    (
        "monoseq-store",
        &["monoseq-core", "monoseq-kv", "monoseq-seglog"],
        &[],
    ),
    ("monoseq-named", &["monoseq-backoff", "monoseq-kv"], &[]),
    (
        "monoseq-named-http",
        &["monoseq-named", "monoseq-wire"],
        &["monoseq-client", "monoseq-kv"],
    ),
    (
        "monoseq-cp",
        &[
            "monoseq-backoff",
            "monoseq-core",
            "monoseq-kv",
            "monoseq-store",
        ],
        &[],
    ),
    (
        "monoseq-verify",
        &["monoseq-core", "monoseq-kv", "monoseq-store"],
        &[],
    ),
    (
        "monoseq-client",
        &["monoseq-backoff", "monoseq-named", "monoseq-wire"],
        &[],
    ),
    (
        "monoseq-sim",
        &[
            "monoseq-core",
            "monoseq-cp",
            "monoseq-kv",
            "monoseq-membership",
            "monoseq-store",
        ],
        &[],
    ),
    (
        "monoseq",
        &[
            "monoseq-backoff",
            "monoseq-client",
            "monoseq-core",
            "monoseq-cp",
            "monoseq-kv",
            "monoseq-membership",
            "monoseq-named",
            "monoseq-named-http",
            "monoseq-pg",
            "monoseq-store",
            "monoseq-verify",
            "monoseq-wire",
        ],
        &[],
    ),
];

/// The crates at the edge: the only ones that may use `EDGE_LIBRARIES`.
const EDGE_CRATES: &[&str] = &[
    "monoseq",
    "monoseq-named-http",
    "monoseq-client",
    "monoseq-wire",
];

/// HTTP, command-line and JSON libraries: the edge's business.
const EDGE_LIBRARIES: &[&str] = &["axum", "hyper", "reqwest", "clap", "serde_json"];

/// Inner crates that use `serde_json` for a stored format, not for HTTP: (crate, why).
const STORED_JSON: &[(&str, &str)] = &[
    (
        "monoseq-store",
        "the data directory's identity file and a backup's stamp are JSON",
    ),
    (
        "monoseq-named",
        "a named sequence's stored object and its metadata are JSON",
    ),
    (
        "monoseq-cp",
        "a command's fields are JSON values, hashed for its idempotency fingerprint",
    ),
];

/// The storage engines, and the one crate that may use them: everything above it reaches
/// storage through `KvStore`.
const ENGINES: &[&str] = &["fjall", "redb"];
const ENGINE_CRATE: &str = "monoseq-kv";

/// The crate a client of the HTTP API builds, and what its normal dependency tree (transitively,
/// with the features it resolves to) must not hold: a client needs an HTTP client and the wire
/// types, not a server framework, a storage engine or a database driver. (package, feature):
/// with a feature, only that feature of the package is refused (hyper is the HTTP client's
/// too; its `server` half is not). reqwest's own tower-http (redirects) is client-side.
const LIGHT_CLIENT: &str = "monoseq-client";
const NOT_IN_THE_CLIENT: &[(&str, Option<&str>)] = &[
    // Server frameworks.
    ("axum", None),
    ("axum-core", None),
    ("actix-web", None),
    ("warp", None),
    ("hyper", Some("server")),
    ("hyper-util", Some("server")),
    ("monoseq-named-http", None),
    // Storage engines and the crates that open them.
    ("fjall", None),
    ("lsm-tree", None),
    ("redb", None),
    ("monoseq-kv", None),
    ("object_store", None),
    // Database drivers.
    ("postgres", None),
    ("tokio-postgres", None),
    ("postgres-protocol", None),
    ("sqlx", None),
    ("monoseq-pg", None),
];

/// The crate whose `src` writes no JSON by hand: every body it reads or writes is a type of
/// the wire crate (`monoseq-wire`), so the protocol has one owner.
const TYPED_JSON_CRATE: &str = "monoseq";

/// The files of `monoseq-core/src` that may read a clock or sleep: the driver, the caller's
/// bounded wait for actualization, and the conformance suite. Every other file is the state
/// machine.
const CORE_CLOCK_FILES: &[&str] = &["driver.rs", "wait.rs", "conformance.rs"];

/// What reads a clock or sleeps.
const CLOCK_CALLS: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    "thread::sleep",
    "time::sleep",
    "sleep_until",
    "wait_timeout",
];

/// Up to this value a number is too common (tags, widths, small counts, indexes) to tell
/// whether a literal means a constant of the same value; the bare-literal rule looks above it.
const COMMON_VALUE_MAX: u128 = 16;

/// Bare literals that equal a constant of their crate by coincidence: (file, value, why).
const COINCIDENCES: &[(&str, u128, &str)] = &[
    (
        "monoseq-store/src/backup.rs",
        1_000,
        "milliseconds in a second, not a session timeout",
    ),
    (
        "monoseq-sim/src/follow.rs",
        20,
        "the shortest pause of a follower after a failed read, in ms, not answers lost",
    ),
    (
        "monoseq-sim/src/lib.rs",
        20,
        "fault odds and the partition faults' roll ranges, not answers lost",
    ),
    (
        "monoseq-sim/src/lib.rs",
        200,
        "the shortest database outage, in ms, not a follower's idle pause",
    ),
    (
        "monoseq-sim/src/lib.rs",
        32,
        "a fault roll's range, not a consumer's page",
    ),
    (
        "monoseq/src/edge.rs",
        4096,
        "the bytes of a shed connection's scratch buffer, not events a follower's hub keeps",
    ),
    (
        "monoseq/src/edge/connection.rs",
        20,
        "the watchdog's shortest tick in ms, not problems shown",
    ),
    (
        "monoseq-core/src/ws_table.rs",
        64,
        "the bits of a u64 in the hash, not sequences of a kind",
    ),
    (
        "monoseq-store/src/backup.rs",
        60,
        "seconds in a minute, not a CRC offset",
    ),
    (
        "monoseq-store/src/codec.rs",
        64,
        "an encoding buffer's starting capacity",
    ),
    (
        "monoseq-sim/src/lib.rs",
        1_000,
        "a bound of a fault's random duration in ms",
    ),
    (
        "monoseq-sim/src/lib.rs",
        1_500,
        "a fault's duration bound and the quiet margin in ms",
    ),
    (
        "monoseq-sim/src/lib.rs",
        2_000,
        "a bound of a fault's random duration in ms",
    ),
];

/// Test suites compiled into `src` under a feature: their numbers are test data, not limits.
const TEST_SUITE_FILES: &[&str] = &["conformance.rs"];

/// The longest a function in a crate's `src` may be, signature and braces included.
const FUNCTION_LINES_MAX: usize = 70;

/// Functions allowed past `FUNCTION_LINES_MAX` ("crate/src/path.rs::name"): none. A function
/// that grows past it is split by what it does.
const LONG_FUNCTIONS: &[&str] = &[];

/// Pairs of a crate's top-level modules that still import each other ("crate: a ↔ b"), each a
/// module hiding in two: move what both need into one below them, then drop the pair. No other
/// pair may import each other (tests left out), and a pair listed that no longer does fails.
const MODULE_CIRCLES: &[&str] = &[];

// ---------------------------------------------------------------------------------------------
// Parsed inputs.

/// The kind of a dependency, as `cargo metadata` names it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Normal,
    Dev,
    Build,
}

/// A declared dependency of a workspace crate.
#[derive(Clone, Debug)]
struct Dep {
    name: String,
    kind: Kind,
}

/// A workspace crate: its name, directory and declared dependencies.
#[derive(Clone, Debug)]
struct Crate {
    name: String,
    dir: PathBuf,
    deps: Vec<Dep>,
}

impl Crate {
    fn internal_deps<'a>(&'a self, names: &'a BTreeSet<String>) -> impl Iterator<Item = &'a Dep> {
        self.deps
            .iter()
            .filter(move |d| names.contains(&d.name) && d.name != self.name)
    }
}

fn names(crates: &[Crate]) -> BTreeSet<String> {
    crates.iter().map(|c| c.name.clone()).collect()
}

/// The workspace's crates from `cargo metadata --no-deps` (which lists every declared
/// dependency with its kind, dev ones included).
fn workspace() -> Vec<Crate> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running `cargo metadata`: {e}"));
    assert!(
        output.status.success(),
        "`cargo metadata` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("`cargo metadata` printed no JSON: {e}"));
    parse_metadata(&metadata)
}

fn parse_metadata(metadata: &serde_json::Value) -> Vec<Crate> {
    let packages = metadata["packages"]
        .as_array()
        .expect("`packages` is a list");
    packages.iter().map(parse_package).collect()
}

fn parse_package(package: &serde_json::Value) -> Crate {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let manifest = PathBuf::from(text(&package["manifest_path"]));
    let deps = package["dependencies"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let deps = deps
        .iter()
        .map(|d| Dep {
            name: text(&d["name"]),
            kind: match d["kind"].as_str() {
                Some("dev") => Kind::Dev,
                Some("build") => Kind::Build,
                _ => Kind::Normal,
            },
        })
        .collect();
    let dir = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    Crate {
        name: text(&package["name"]),
        dir,
        deps,
    }
}

/// An entry of `cargo tree -e normal,features --prefix none`: a package (`name vX.Y.Z …`) or
/// one of its enabled features (`name feature "f"`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct TreeEntry {
    package: String,
    feature: Option<String>,
}

/// The normal dependency tree of `package`, features resolved as a build of it alone resolves
/// them (unlike `cargo metadata`, which unifies the workspace's features).
fn dependency_tree(package: &str) -> Vec<TreeEntry> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["tree", "-p", package, "-e", "normal,features"])
        .args(["--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("running `cargo tree`: {e}"));
    assert!(
        output.status.success(),
        "`cargo tree` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_tree(&String::from_utf8_lossy(&output.stdout))
}

fn parse_tree(text: &str) -> Vec<TreeEntry> {
    let entries: BTreeSet<TreeEntry> = text
        .lines()
        .filter_map(|line| {
            let (package, rest) = line.trim().split_once(' ')?;
            let feature = rest
                .strip_prefix("feature \"")
                .and_then(|f| f.split_once('"'))
                .map(|(f, _)| f.to_owned());
            Some(TreeEntry {
                package: package.to_owned(),
                feature,
            })
        })
        .collect();
    entries.into_iter().collect()
}

/// Every `.rs` file under a crate's `src`, read and lexed, with paths like
/// `monoseq-core/src/worker.rs`.
fn sources(krate: &Crate) -> Vec<Source> {
    let mut files = Vec::new();
    let mut stack = vec![krate.dir.join("src")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                let relative = path.strip_prefix(&krate.dir).unwrap_or(&path);
                let name = format!("{}/{}", krate.name, relative.display());
                files.push(Source::new(&name, &text));
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    mark_test_module_files(&mut files);
    files
}

/// Marks test-only the files of modules declared `#[cfg(test)] mod name;`.
fn mark_test_module_files(files: &mut [Source]) {
    let mut test_files = Vec::new();
    for file in files.iter() {
        let (dir, stem) = file.path.rsplit_once('/').unwrap_or(("", &file.path));
        let stem = stem.trim_end_matches(".rs");
        let module_dir = match stem {
            "lib" | "main" | "mod" => dir.to_owned(),
            _ => format!("{dir}/{stem}"),
        };
        for name in file.test_module_files() {
            test_files.push(format!("{module_dir}/{name}.rs"));
            test_files.push(format!("{module_dir}/{name}/mod.rs"));
        }
    }
    for file in files.iter_mut().filter(|f| test_files.contains(&f.path)) {
        file.mark_test();
    }
}

// ---------------------------------------------------------------------------------------------
// The rules: each returns what breaks it, one line per finding.

/// A dependency between workspace crates that `allowed` does not draw, or a crate it misses.
fn forbidden_dependencies(crates: &[Crate], allowed: &[(&str, &[&str], &[&str])]) -> Vec<String> {
    let names = names(crates);
    let mut found = Vec::new();
    for krate in crates {
        let Some((_, normal, dev)) = allowed.iter().find(|(name, _, _)| *name == krate.name) else {
            found.push(format!(
                "{} is not in the crate graph: add it to ALLOWED and to ARCHITECTURE.md",
                krate.name
            ));
            continue;
        };
        for dep in krate.internal_deps(&names) {
            let ok = normal.contains(&dep.name.as_str())
                || (dep.kind == Kind::Dev && dev.contains(&dep.name.as_str()));
            if !ok {
                found.push(format!(
                    "{} has a {:?} dependency on {}, which the crate graph does not draw: \
                     remove it, or draw it in ARCHITECTURE.md and ALLOWED",
                    krate.name, dep.kind, dep.name
                ));
            }
        }
    }
    found
}

/// Every cycle among workspace crates, dev-dependencies counted, as `a → b → a`.
fn dependency_cycles(crates: &[Crate]) -> Vec<String> {
    let names = names(crates);
    let edges: BTreeMap<&str, BTreeSet<&str>> = crates
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.internal_deps(&names).map(|d| d.name.as_str()).collect(),
            )
        })
        .collect();
    let mut cycles = BTreeSet::new();
    for start in edges.keys() {
        let mut path = vec![*start];
        find_cycles(&edges, &mut path, &mut cycles);
    }
    cycles
        .into_iter()
        .map(|c| format!("dependency cycle {c}: move the tests or code that close it up a crate"))
        .collect()
}

/// Depth-first from the end of `path`; a cycle back to `path[0]` through crates that sort after
/// it is recorded once, starting at its smallest crate.
fn find_cycles<'a>(
    edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    path: &mut Vec<&'a str>,
    cycles: &mut BTreeSet<String>,
) {
    let last = path[path.len() - 1];
    for &next in edges.get(last).into_iter().flatten() {
        if next == path[0] {
            cycles.insert(format!("{} → {}", path.join(" → "), next));
        } else if next > path[0] && !path.contains(&next) {
            path.push(next);
            find_cycles(edges, path, cycles);
            path.pop();
        }
    }
}

/// An edge library used (normally or in tests) by a crate that is not an edge crate.
fn edge_libraries_inside(crates: &[Crate]) -> Vec<String> {
    let mut found = Vec::new();
    for krate in crates
        .iter()
        .filter(|c| !EDGE_CRATES.contains(&c.name.as_str()))
    {
        for dep in krate
            .deps
            .iter()
            .filter(|d| EDGE_LIBRARIES.contains(&d.name.as_str()))
        {
            let stored_json =
                dep.name == "serde_json" && STORED_JSON.iter().any(|(name, _)| *name == krate.name);
            if !stored_json {
                found.push(format!(
                    "{} uses {} ({:?}), which belongs to the edge crates {EDGE_CRATES:?}: \
                     move that code to an edge crate",
                    krate.name, dep.name, dep.kind
                ));
            }
        }
    }
    found
}

/// A storage engine used (normally or in tests) by a crate other than `ENGINE_CRATE`.
fn engines_outside_kv(crates: &[Crate]) -> Vec<String> {
    let mut found = Vec::new();
    for krate in crates.iter().filter(|c| c.name != ENGINE_CRATE) {
        for dep in krate
            .deps
            .iter()
            .filter(|d| ENGINES.contains(&d.name.as_str()))
        {
            found.push(format!(
                "{} uses the engine {} ({:?}) directly: reach storage through {ENGINE_CRATE}'s \
                 KvStore, and add what is missing there",
                krate.name, dep.name, dep.kind
            ));
        }
    }
    found
}

/// A package (or a package's feature) of `NOT_IN_THE_CLIENT` in the client's dependency tree.
fn heavy_client_dependencies(tree: &[TreeEntry]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in tree {
        let refused = NOT_IN_THE_CLIENT.iter().any(|(package, feature)| {
            entry.package == *package && entry.feature.as_deref() == *feature
        });
        if !refused {
            continue;
        }
        let what = match &entry.feature {
            Some(feature) => format!("{} with its feature {feature:?}", entry.package),
            None => entry.package.clone(),
        };
        found.push(format!(
            "{LIGHT_CLIENT} depends (transitively) on {what}: a client needs an HTTP client and \
             the wire types only; find the path with `cargo tree -p {LIGHT_CLIENT} -e \
             normal,features -i {}` and cut it (a default feature, or code that belongs to the \
             server)",
            entry.package
        ));
    }
    found
}

/// A `json!` macro anywhere in `files` (test modules included: they show how bodies are built).
fn json_macros(files: &[Source]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        for (i, line) in file.lines.iter().enumerate() {
            let macro_at = line.match_indices("json!").any(|(at, _)| {
                !line[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if macro_at {
                found.push(format!(
                    "{}:{} builds JSON with `json!`: every body the server reads or writes is a \
                     monoseq-wire type; add or extend one there (tests: a typed body, or JSON \
                     text parsed into one)",
                    file.path,
                    i + 1
                ));
            }
        }
    }
    found
}

/// A clock read or a sleep in a non-test line of a core state-machine file.
fn clock_in_state_machine(core: &[Source]) -> Vec<String> {
    let mut found = Vec::new();
    for file in core.iter().filter(|f| !is_clock_file(&f.path)) {
        for (n, line) in file.non_test_lines() {
            for call in CLOCK_CALLS.iter().filter(|call| line.contains(*call)) {
                found.push(format!(
                    "{}:{n} calls {call}: the state machine reads no clock and never sleeps; \
                     take the time as an argument, or move the call to {CORE_CLOCK_FILES:?}",
                    file.path
                ));
            }
        }
    }
    found
}

fn is_clock_file(path: &str) -> bool {
    let file = path.rsplit_once("/src/").map_or(path, |(_, f)| f);
    CORE_CLOCK_FILES.iter().any(|allowed| {
        file == *allowed || file.starts_with(&format!("{}/", allowed.trim_end_matches(".rs")))
    })
}

/// A bare integer literal in a crate's non-test code, outside constant definitions, equal to
/// a constant the same crate defines by a literal (above `COMMON_VALUE_MAX`, and not one of the
/// `COINCIDENCES`).
fn bare_limits(files: &[Source]) -> Vec<String> {
    let mut named: BTreeMap<u128, Vec<String>> = BTreeMap::new();
    for constant in files.iter().flat_map(source::constants) {
        named.entry(constant.value).or_default().push(constant.name);
    }
    named.retain(|value, _| *value > COMMON_VALUE_MAX);
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !is_test_suite(&f.path)) {
        for (n, value, text) in literals_outside_constants(file) {
            let Some(names) = named.get(&value) else {
                continue;
            };
            if !COINCIDENCES
                .iter()
                .any(|(f, v, _)| *f == file.path && *v == value)
            {
                found.push(format!(
                    "{}:{n} writes {text}, which this crate names {}: use the constant \
                     (or, if it means something else, list it in COINCIDENCES with why)",
                    file.path,
                    names.join(" / ")
                ));
            }
        }
    }
    found
}

fn is_test_suite(path: &str) -> bool {
    TEST_SUITE_FILES
        .iter()
        .any(|suite| path.ends_with(&format!("/src/{suite}")))
}

/// (line, value, text) of every integer literal in `file`'s non-test code that is not part of
/// a `const` or `static` definition.
fn literals_outside_constants(file: &Source) -> Vec<(usize, u128, String)> {
    let mut found = Vec::new();
    let mut skip_to = 0;
    for (i, line) in file.lines.iter().enumerate() {
        if i < skip_to || file.test[i] {
            continue;
        }
        if source::defines_constant(line) {
            skip_to = source::item_end(&file.lines, i).map_or(i + 1, |end| end + 1);
            continue;
        }
        if line.trim_start().starts_with("#[") {
            continue;
        }
        for (value, text) in source::integer_literals(line) {
            found.push((i + 1, value, text));
        }
    }
    found
}

/// A function in `src` longer than `FUNCTION_LINES_MAX` that `allowed` does not list.
fn long_functions(files: &[Source], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        for function in source::functions(file) {
            let id = format!("{}::{}", file.path, function.name);
            if function.lines() > FUNCTION_LINES_MAX && !allowed.contains(&id.as_str()) {
                found.push(format!(
                    "{}:{} `{}` is {} lines, over {FUNCTION_LINES_MAX}: split it by what it does",
                    file.path,
                    function.first,
                    function.name,
                    function.lines()
                ));
            }
        }
    }
    found
}

/// The top-level module of its crate a `src` file belongs to (`c/src/store/x.rs`: `store`);
/// `None` for the crate root.
fn top_module(path: &str) -> Option<&str> {
    let (_, inside) = path.split_once("/src/")?;
    let first = inside.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then_some(name)
}

/// The names `file`'s code (tests left out) reaches through the crate root: `crate::name`, each
/// name of a `use crate::{…}`, and `super::name` in a top-level file.
fn names_through_the_root(file: &Source) -> BTreeSet<String> {
    let code: Vec<&str> = file.non_test_lines().map(|(_, line)| line).collect();
    let code = code.join("\n");
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let top_level = file
        .path
        .split_once("/src/")
        .is_some_and(|(_, p)| !p.contains('/'));
    let prefixes: &[&str] = if top_level {
        &["crate::", "super::"]
    } else {
        &["crate::"]
    };
    let mut named = BTreeSet::new();
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            if code[..at].ends_with(|c: char| ident(c) || c == '$' || c == ':') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let Some(group) = rest.strip_prefix('{') else {
                named.insert(rest.chars().take_while(|&c| ident(c)).collect());
                continue;
            };
            // The first name of each item at the group's top level.
            let (mut depth, mut first) = (0, true);
            for part in group.split_inclusive(['{', '}', ',']) {
                if depth == 0 && first {
                    named.insert(
                        part.trim_start()
                            .chars()
                            .take_while(|&c| ident(c))
                            .collect(),
                    );
                }
                match part.chars().last() {
                    Some('{') => depth += 1,
                    Some('}') if depth == 0 => break,
                    Some('}') => depth -= 1,
                    _ => {}
                }
                first = part.ends_with(',');
            }
        }
    }
    named
}

/// Every pair of top-level modules of one crate whose code imports the other's, as
/// "crate: a ↔ b" (`files` are one crate's).
fn module_circles(files: &[Source]) -> BTreeSet<String> {
    let modules: BTreeSet<&str> = files.iter().filter_map(|f| top_module(&f.path)).collect();
    let mut imports: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if let Some(module) = top_module(&file.path) {
            imports
                .entry(module)
                .or_default()
                .extend(names_through_the_root(file));
        }
    }
    let imports_of = |a: &str, b: &str| imports.get(a).is_some_and(|names| names.contains(b));
    let mut circles = BTreeSet::new();
    for a in &modules {
        for b in modules.iter().filter(|b| a < *b) {
            if imports_of(a, b) && imports_of(b, a) {
                let krate = files[0].path.split('/').next().unwrap_or_default();
                circles.insert(format!("{krate}: {a} ↔ {b}"));
            }
        }
    }
    circles
}

/// The circles `found` that `allowed` does not list, and the listed ones no longer found.
fn unlisted_circles(found: &BTreeSet<String>, allowed: &[&str]) -> Vec<String> {
    let mut report: Vec<String> = found
        .iter()
        .filter(|c| !allowed.contains(&c.as_str()))
        .map(|c| format!("{c} import each other: move what both need into a module below them"))
        .collect();
    report.extend(
        allowed
            .iter()
            .filter(|c| !found.contains(**c))
            .map(|c| format!("{c} no longer import each other: remove it from MODULE_CIRCLES")),
    );
    report
}

// ---------------------------------------------------------------------------------------------
// The workspace, checked.

fn assert_none(rule: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{rule}:\n  {}", found.join("\n  "));
}

fn crate_named(crates: &[Crate], name: &str) -> Crate {
    crates
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("the workspace has no crate {name}"))
        .clone()
}

#[test]
fn every_dependency_is_one_the_crate_graph_draws() {
    assert_none(
        "dependencies ARCHITECTURE.md does not draw",
        forbidden_dependencies(&workspace(), ALLOWED),
    );
}

#[test]
fn no_dependency_cycle_even_through_dev_dependencies() {
    assert_none("dependency cycles", dependency_cycles(&workspace()));
}

#[test]
fn http_cli_and_json_libraries_stay_in_the_edge_crates() {
    assert_none("edge libraries inside", edge_libraries_inside(&workspace()));
}

#[test]
fn only_the_kv_crate_touches_a_storage_engine() {
    assert_none(
        "storage engines outside the kv crate",
        engines_outside_kv(&workspace()),
    );
}

#[test]
fn the_client_depends_on_no_server_framework_storage_engine_or_database_driver() {
    assert_none(
        "heavy dependencies of the client",
        heavy_client_dependencies(&dependency_tree(LIGHT_CLIENT)),
    );
}

#[test]
fn the_server_writes_no_json_by_hand() {
    let server = crate_named(&workspace(), TYPED_JSON_CRATE);
    assert_none("`json!` in the server", json_macros(&sources(&server)));
}

#[test]
fn the_core_state_machine_reads_no_clock_and_never_sleeps() {
    let core = crate_named(&workspace(), "monoseq-core");
    assert_none(
        "clock reads in the state machine",
        clock_in_state_machine(&sources(&core)),
    );
}

#[test]
fn a_limit_a_crate_names_is_written_by_its_name() {
    let found: Vec<String> = workspace()
        .iter()
        .flat_map(|c| bare_limits(&sources(c)))
        .collect();
    assert_none("bare literals of named limits", found);
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let found: BTreeSet<String> = workspace()
        .iter()
        .map(sources)
        .filter(|files| !files.is_empty())
        .flat_map(|files| module_circles(&files))
        .collect();
    assert_none("module circles", unlisted_circles(&found, MODULE_CIRCLES));
}

#[test]
fn functions_in_src_stay_short() {
    let files: Vec<Source> = workspace().iter().flat_map(sources).collect();
    assert_none("long functions", long_functions(&files, LONG_FUNCTIONS));
}

// ---------------------------------------------------------------------------------------------
// Each rule, broken on purpose.

fn krate(name: &str, deps: &[(&str, Kind)]) -> Crate {
    let deps = deps
        .iter()
        .map(|(n, kind)| Dep {
            name: (*n).to_owned(),
            kind: *kind,
        })
        .collect();
    Crate {
        name: name.to_owned(),
        dir: PathBuf::new(),
        deps,
    }
}

#[test]
fn a_dependency_the_graph_does_not_draw_is_reported() {
    let crates = [
        krate("monoseq-kv", &[]),
        krate("monoseq-named", &[]),
        krate(
            "monoseq-pg",
            &[("monoseq-kv", Kind::Normal), ("monoseq-named", Kind::Dev)],
        ),
    ];
    let found = forbidden_dependencies(&crates, ALLOWED);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("monoseq-pg has a Dev dependency on monoseq-named"),
        "{found:?}"
    );
}

#[test]
fn a_crate_missing_from_the_graph_is_reported() {
    let found = forbidden_dependencies(&[krate("monoseq-new", &[])], ALLOWED);
    assert!(
        found[0].contains("monoseq-new is not in the crate graph"),
        "{found:?}"
    );
}

#[test]
fn a_dev_dependency_cycle_is_reported_once() {
    let crates = [
        krate("monoseq-kv", &[]),
        krate(
            "monoseq-named",
            &[("monoseq-kv", Kind::Normal), ("monoseq-pg", Kind::Dev)],
        ),
        krate(
            "monoseq-pg",
            &[("monoseq-kv", Kind::Normal), ("monoseq-named", Kind::Dev)],
        ),
    ];
    let found = dependency_cycles(&crates);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("monoseq-named → monoseq-pg → monoseq-named"),
        "{found:?}"
    );
}

#[test]
fn a_crate_depending_on_itself_for_features_is_no_cycle() {
    let crates = [krate("monoseq-pg", &[("monoseq-pg", Kind::Dev)])];
    assert!(dependency_cycles(&crates).is_empty());
}

#[test]
fn serde_json_in_the_core_is_reported() {
    let crates = [krate("monoseq-core", &[("serde_json", Kind::Normal)])];
    let found = edge_libraries_inside(&crates);
    assert!(
        found[0].contains("monoseq-core uses serde_json"),
        "{found:?}"
    );
}

#[test]
fn axum_in_a_test_of_the_store_is_reported() {
    let found = edge_libraries_inside(&[krate("monoseq-store", &[("axum", Kind::Dev)])]);
    assert!(
        found[0].contains("monoseq-store uses axum (Dev)"),
        "{found:?}"
    );
}

#[test]
fn fjall_in_the_verifier_is_reported() {
    let crates = [
        krate("monoseq-kv", &[("fjall", Kind::Normal)]),
        krate("monoseq-verify", &[("fjall", Kind::Normal)]),
    ];
    let found = engines_outside_kv(&crates);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("monoseq-verify uses the engine fjall"),
        "{found:?}"
    );
}

#[test]
fn a_server_framework_or_engine_under_the_client_is_reported_but_an_http_client_is_not() {
    let tree = parse_tree(
        "monoseq-client v0.1.0 (/w/crates/monoseq-client)\n\
         reqwest v0.13.5\n\
         hyper v1.12.0\n\
         hyper feature \"client\"\n\
         hyper feature \"server\"\n\
         axum v0.8.9 (*)\n\
         axum feature \"json\"\n\
         fjall v3.1.13 (/w/vendor/fjall)\n",
    );
    let found = heavy_client_dependencies(&tree);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].contains("depends (transitively) on axum:"),
        "{found:?}"
    );
    assert!(found[1].contains("on fjall:"), "{found:?}");
    assert!(
        found[2].contains("on hyper with its feature \"server\""),
        "{found:?}"
    );
}

#[test]
fn a_json_macro_is_reported_even_in_a_test_but_not_in_a_comment_or_string() {
    let text = "fn f() -> Value {\n    serde_json::json!({\"a\": 1})\n}\n// json!({})\nconst S: &str = \"json!\";\nfn my_json!() {}\n#[cfg(test)]\nmod tests {\n    fn g() { json!(1); }\n}\n";
    let found = json_macros(&[Source::new("monoseq/src/routes.rs", text)]);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("monoseq/src/routes.rs:2 builds JSON with `json!`"),
        "{found:?}"
    );
    assert!(
        found[1].starts_with("monoseq/src/routes.rs:9 "),
        "{found:?}"
    );
}

#[test]
fn instant_now_in_the_sequencer_is_reported_but_not_in_the_driver_or_a_test() {
    let text = "fn f() {\n    let t = Instant::now();\n}\n#[cfg(test)]\nmod tests {\n    fn g() { std::thread::sleep(d); }\n}\n";
    let files = [
        Source::new("monoseq-core/src/sequencer.rs", text),
        Source::new("monoseq-core/src/driver.rs", text),
    ];
    let found = clock_in_state_machine(&files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("monoseq-core/src/sequencer.rs:2 calls Instant::now"),
        "{found:?}"
    );
}

#[test]
fn a_clock_named_in_a_comment_or_string_is_no_clock_read() {
    let text = "// Instant::now is read by the driver\nconst S: &str = \"thread::sleep\";\n";
    assert!(clock_in_state_machine(&[Source::new("monoseq-core/src/worker.rs", text)]).is_empty());
}

#[test]
fn a_bare_literal_of_a_named_limit_is_reported() {
    let text =
        "pub const PAGE_MAX: usize = 1_000;\nfn page(n: usize) -> usize {\n    n.min(1000)\n}\n";
    let found = bare_limits(&[Source::new("monoseq/src/server.rs", text)]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0]
            .starts_with("monoseq/src/server.rs:3 writes 1000, which this crate names PAGE_MAX"),
        "{found:?}"
    );
}

#[test]
fn common_values_tuple_fields_floats_and_tests_are_no_bare_limits() {
    let text = "const ONE: u32 = 1;\nconst HUNDRED: u64 = 100;\nfn f(p: (u8, u8)) -> f64 {\n    let _ = p.1 + 1;\n    100.5\n}\n#[cfg(test)]\nmod tests {\n    const X: u64 = 100;\n}\n";
    assert!(bare_limits(&[Source::new("c/src/lib.rs", text)]).is_empty());
}

#[test]
fn a_test_module_in_a_file_of_its_own_is_test_code() {
    let lib = "#[cfg(test)]\nmod tests;\n";
    let tests = "const LIMIT: u32 = 100;\nfn f() -> u32 {\n    100\n}\n";
    let mut files = [
        Source::new("c/src/lib.rs", lib),
        Source::new("c/src/tests.rs", tests),
    ];
    assert_eq!(bare_limits(&files).len(), 1);
    mark_test_module_files(&mut files);
    assert!(bare_limits(&files).is_empty());
}

#[test]
fn a_long_function_is_reported_unless_listed() {
    let body: String = (0..FUNCTION_LINES_MAX)
        .map(|i| format!("    let x{i} = {i};\n"))
        .collect();
    let text = format!("fn short() {{}}\n\npub fn long(a: [u8; 4]) {{\n{body}}}\n");
    let files = [Source::new("c/src/lib.rs", &text)];
    let found = long_functions(&files, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("c/src/lib.rs:3 `long` is 72 lines"),
        "{found:?}"
    );
    assert!(long_functions(&files, &["c/src/lib.rs::long"]).is_empty());
}

#[test]
fn braces_in_strings_chars_and_comments_do_not_end_a_function() {
    let text = "fn f() {\n    let s = \"}\";\n    let c = '}';\n    // }\n    let r = r#\"}\"#;\n}\nfn g<'a>(x: &'a str) {\n}\n";
    let functions = source::functions(&Source::new("c/src/lib.rs", text));
    let spans: Vec<(String, usize, usize)> = functions
        .into_iter()
        .map(|f| (f.name, f.first, f.last))
        .collect();
    assert_eq!(spans, [("f".to_owned(), 1, 6), ("g".to_owned(), 7, 8)]);
}

#[test]
fn two_modules_importing_each_other_are_reported_unless_listed_and_a_stale_listing_too() {
    let files = [
        Source::new("c/src/lib.rs", "mod a;\nmod b;\nuse crate::a::X;\n"),
        Source::new("c/src/a.rs", "use crate::{b::Y, c};\npub struct X;\n"),
        Source::new(
            "c/src/b.rs",
            "pub struct Y;\nfn f() -> super::a::X {\n    todo!()\n}\n",
        ),
        Source::new(
            "c/src/c.rs",
            "// crate::a\n#[cfg(test)]\nmod tests {\n    use crate::a::X;\n}\n",
        ),
        Source::new("c/src/c/d.rs", "use super::super::a::X;\n"),
    ];
    let found = module_circles(&files);
    assert_eq!(found, BTreeSet::from(["c: a ↔ b".to_owned()]));
    assert_eq!(unlisted_circles(&found, &[]).len(), 1);
    assert!(unlisted_circles(&found, &["c: a ↔ b"]).is_empty());
    let stale = unlisted_circles(&BTreeSet::new(), &["c: a ↔ b"]);
    assert!(
        stale[0].contains("remove it from MODULE_CIRCLES"),
        "{stale:?}"
    );
}
