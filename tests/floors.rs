//! The floors of docs/architecture.md, checked on the workspace's manifests: every crate
//! depends only on crates of lower floors; broca-core's whole dependency tree holds no I/O
//! crate (no glommio, broca-io, broca-shards, heed, tokio): core is sans-IO; the runtime
//! (broca-shards) uses broca-io and nothing else of ours; and the test doubles
//! (broca-testkit) are never a production crate's dependency.

use std::collections::HashMap;
use std::process::Command;

/// Each workspace crate's floor; a crate may depend only on crates of a lower floor.
const FLOORS: &[(&str, u32)] = &[
    ("broca-protocol", 0),
    ("broca-owner-only", 0),
    ("broca-io", 0),
    ("broca-shards", 1),
    ("broca-wal", 1),
    ("broca-catalog", 1),
    ("broca-wire", 1),
    ("broca-subc", 1),
    ("broca-tools", 2),
    ("broca-provider", 2),
    ("broca-archive", 2),
    ("broca-otel", 2),
    ("broca-import", 2),
    ("broca-fetch-plan", 2),
    ("broca-core", 3),
    ("broca-wal-writer", 3),
    ("broca-transport", 3),
    ("broca-ck", 4),
    ("broca-store", 4),
    ("broca-testkit", 4),
    ("broca-read", 5),
    ("broca-session", 6),
    ("broca-crash-points", 7),
    ("broca-host", 8),
    ("broca-run", 8),
    ("broca-serve", 9),
    ("broca-daemon", 9),
    ("broca", 10),
    ("broca-bench", 11),
    ("broca-crash-tests", 11),
];

/// Crates that must not be anywhere in broca-core's tree.
const IO_CRATES: &[&str] = &["glommio", "broca-io", "broca-shards", "heed", "tokio"];

/// Crates of tests and benchmarks, the only ones the test doubles may be a dependency of.
const TEST_CRATES: &[&str] = &["broca-bench", "broca-crash-tests"];

fn cargo() -> Command {
    let mut c = Command::new(env!("CARGO"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// The workspace's packages, as `cargo metadata` describes them.
fn packages() -> Vec<serde_json::Value> {
    let out = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"].as_array().unwrap().clone()
}

/// The workspace crates `pkg` depends on with `kind` (`None`: normal dependencies).
fn ours<'a>(pkg: &'a serde_json::Value, kind: Option<&str>) -> Vec<&'a str> {
    pkg["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].as_str() == kind)
        .filter_map(|d| d["name"].as_str())
        .filter(|n| FLOORS.iter().any(|(f, _)| f == n))
        .collect()
}

#[test]
fn the_runtime_uses_broca_io_alone_and_no_production_crate_uses_the_test_doubles() {
    let packages = packages();
    let shards = packages
        .iter()
        .find(|p| p["name"] == "broca-shards")
        .unwrap();
    assert_eq!(
        ours(shards, None),
        vec!["broca-io"],
        "broca-shards knows nothing of LLMs"
    );
    let mut dev_users = 0;
    for pkg in &packages {
        let name = pkg["name"].as_str().unwrap();
        if TEST_CRATES.contains(&name) {
            continue;
        }
        assert!(
            !ours(pkg, None).contains(&"broca-testkit"),
            "{name} depends on broca-testkit: the test doubles are for tests only"
        );
        dev_users += usize::from(ours(pkg, Some("dev")).contains(&"broca-testkit"));
    }
    assert!(
        dev_users > 0,
        "the tests use the test doubles (the check looked at them)"
    );
}

#[test]
fn every_crate_depends_only_on_lower_floors() {
    let packages = packages();
    let floors: HashMap<&str, u32> = FLOORS.iter().copied().collect();
    let mut seen = Vec::new();
    for pkg in &packages {
        let name = pkg["name"].as_str().unwrap();
        let Some(&floor) = floors.get(name) else {
            panic!("{name} has no floor in this table (and in docs/architecture.md)")
        };
        seen.push(name.to_string());
        for dep in pkg["dependencies"].as_array().unwrap() {
            let dep_name = dep["name"].as_str().unwrap();
            let normal = dep["kind"].is_null();
            if let (true, Some(&dep_floor)) = (normal, floors.get(dep_name)) {
                assert!(
                    dep_floor < floor,
                    "{name} (floor {floor}) depends on {dep_name} (floor {dep_floor}): a crate \
                     may use only the floors below it"
                );
            }
        }
    }
    for (name, _) in FLOORS {
        assert!(
            seen.iter().any(|s| s == name),
            "{name} is not in the workspace"
        );
    }
}

#[test]
fn core_is_sans_io_all_the_way_down() {
    let out = cargo()
        .args([
            "tree",
            "-p",
            "broca-core",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"broca-wal"), "the tree was read: {tree}");
    for io in IO_CRATES {
        assert!(
            !crates.contains(io),
            "broca-core's dependency tree holds {io}:\n{tree}"
        );
    }
}
