//! `broca import` and `session.import` on logs the real CLIs wrote (tests/fixtures/import,
//! recorded by its record.sh: @anthropic-ai/claude-code and @openai/codex against aimock,
//! offline): episodes in the WAL, re-imports, appended tails, bad logs, a crash in the
//! middle of an import, and imported sessions continued through `broca run` against aimock,
//! whose journal shows the request each family was sent.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{json, Value};
use support::{broca, dump_all, fixture, Aimock};

const CLAUDE_SESSION: &str = "ed0969a8-e9e3-4aa7-bf96-cfdf3f9ea65e";
const CODEX_SESSION: &str = "01a232bc-ef28-7cb1-9538-0ccf061ff1f0";
/// The working directory both CLIs ran in: the imported sessions' project root.
const CWD: &str = "/tmp/imp/home/work";

fn log(name: &str) -> PathBuf {
    fixture(&format!("import/{name}"))
}

fn import(state: &Path, format: &str, paths: &[&Path], extra: &[&str]) -> Output {
    broca(state)
        .args(["import", format, "--json"])
        .args(extra)
        .args(paths)
        .output()
        .expect("broca runs")
}

/// Each stdout line of an import, as JSON.
fn answers(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn ok(out: Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    answers(&out)
}

fn episodes(state: &Path) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "episode_imported")
        .map(|r| r["record"].clone())
        .collect()
}

/// The digest of each WAL file of the state dir.
fn wal_bytes(state: &Path) -> Vec<String> {
    let mut files = broca::wal::listing::wal_dir_files(&state.join("wal")).unwrap();
    files.sort();
    files
        .iter()
        .map(|f| {
            blake3::hash(&std::fs::read(f).unwrap())
                .to_hex()
                .to_string()
        })
        .collect()
}

#[test]
fn a_log_imports_once_and_its_longer_version_appends_only_its_new_lines() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let first = ok(import(
        state,
        "claude-code",
        &[&log("claude_killed.jsonl")],
        &[],
    ));
    assert_eq!(first.len(), 1);
    let a = &first[0];
    assert_eq!(
        (&a["project_root"], &a["harness"], &a["session"]),
        (&json!(CWD), &json!("claude-code"), &json!(CLAUDE_SESSION)),
        "the session comes from the log"
    );
    assert_eq!(
        (&a["existing"], &a["first_line"], &a["last_line"]),
        (&json!(false), &json!(1), &json!(22))
    );
    assert_eq!(a["pending"], json!(["toolu_fixture_2"]), "{a}");

    // The same log again: nothing written, not even a lease record.
    let before = wal_bytes(state);
    let again = ok(import(
        state,
        "claude-code",
        &[&log("claude_killed.jsonl")],
        &[],
    ));
    assert_eq!(
        again[0]["existing"], true,
        "the same log was imported again: {}",
        again[0]
    );
    assert_eq!(again[0]["import_id"], a["import_id"]);
    assert_eq!(
        wal_bytes(state),
        before,
        "the same log again wrote to the WAL"
    );

    // The session went on in Claude Code: the longer log brings only its new lines, and
    // the call the kill interrupted is an unknown outcome, never a success.
    let tail = ok(import(
        state,
        "claude-code",
        &[&log("claude_resumed.jsonl")],
        &[],
    ));
    let t = &tail[0];
    assert_eq!(
        (&t["first_line"], &t["last_line"]),
        (&json!(23), &json!(34)),
        "{t}"
    );
    assert_eq!(
        t["outcome_unknown"],
        json!(["toolu_fixture_2"]),
        "an interrupted call was counted a success: {t}"
    );
    let eps = episodes(state);
    assert_eq!(eps.len(), 2);
    assert_eq!(eps[1]["origin"]["continues"], a["import_id"]);
    let digest = blake3::hash(&std::fs::read(log("claude_resumed.jsonl")).unwrap());
    assert_eq!(eps[1]["origin"]["blake3"], digest.to_hex().as_str());
    assert_eq!(
        eps[1]["origin"]["source"],
        log("claude_resumed.jsonl").to_str().unwrap()
    );
    let result = &eps[1]["messages"][0]["content"][0]["tool_result"];
    assert_eq!(result["tool_use_id"], "toolu_fixture_2");
    assert_eq!(result["is_error"], true);
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .starts_with("outcome unknown"),
        "{result}"
    );
    // Usage exactly as the log reported it, with where it came from.
    let u = &eps[0]["usage"][0];
    assert_eq!(
        u["usage"],
        json!({"input": 210, "output": 25, "cache_read": 0, "cache_write": 0, "reasoning": 0})
    );
    assert_eq!(u["reported"]["input_tokens"], 210);
    assert_eq!(u["model"], "claude-opus-5-5");
    assert!(u["line"].as_u64().unwrap() > 0);

    // The shorter log after the longer one is not a continuation: refused, nothing written.
    let before = wal_bytes(state);
    let out = import(state, "claude-code", &[&log("claude_killed.jsonl")], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a longer version"), "{err}");
    assert_eq!(wal_bytes(state), before);
}

#[test]
fn a_folder_imports_every_log_in_it_each_into_its_own_session() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("projects/-tmp-imp-home-work");
    std::fs::create_dir_all(&logs).unwrap();
    for name in ["claude_tool.jsonl", "claude_resumed.jsonl"] {
        std::fs::copy(log(name), logs.join(name)).unwrap();
    }
    std::fs::write(logs.join("notes.txt"), "not a log").unwrap();
    let state = dir.path().join("state");
    let all = ok(import(
        &state,
        "claude-code",
        &[&dir.path().join("projects")],
        &[],
    ));
    let sessions: Vec<&Value> = all.iter().map(|a| &a["session"]).collect();
    assert_eq!(
        sessions,
        [CLAUDE_SESSION, "c91ccee2-1853-4b59-a4f2-6a0b195a4ad9"],
        "in path order, the other file skipped"
    );
    let wals = broca::wal::listing::wal_dir_files(&state.join("wal")).unwrap();
    assert_eq!(wals.len(), 2);
    // The flags name one session for every log.
    let state = dir.path().join("state2");
    let all = ok(import(
        &state,
        "claude-code",
        &[&logs],
        &["--session", "mine", "--project-root", "/p"],
    ));
    assert!(all
        .iter()
        .all(|a| a["session"] == "mine" && a["project_root"] == "/p"));
    let wals = broca::wal::listing::wal_dir_files(&state.join("wal")).unwrap();
    assert_eq!(wals.len(), 1);
}

#[test]
fn a_malformed_log_names_file_and_line_and_writes_nothing_and_a_cut_one_waits_for_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let whole = std::fs::read(log("codex_tool.jsonl")).unwrap();
    let lines: Vec<&[u8]> = whole.split_inclusive(|&b| b == b'\n').collect();
    let bad = dir.path().join("bad.jsonl");
    let mut bytes = lines[..11].concat();
    bytes.extend_from_slice(
        b"{\"type\":\"response_item\",\"payload\":{\"type\":\"function_call\",\"name\":\"x\"}}\n",
    );
    bytes.extend_from_slice(&lines[11..].concat());
    std::fs::write(&bad, &bytes).unwrap();
    let out = import(&state, "codex", &[&bad], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:12: a tool item without its call_id",
            bad.display()
        )),
        "{err}"
    );
    assert!(broca::wal::listing::wal_dir_files(&state.join("wal"))
        .unwrap()
        .is_empty());

    // A log cut in its last line (still being written, or copied mid-write): the complete
    // lines go in; the rest follows once the log is whole.
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, &whole[..lines[..17].concat().len() + 30]).unwrap();
    let first = ok(import(&state, "codex", &[&cut], &[]));
    assert_eq!(first[0]["last_line"], 17);
    assert!(
        first[0]["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .starts_with("line 18: the line is incomplete")),
        "{}",
        first[0]
    );
    std::fs::write(&cut, &whole).unwrap();
    let rest = ok(import(&state, "codex", &[&cut], &[]));
    assert_eq!(
        (&rest[0]["first_line"], &rest[0]["last_line"]),
        (&json!(18), &json!(25))
    );
    // Together they hold the conversation the whole log does.
    let fresh = dir.path().join("fresh");
    ok(import(&fresh, "codex", &[&log("codex_tool.jsonl")], &[]));
    let text = |state: &Path| {
        episodes(state)
            .iter()
            .flat_map(|e| e["messages"].as_array().unwrap().clone())
            .map(|m| m["content"].to_string())
            .collect::<String>()
    };
    assert_eq!(text(&state), text(&fresh));
    assert!(import(&state, "nope", &[&cut], &[]).status.code() == Some(2));
}

#[test]
fn an_import_killed_in_its_write_leaves_nothing_and_one_killed_after_it_is_not_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    // Torn in the middle of the import's write (the second batch: the lease record is the
    // first), before its fdatasync: the torn tail is cut at the next open.
    let out = broca(state)
        .env("BROCA_CRASH_AT", "mid_write:2")
        .args(["import", "codex"])
        .arg(log("codex_tool.jsonl"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the process aborted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("in the middle of a write"));
    assert!(
        episodes(state).is_empty(),
        "no half of an episode is readable"
    );
    let again = ok(import(state, "codex", &[&log("codex_tool.jsonl")], &[]));
    assert_eq!(again[0]["existing"], false);
    assert_eq!(episodes(state).len(), 1);
    // Killed once the episode is durable, before the answer: the import is there whole, and
    // importing again adds nothing.
    let other = dir.path().join("other");
    let out = broca(&other)
        .env("BROCA_CRASH_AT", "imported:1")
        .args(["import", "claude-code"])
        .arg(log("claude_tool.jsonl"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "killed before it answered");
    assert_eq!(episodes(&other).len(), 1);
    let again = ok(import(
        &other,
        "claude-code",
        &[&log("claude_tool.jsonl")],
        &[],
    ));
    assert_eq!(again[0]["existing"], true);
    assert_eq!(episodes(&other).len(), 1);
}

const KEY: &str = "sk-import-0123456789abcdef";

/// `broca run` in the imported session, against aimock behind a proxy that keeps each
/// request as broca sent it; answers the body of the request for the run.
fn continue_run(state: &Path, peer: &Aimock, model: &str, harness: &str, session: &str) -> Value {
    let requests = state.join("requests.jsonl");
    let _ = std::fs::remove_file(&requests);
    let proxy = support::Peer::start(
        std::process::Command::new("python3")
            .arg(support::peers_dir().join("recording_proxy.py"))
            .env("REQUESTS_FILE", &requests)
            .env("UPSTREAM", peer.url()),
    );
    let out = broca(state)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("OPENAI_API_KEY", KEY)
        .args(["run", "--model", model, "--base-url", &proxy.url()])
        .args([
            "--project-root",
            CWD,
            "--harness",
            harness,
            "--session",
            session,
        ])
        .args(["--max-steps", "1", "--json", "hello"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = support::last_json(&out);
    assert_eq!(
        answer["final_message"]["text"], "Hello! How can I help you today?",
        "{answer}"
    );
    let text = std::fs::read_to_string(&requests).unwrap();
    let sent: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sent.len(), 1, "one request for the one step: {text}");
    serde_json::from_str(sent[0]["body"].as_str().unwrap()).expect("the request is JSON")
}

/// An Anthropic request is valid for a continued conversation: roles alternate, every
/// tool_use is answered by a tool_result in the very next message, no result answers a
/// call that was not made, and every thinking block carries its signature.
fn assert_valid_anthropic(body: &Value) -> Vec<String> {
    let messages = body["messages"].as_array().expect("messages");
    let mut ids = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            assert_ne!(
                m["role"],
                messages[i - 1]["role"],
                "roles alternate at {i}: {body}"
            );
        }
        let blocks = m["content"].as_array().cloned().unwrap_or_default();
        for b in &blocks {
            if b["type"] == "thinking" {
                assert!(
                    b["signature"].as_str().is_some_and(|s| !s.is_empty()),
                    "{b}"
                );
            }
            if b["type"] == "tool_result" {
                let prev = &messages[i - 1]["content"];
                let called = prev
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["type"] == "tool_use" && c["id"] == b["tool_use_id"]);
                assert!(
                    called,
                    "a result for a call the message before did not make: {b}"
                );
            }
        }
        let calls: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
        for c in calls {
            ids.push(c["id"].as_str().unwrap().to_string());
            let next = messages
                .get(i + 1)
                .unwrap_or_else(|| panic!("a dangling call {c}"));
            let answered = next["content"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["type"] == "tool_result" && r["tool_use_id"] == c["id"]);
            assert!(answered, "no result for {c} in the next message: {body}");
        }
    }
    ids
}

/// An OpenAI Responses request is valid: every function_call has its output, after it,
/// with the same call_id, and no output answers a call not made.
fn assert_valid_responses(body: &Value) -> Vec<String> {
    let input = body["input"].as_array().expect("input items");
    let mut calls = Vec::new();
    for (i, item) in input.iter().enumerate() {
        match item["type"].as_str() {
            Some("function_call") => {
                let id = item["call_id"].as_str().unwrap();
                let answered = input[i + 1..]
                    .iter()
                    .any(|o| o["type"] == "function_call_output" && o["call_id"] == id);
                assert!(answered, "no output for {item}: {body}");
                calls.push(id.to_string());
            }
            Some("function_call_output") => {
                let made = input[..i]
                    .iter()
                    .any(|c| c["type"] == "function_call" && c["call_id"] == item["call_id"]);
                assert!(made, "an output for a call not made: {item}");
            }
            _ => {}
        }
    }
    calls
}

#[test]
fn an_imported_claude_code_session_continues_with_valid_anthropic_requests() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let peer = Aimock::start(&fixture("aimock.json"));
    // Killed in its tool call and imported as it was: the send resolves the call as an
    // unknown outcome; the request carries the caller's own tool id.
    ok(import(
        state,
        "claude-code",
        &[&log("claude_killed.jsonl")],
        &[],
    ));
    let body = continue_run(
        state,
        &peer,
        "anthropic/test-model",
        "claude-code",
        CLAUDE_SESSION,
    );
    assert_eq!(assert_valid_anthropic(&body), ["toolu_fixture_2"]);
    let text = body.to_string();
    assert!(
        text.contains("fixture-slow: wait for a while") && text.contains("outcome unknown"),
        "{text}"
    );
    let last = body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["content"].as_array().unwrap().last().unwrap()["text"],
        "hello"
    );
    let runs: Vec<Value> = dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .collect();
    let resolved = &runs[0]["record"]["resolved_calls"][0];
    assert_eq!(resolved["reason"], "outcome_unknown");
    assert!(
        resolved["content"]
            .as_str()
            .unwrap()
            .contains("the imported session stopped"),
        "{resolved}"
    );

    // The whole session (resumed in Claude Code), imported fresh and continued.
    let other = dir.path().join("other");
    ok(import(
        &other,
        "claude-code",
        &[&log("claude_resumed.jsonl")],
        &[],
    ));
    let body = continue_run(
        &other,
        &peer,
        "anthropic/test-model",
        "claude-code",
        CLAUDE_SESSION,
    );
    assert_eq!(assert_valid_anthropic(&body), ["toolu_fixture_2"]);
    assert!(body
        .to_string()
        .contains("Picking up after the interrupted call."));
}

#[test]
fn an_imported_codex_session_continues_with_valid_responses_requests() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let peer = Aimock::start(&fixture("aimock.json"));
    ok(import(state, "codex", &[&log("codex_resumed.jsonl")], &[]));
    let body = continue_run(
        state,
        &peer,
        "openai-responses/test-model",
        "codex",
        CODEX_SESSION,
    );
    assert_eq!(assert_valid_responses(&body), ["call_codex_2"]);
    let text = body.to_string();
    assert!(
        text.contains("continue after the kill") && text.contains("outcome unknown"),
        "{text}"
    );
    // The reasoning Codex's provider encrypted is not sent to another.
    assert!(!text.contains("encrypted"), "{text}");
    // And a completed tool call keeps its output.
    let other = dir.path().join("other");
    ok(import(&other, "codex", &[&log("codex_tool.jsonl")], &[]));
    let body = continue_run(
        &other,
        &peer,
        "openai-responses/test-model",
        "codex",
        "01a232bc-d3ba-7ee3-a285-c64ceebc75b8",
    );
    assert_eq!(assert_valid_responses(&body), ["call_codex_1"]);
    assert!(body.to_string().contains("imported-hello"));
}

#[test]
fn session_import_on_a_running_serve_has_the_same_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let peer = Aimock::start(&fixture("aimock.json"));
    let fixtures = fixture("import");
    let (fixtures, temp) = (fixtures.to_str().unwrap(), state.to_str().unwrap());
    let s = support::serve::start(
        state,
        &peer,
        &["--import-root", fixtures, "--import-root", temp],
    );
    let call = |params: Value| {
        support::serve::post(
            &s,
            &json!({"method": "session.import", "params": params}).to_string(),
        )
    };
    let killed = log("claude_killed.jsonl");
    let (status, first) = call(json!({"format": "claude-code", "path": killed}));
    assert_eq!(status, 200, "{first}");
    let r = &first["result"];
    assert_eq!(
        (&r["session"], &r["existing"], &r["pending"]),
        (
            &json!(CLAUDE_SESSION),
            &json!(false),
            &json!(["toolu_fixture_2"])
        ),
        "{r}"
    );
    let (_, again) = call(json!({"format": "claude-code", "path": killed}));
    assert_eq!(again["result"]["existing"], true, "{again}");
    let (_, tail) = call(json!({"format": "claude-code", "path": log("claude_resumed.jsonl")}));
    assert_eq!(
        tail["result"]["outcome_unknown"],
        json!(["toolu_fixture_2"]),
        "{tail}"
    );
    // session.read pages the imported transcript.
    let read = json!({"method": "session.read", "params": {"project_root": CWD, "harness": "claude-code", "session": CLAUDE_SESSION}});
    let (_, page) = support::serve::post(&s, &read.to_string());
    assert_eq!(
        page["result"]["messages"].as_array().map(Vec::len),
        Some(6),
        "{page}"
    );
    assert_eq!(
        page["result"]["messages"][0]["message"]["content"][0]["text"]["text"],
        "fixture-slow: wait for a while"
    );
    // Bad requests and bad logs: clear errors, nothing written.
    let (status, e) = call(json!({"format": "claude-code", "path": "relative.jsonl"}));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("invalid_params")),
        "{e}"
    );
    let (status, e) = call(json!({"format": "aider", "path": "/x"}));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("invalid_params")),
        "{e}"
    );
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"type\":\"user\",\"sessionId\":\"zz\",\"cwd\":\"/p\",\"message\":{\"role\":\"user\",\"content\":\"hi\"}}\nnot json\n").unwrap();
    let (status, e) = call(json!({"format": "claude-code", "path": bad}));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("import_malformed")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad.jsonl:2:"),
        "{e}"
    );
    let (status, e) = call(json!({"format": "claude-code", "path": "/no/such/log.jsonl"}));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("import_unreadable")),
        "{e}"
    );
    // A folder: one entry per log, each with its answer or its error.
    let folder = dir.path().join("logs");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy(log("codex_tool.jsonl"), folder.join("a.jsonl")).unwrap();
    std::fs::copy(&bad, folder.join("b.jsonl")).unwrap();
    let (status, all) = call(json!({"format": "codex", "path": folder}));
    assert_eq!(status, 200, "{all}");
    let entries = all["result"]["imports"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["harness"], "codex");
    assert_eq!(entries[1]["error"]["code"], "import_malformed", "{all}");
}
