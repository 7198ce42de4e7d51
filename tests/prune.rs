//! The archive's reasoning prune (llm-runner/v1 `archive_prunes_reasoning`) through the real
//! binary: a session's signed reasoning emptied in place as serve packs it, reads that keep
//! the originals' digests and list the emptied parts, a run after it that sends none of it,
//! every older sealed copy gone, and a prune cut at each step of its pack finished by the
//! next pack with the session readable once meanwhile.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{json, Value};
use support::serve::{command, rpc, send_until_completed, spawn};
use support::{broca, fixture, recorded_bodies, Aimock, Peer};

/// The signed thoughts of the imported log (each a step's), and their signatures.
const THOUGHTS: [&str; 2] = ["thought-one-blue-door", "thought-two-red-key"];
const SIGNATURES: [&str; 2] = ["c2lnbmVkLW9uZQ", "c2lnbmVkLXR3bw"];

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o));
    text(&o)
}

/// Imports a Claude Code log of two turns, each answered with signed reasoning beside text,
/// as the session `/proj h s1`.
fn import_session(state: &Path, dir: &Path) {
    let line = |n: usize, kind: &str, message: Value| {
        json!({"type": kind, "uuid": format!("u{n}"), "sessionId": "prune-log",
            "timestamp": "2026-12-01T00:00:00.000Z", "cwd": "/proj", "message": message})
        .to_string()
    };
    let mut lines = Vec::new();
    for (n, (thought, signature)) in THOUGHTS.iter().zip(SIGNATURES).enumerate() {
        lines.push(line(
            2 * n,
            "user",
            json!({"role": "user", "content": format!("question {n}")}),
        ));
        lines.push(line(
            2 * n + 1,
            "assistant",
            json!({"role": "assistant", "model": "m", "content": [
                {"type": "thinking", "thinking": thought, "signature": signature},
                {"type": "text", "text": format!("answer {n}")}]}),
        ));
    }
    let log = dir.join("prune.jsonl");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    ok(broca(state)
        .args(["import", "claude-code", "--project-root", "/proj"])
        .args(["--harness", "h", "--session", "s1"])
        .arg(&log)
        .output()
        .unwrap());
}

/// The session imported ([`import_session`]), packed, and restored from its container (which
/// keeps that older copy): its address.
fn imported_packed_and_restored(state: &Path, dir: &Path) -> String {
    import_session(state, dir);
    let address = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find_map(|n| n.strip_suffix(".wal").map(str::to_string))
        .expect("the session's WAL");
    ok(broca(state)
        .args(["archive", "pack", "--idle-days", "0"])
        .output()
        .unwrap());
    ok(broca(state)
        .args(["archive", "restore", &address])
        .output()
        .unwrap());
    address
}

/// The files (the store's aside) that hold `needle`.
fn files_holding(state: &Path, needle: &str) -> Vec<PathBuf> {
    support::files_under(state)
        .into_iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "store"))
        .filter(|p| {
            std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .collect()
}

fn reasoning_anywhere(state: &Path) -> Vec<PathBuf> {
    THOUGHTS
        .iter()
        .chain(&SIGNATURES)
        .flat_map(|n| files_holding(state, n))
        .collect()
}

/// Every page of the session's `session.read`, one entry each, in `media` mode.
fn pages(s: &support::serve::Serve, media: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let (status, r) = rpc(
            s,
            "session.read",
            json!({"from_ordinal": from, "limit": 1, "media": media}),
        );
        assert_eq!(status, 200, "{r}");
        let next = r["result"]["next_from_ordinal"].as_u64();
        out.push(r["result"].clone());
        match next {
            Some(n) => from = n,
            None => return out,
        }
    }
}

#[test]
fn serve_prunes_reasoning_in_place_and_the_session_goes_on_without_it() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // An older sealed copy of the session, restored: the prune takes it out too.
    imported_packed_and_restored(&state, dir.path());
    assert!(!reasoning_anywhere(&state).is_empty());

    let config = dir.path().join("broca.json");
    std::fs::write(&config, json!({"prune_reasoning": true}).to_string()).unwrap();
    let requests = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&requests, &peer.url());
    let mut cmd = command(
        &state,
        &proxy.url(),
        &["--config", config.to_str().unwrap()],
    );
    cmd.stderr(std::process::Stdio::inherit());
    let s = spawn(&mut cmd, &state);

    let (_, d) = rpc(&s, "role.describe", json!({}));
    assert!(
        d["result"]["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("archive_prunes_reasoning")),
        "{d}"
    );
    assert_eq!(
        d["result"]["archive_prunes_reasoning"],
        json!({"kinds": ["reasoning"]})
    );
    let before = pages(&s, "blocks");
    assert!(before.iter().all(|p| p.get("pruned_reasoning").is_none()));
    let (_, head) = rpc(&s, "session.head", json!({}));
    assert!(head["result"].get("reasoning_pruned").is_none(), "{head}");

    let (status, r) = rpc(&s, "broca.debug.archive_now", json!({}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["result"]["packed"].clone(), r["result"]["pruned"].clone()),
        (json!(true), json!(true)),
        "{r}"
    );
    // Neither the live WAL (packed) nor any sealed copy holds a thought or a signature,
    // and the store's projection is made again from the pruned log.
    assert_eq!(reasoning_anywhere(&state), Vec::<PathBuf>::new());
    store_matches_the_wals(&state);

    let after = pages(&s, "blocks");
    assert_eq!(before.len(), after.len());
    let mut listed = 0;
    for (b, a) in before.iter().zip(&after) {
        let (old, new) = (&b["messages"][0], &a["messages"][0]);
        for field in ["mid", "ordinal", "digest", "part_digests", "written_at"] {
            assert_eq!(old[field], new[field], "{field} of {old}");
        }
        assert_eq!(a["history_version"], b["history_version"]);
        let Some(thought) = old["message"]["content"][0].get("thinking") else {
            assert!(a.get("pruned_reasoning").is_none(), "{a}");
            assert_eq!(old, new);
            continue;
        };
        listed += 1;
        // Emptied in place: the text beside it kept byte for byte.
        assert_eq!(
            new["message"]["content"][0],
            json!({"thinking": {"text": ""}})
        );
        assert_eq!(new["message"]["content"][1], old["message"]["content"][1]);
        // Its canonical (RFC 8785) bytes: keys sorted, no space (no text here needs escaping).
        let canonical = format!(
            r#"{{"thinking":{{"signature":{},"text":{}}}}}"#,
            thought["signature"], thought["text"]
        );
        assert_eq!(
            a["pruned_reasoning"],
            json!([{"mid": old["mid"], "part": "0", "kind": "reasoning",
                "bytes": canonical.len(),
                "sha256": old["part_digests"][0]["digest"]}]),
            "{a}"
        );
        assert_eq!(a["reasoning_pruned"]["generation"], 1, "{a}");
    }
    assert_eq!(listed, 2);
    let (_, head) = rpc(&s, "session.head", json!({}));
    assert_eq!(
        head["result"]["reasoning_pruned"]["generation"], 1,
        "{head}"
    );
    assert_eq!(head["result"]["reasoning_pruned"]["through_ordinal"], 4);
    // Inline reads name each part's key.
    assert_eq!(
        pages(&s, "inline")[1]["messages"][0]["part_keys"],
        json!(["0", "1"])
    );

    // The session goes on: its request carries the kept text and none of the reasoning.
    send_until_completed(&s, json!({"prompt": "hello", "model": "anthropic/m"}));
    let sent = recorded_bodies(&requests);
    assert_eq!(sent.len(), 1);
    let body = sent[0].to_string();
    assert!(body.contains("answer 1"), "{body}");
    assert!(!body.contains("\"thinking\""), "{body}");
    for old in THOUGHTS.iter().chain(&SIGNATURES) {
        assert!(!body.contains(old), "{body}");
    }
    let later = pages(&s, "blocks");
    for (l, a) in later.iter().zip(&after) {
        for field in ["messages", "pruned_reasoning", "reasoning_pruned"] {
            assert_eq!(l.get(field), a.get(field), "the pruned history as it was");
        }
    }
    store_matches_the_wals(&state);
}

/// Waits until the store's projections are those of the WALs as they are now (its thread
/// projects a batch 100 ms after a session moves on).
fn store_matches_the_wals(state: &Path) {
    support::serve::wait_for("the store to match the WALs", || {
        broca(state)
            .args(["store", "check"])
            .output()
            .unwrap()
            .status
            .success()
    });
}

#[test]
fn a_prune_cut_at_each_step_of_its_pack_is_finished_by_the_next_pack() {
    let prune = ["archive", "pack", "--idle-days", "0", "--prune-reasoning"];
    for point in ["archive_written", "archive_sealed", "archive_removed_one"] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let address = imported_packed_and_restored(&state, dir.path());
        let o = broca(&state)
            .env("BROCA_CRASH_AT", point)
            .args(prune)
            .output()
            .unwrap();
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGABRT),
            "{point}: {}",
            text(&o)
        );
        // Read once meanwhile: the live WAL, or the newest sealed copy.
        let dump = ok(broca(&state)
            .args(["wal", "dump"])
            .arg(state.join("wal").join(format!("{address}.wal")))
            .output()
            .unwrap());
        let pruned = dump.matches("\"reasoning_pruned\"").count();
        assert!(pruned <= 1, "{point}: {dump}");
        assert_eq!(dump.contains(THOUGHTS[0]), pruned == 0, "{point}: {dump}");
        let out = ok(broca(&state).args(prune).output().unwrap());
        assert!(
            !state.join("wal").join(format!("{address}.wal")).exists(),
            "{point}: {out}"
        );
        assert_eq!(reasoning_anywhere(&state), Vec::<PathBuf>::new(), "{point}");
        let dump = ok(broca(&state)
            .args(["wal", "dump"])
            .arg(state.join("wal").join(format!("{address}.wal")))
            .output()
            .unwrap());
        assert_eq!(
            dump.matches("\"reasoning_pruned\"").count(),
            1,
            "{point}: {dump}"
        );
        assert!(dump.contains("\"generation\":1"), "{point}: {dump}");
        let list = ok(broca(&state).args(["archive", "list"]).output().unwrap());
        let copies = list
            .lines()
            .filter(|l| l.trim_start().starts_with(&format!("{address}.wal")))
            .count();
        assert_eq!(copies, 1, "{point}: one sealed copy: {list}");
    }
}
