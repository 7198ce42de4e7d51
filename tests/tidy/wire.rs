//! Wire names in production code: the string literals shaped as a method or op
//! (`session.send`, `route.closed`) or a versioned capability (`tool-result/v1`), and the
//! names the role crates spell as constants. Each wire name is spelled once in the
//! workspace, and never where a role crate has a constant for it.

use std::collections::BTreeMap;
use std::path::Path;

/// Every string literal of `text` (not raw strings, not comments), with its 0-based line.
pub fn literals(text: &str) -> Vec<(usize, String)> {
    let s: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 0);
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        match c {
            '\n' => line += 1,
            '/' if next == Some('/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '/' if next == Some('*') => {
                i += 2;
                while i + 1 < s.len() && !(s[i] == '*' && s[i + 1] == '/') {
                    line += usize::from(s[i] == '\n');
                    i += 1;
                }
                i += 2;
                continue;
            }
            'r' if next == Some('#') || next == Some('"') => {
                // A raw string: skipped whole (its hashes close it).
                let hashes = s[i + 1..].iter().take_while(|c| **c == '#').count();
                if s.get(i + 1 + hashes) == Some(&'"') {
                    i += 2 + hashes;
                    while i < s.len() {
                        if s[i] == '"' && s[i + 1..].iter().take(hashes).all(|c| *c == '#') {
                            break;
                        }
                        line += usize::from(s[i] == '\n');
                        i += 1;
                    }
                    i += 1 + hashes;
                    continue;
                }
            }
            '\'' => {
                // A char literal ('"', '\\'), not a lifetime.
                if next == Some('\\') {
                    i += s[i + 2..]
                        .iter()
                        .position(|c| *c == '\'')
                        .map_or(2, |p| p + 3);
                    continue;
                }
                if s.get(i + 2) == Some(&'\'') {
                    i += 3;
                    continue;
                }
            }
            '"' => {
                let (start_line, mut lit) = (line, String::new());
                i += 1;
                while i < s.len() && s[i] != '"' {
                    if s[i] == '\\' {
                        lit.push(s[i]);
                        i += 1;
                    }
                    if let Some(&c) = s.get(i) {
                        line += usize::from(c == '\n');
                        lit.push(c);
                    }
                    i += 1;
                }
                out.push((start_line, lit));
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether `lit` is shaped as a wire name of broca's or a role's: a method or op
/// (`session.send`, `run.cancel`, `scope.apply`) or a versioned capability
/// (`tool-result/v1`).
pub fn is_wire_name(lit: &str) -> bool {
    let method = lit.split_once('.').is_some_and(|(head, tail)| {
        matches!(
            head,
            "session"
                | "sessions"
                | "run"
                | "runs"
                | "send"
                | "role"
                | "tool"
                | "scope"
                | "route"
                | "catalog"
                | "health"
                | "compaction"
                | "transform"
                | "supervisor"
                | "server"
                | "daemon"
        ) && !tail.is_empty()
            && tail
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
    });
    let capability = lit.rsplit_once("/v").is_some_and(|(name, major)| {
        !name.is_empty()
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !major.is_empty()
            && major.chars().all(|c| c.is_ascii_digit())
    });
    method || capability
}

/// The wire names the role crates (and the daemon's protocol crates) spell as constants,
/// each with the constant that spells it: read from their sources in cargo's registry.
pub fn role_constants() -> BTreeMap<String, String> {
    let rustc = std::process::Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc names its host");
    // This platform's packages only: those are the ones the build fetched.
    let meta = crate::cargo_metadata(&["--filter-platform", &host]);
    let mut names = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().unwrap_or_default();
        let ecosystem = name.starts_with("cortexkit-role-") || name.starts_with("subc-");
        if !ecosystem || name.contains("conformance") || name.contains("harness") {
            continue;
        }
        let manifest = Path::new(p["manifest_path"].as_str().expect("a manifest"));
        let mut dirs = vec![manifest.parent().expect("a folder").join("src")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let path = e.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    for (constant, value) in str_constants(&text) {
                        if is_wire_name(&value) {
                            names.insert(value, format!("{name}'s {constant}"));
                        }
                    }
                }
            }
        }
    }
    names
}

/// `pub const NAME: &str = "value";` declarations of a file.
fn str_constants(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(": &str = \"")?;
            let value = rest.strip_suffix("\";")?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

#[test]
fn literals_are_found_outside_comments_chars_and_raw_strings() {
    let text = "let a = \"session.send\"; // \"run.cancel\"\nlet c = '\"'; let d = r#\"x\"#;\n\
                /* \"tool.catalog\" */ let e = \"tool-result/v1\";\nfn f<'a>(x: &'a str) {}";
    let found = literals(text);
    assert_eq!(
        found,
        vec![
            (0, "session.send".to_string()),
            (2, "tool-result/v1".to_string())
        ]
    );
    assert!(is_wire_name("session.send") && is_wire_name("tool-result/v1"));
    assert!(!is_wire_name("credentials.json") && !is_wire_name("a/b") && !is_wire_name("run."));
}
