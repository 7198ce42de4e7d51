//! The house's measures, held by a test (TigerBeetle keeps its own in `src/tidy.zig`): on the
//! workspace's production code (no `tests/`, benches, `#[cfg(test)]` items or `*_tests.rs`),
//! no function over 100 lines, no file over 800, no circle of files inside a crate, no
//! `unwrap()` and no `#[allow(dead_code)]`, no crate over 6,000 code lines, and the counts of
//! long functions, `Result<_, String>`s and assertions within their limits, and each wire name
//! (a method, an op, a capability) spelled once, by the role crate's constant where it has
//! one. Each failure names
//! its offenders. Where the house stands above a limit today, the limit is the standing
//! figure with the offenders listed by name: a new one fails, and one mended must leave the
//! list, so the figures only go one way.

#[path = "tidy/graph.rs"]
mod graph;
#[path = "tidy/scan.rs"]
mod scan;
#[path = "tidy/wire.rs"]
mod wire;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A production function longer than this fails.
const FN_LINES_MAX: usize = 100;
/// A source file longer than this fails (split by role).
const FILE_LINES_MAX: usize = 800;
/// A crate with more code lines than this fails (split along the brief's roles).
const CRATE_LINES_MAX: usize = 6_000;

/// Functions over 70 lines, at most, in the whole workspace.
const FNS_OVER_70_MAX: usize = 14;
/// Crates where no function may pass 70 lines (the durable path's floors).
const NO_LONG_FNS: &[&str] = &["broca-core", "broca-wal", "broca-wal-writer", "broca-io"];
/// `Result<_, String>` signatures, at most (an error is a type; text is made at the edge).
const STRING_RESULTS_MAX: usize = 46;
/// Assertions, at least (each an invariant that runs).
const ASSERTS_MIN: usize = 250;

/// Functions over 100 lines still standing, `file name`: each leaves when it is split.
const LONG_FNS_STANDING: &[&str] = &[];
/// Functions over 70 lines still standing in the crates of [`NO_LONG_FNS`].
const FLOOR_LONG_FNS_STANDING: &[&str] = &[];
/// Crates over [`CRATE_LINES_MAX`] still standing, with their code lines at most.
const BIG_CRATES_STANDING: &[(&str, usize)] = &[];
/// Circles of files still standing (a crate's name, then its files): each leaves when cut.
const CIRCLES_STANDING: &[&str] = &[];
/// `unwrap()`s still standing, by file: each leaves when it is mended.
const UNWRAPS_STANDING: &[&str] = &[];
/// `#[allow(dead_code)]`s still standing, by file.
const DEAD_CODE_STANDING: &[&str] = &[];

/// One workspace crate: its name, its folder, and the folder its module tree starts in.
struct Crate {
    name: String,
    dir: PathBuf,
    root: PathBuf,
}

/// One production file's measures.
struct File {
    crate_name: String,
    rel: String,
    measures: scan::Measures,
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo metadata` of the workspace, offline, with `args` beside the format.
fn cargo_metadata(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(workspace())
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo's JSON")
}

fn crates() -> Vec<Crate> {
    let meta = cargo_metadata(&["--no-deps"]);
    let mut crates = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let manifest = PathBuf::from(p["manifest_path"].as_str().expect("a manifest"));
        let dir = manifest.parent().expect("a folder").to_path_buf();
        let targets = p["targets"].as_array().expect("targets");
        let root_file = targets
            .iter()
            .find(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "lib"))
            })
            .or_else(|| targets.first())
            .and_then(|t| t["src_path"].as_str())
            .map(PathBuf::from)
            .expect("a target");
        let root = root_file.parent().expect("a folder").to_path_buf();
        let name = p["name"].as_str().expect("a name").to_string();
        crates.push(Crate { name, dir, root });
    }
    crates
}

/// A crate's production files: under its folder, not under another crate's, tests and
/// benches left out.
fn production_files(c: &Crate, all: &[Crate]) -> Vec<PathBuf> {
    let nested: Vec<&Path> = all
        .iter()
        .filter(|o| o.dir != c.dir && o.dir.starts_with(&c.dir))
        .map(|o| o.dir.as_path())
        .collect();
    let mut out = Vec::new();
    let mut dirs = vec![c.dir.clone()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                let skipped = matches!(
                    name.as_str(),
                    "tests" | "benches" | "target" | "fuzz" | "examples" | "node_modules"
                ) || name.starts_with('.');
                if !skipped && !nested.contains(&path.as_path()) {
                    dirs.push(path);
                }
            } else if name.ends_with(".rs") && !name.ends_with("_tests.rs") && name != "tests.rs" {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module a file is, inside its crate's tree.
fn module_of(c: &Crate, file: &Path) -> graph::ModPath {
    let rel = file.strip_prefix(&c.root).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|p| p.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| matches!(l.as_str(), "lib" | "mod" | "main"))
    {
        parts.pop();
    }
    parts
}

/// Every production file measured, and each crate's circles.
fn survey() -> (Vec<File>, Vec<String>) {
    let all = crates();
    let top = workspace();
    let mut files = Vec::new();
    let mut circles = Vec::new();
    for c in &all {
        let mut g = graph::Graph::default();
        for path in production_files(c, &all) {
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            let src = scan::Source::read(&text);
            g.add(&module_of(c, &path), &src.joined());
            let rel = path.strip_prefix(&top).unwrap_or(&path);
            files.push(File {
                crate_name: c.name.clone(),
                rel: rel.to_string_lossy().into_owned(),
                measures: src.measure(),
            });
        }
        for circle in g.circles() {
            circles.push(format!("{}: {}", c.name, circle.join(", ")));
        }
    }
    assert!(
        files.len() > 100,
        "the workspace's files were read ({})",
        files.len()
    );
    (files, circles)
}

/// The names in `found` not in `standing`, and those in `standing` no longer found.
fn against(found: &[String], standing: &[&str]) -> (Vec<String>, Vec<String>) {
    let new = found
        .iter()
        .filter(|f| !standing.contains(&f.as_str()))
        .cloned()
        .collect();
    let mended = standing
        .iter()
        .filter(|s| !found.iter().any(|f| f == *s))
        .map(|s| s.to_string())
        .collect();
    (new, mended)
}

/// Fails with every breach named, or passes.
fn report(breaches: Vec<String>) {
    assert!(
        breaches.is_empty(),
        "the house's measures slid (docs/architecture.md, \"The measures\"):\n- {}",
        breaches.join("\n- ")
    );
}

fn ratchet(what: &str, found: &[String], standing: &[&str], breaches: &mut Vec<String>) {
    let (new, mended) = against(found, standing);
    for n in new {
        breaches.push(format!("{what}: {n}"));
    }
    for m in mended {
        breaches.push(format!("{what} mended, take it off this test's list: {m}"));
    }
}

#[test]
fn functions_files_and_circles_stay_within_their_limits() {
    let (files, circles) = survey();
    let mut breaches = Vec::new();
    let mut long = Vec::new();
    let mut over_70 = Vec::new();
    let mut floor_long = Vec::new();
    for f in &files {
        if f.measures.file_lines > FILE_LINES_MAX {
            let n = f.measures.file_lines;
            breaches.push(format!(
                "{} has {n} lines (at most {FILE_LINES_MAX})",
                f.rel
            ));
        }
        for (line, name, length) in &f.measures.long_fns {
            over_70.push(format!("{}:{line} {name} ({length} lines)", f.rel));
            if NO_LONG_FNS.contains(&f.crate_name.as_str()) {
                floor_long.push(format!("{} {name}", f.rel));
            }
            if *length > FN_LINES_MAX {
                long.push(format!("{} {name}", f.rel));
            }
        }
    }
    ratchet(
        "a function over 100 lines",
        &long,
        LONG_FNS_STANDING,
        &mut breaches,
    );
    ratchet(
        "a function over 70 lines in broca-core, -wal, -wal-writer or -io",
        &floor_long,
        FLOOR_LONG_FNS_STANDING,
        &mut breaches,
    );
    ratchet(
        "a circle of files",
        &circles,
        CIRCLES_STANDING,
        &mut breaches,
    );
    if over_70.len() > FNS_OVER_70_MAX {
        breaches.push(format!(
            "{} functions over {} lines (at most {FNS_OVER_70_MAX}): {}",
            over_70.len(),
            scan::FN_SHORT_MAX,
            over_70.join("; ")
        ));
    }
    report(breaches);
}

#[test]
fn errors_assertions_and_escape_hatches_stay_within_their_limits() {
    let (files, _) = survey();
    let mut breaches = Vec::new();
    let string_results: usize = files.iter().map(|f| f.measures.string_results).sum();
    if string_results > STRING_RESULTS_MAX {
        let mut by_file: Vec<String> = files
            .iter()
            .filter(|f| f.measures.string_results > 0)
            .map(|f| format!("{} ({})", f.rel, f.measures.string_results))
            .collect();
        by_file.sort();
        breaches.push(format!(
            "{string_results} Result<_, String> (at most {STRING_RESULTS_MAX}; give the error \
             a type): {}",
            by_file.join(", ")
        ));
    }
    let asserts: usize = files.iter().map(|f| f.measures.asserts).sum();
    if asserts < ASSERTS_MIN {
        breaches.push(format!("{asserts} assertions (at least {ASSERTS_MIN})"));
    }
    let of = |count: fn(&scan::Measures) -> usize| -> Vec<String> {
        let mut v: Vec<String> = files
            .iter()
            .filter(|f| count(&f.measures) > 0)
            .map(|f| f.rel.clone())
            .collect();
        v.dedup();
        v
    };
    ratchet(
        "an unwrap()",
        &of(|m| m.unwraps),
        UNWRAPS_STANDING,
        &mut breaches,
    );
    let dead = of(|m| m.dead_code_allows);
    ratchet(
        "an #[allow(dead_code)]",
        &dead,
        DEAD_CODE_STANDING,
        &mut breaches,
    );
    report(breaches);
}

#[test]
fn no_crate_outgrows_its_role() {
    let (files, _) = survey();
    let mut lines: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &files {
        *lines.entry(f.crate_name.as_str()).or_default() += f.measures.lines;
    }
    let mut breaches = Vec::new();
    for (name, n) in &lines {
        let max = BIG_CRATES_STANDING
            .iter()
            .find(|(c, _)| c == name)
            .map_or(CRATE_LINES_MAX, |(_, m)| *m);
        if *n > max {
            breaches.push(format!(
                "{name} has {n} code lines (at most {max}): split it by role"
            ));
        }
    }
    for (name, max) in BIG_CRATES_STANDING {
        if lines.get(name).is_some_and(|n| *n <= CRATE_LINES_MAX) {
            breaches.push(format!(
                "{name} is under {CRATE_LINES_MAX}: take it off the list ({max})"
            ));
        }
    }
    report(breaches);
}

#[test]
fn each_wire_name_is_spelled_once_and_by_the_role_where_it_has_a_constant() {
    let all = crates();
    let top = workspace();
    let roles = wire::role_constants();
    assert!(
        roles.contains_key("session.send") && roles.contains_key("tool-result/v1"),
        "the role crates' constants were read ({} found)",
        roles.len()
    );
    let mut spelled: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in &all {
        for path in production_files(c, &all) {
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            let src = scan::Source::read(&text);
            let rel = path
                .strip_prefix(&top)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            for (line, lit) in wire::literals(&text) {
                if !src.test_lines.get(line).copied().unwrap_or(true) && wire::is_wire_name(&lit) {
                    spelled
                        .entry(lit)
                        .or_default()
                        .push(format!("{rel}:{}", line + 1));
                }
            }
        }
    }
    let mut breaches = Vec::new();
    for (name, places) in &spelled {
        if let Some(constant) = roles.get(name) {
            breaches.push(format!(
                "`{name}` spelled at {} (use {constant})",
                places.join(", ")
            ));
        } else if places.len() > 1 {
            breaches.push(format!(
                "`{name}` spelled {} times ({}): spell it once, as a constant",
                places.len(),
                places.join(", ")
            ));
        }
    }
    report(breaches);
}
