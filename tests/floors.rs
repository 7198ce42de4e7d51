//! The floors of docs/architecture.md, checked on the workspace's manifests: every crate
//! depends only on crates of lower floors, and broca-core's whole dependency tree holds no
//! I/O crate (no glommio, broca-io, broca-shards, heed, tokio): core is sans-IO.

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
    ("broca-tools", 1),
    ("broca-subc", 1),
    ("broca-provider", 2),
    ("broca-archive", 2),
    ("broca-wal-writer", 3),
    ("broca-core", 2),
    ("broca-import", 2),
    ("broca-store", 3),
    ("broca-module", 4),
    ("broca", 5),
    ("broca-bench", 6),
    ("broca-crash-tests", 6),
];

/// Crates that must not be anywhere in broca-core's tree.
const IO_CRATES: &[&str] = &["glommio", "broca-io", "broca-shards", "heed", "tokio"];

fn cargo() -> Command {
    let mut c = Command::new(env!("CARGO"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn every_crate_depends_only_on_lower_floors() {
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
    let floors: HashMap<&str, u32> = FLOORS.iter().copied().collect();
    let mut seen = Vec::new();
    for pkg in meta["packages"].as_array().unwrap() {
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
