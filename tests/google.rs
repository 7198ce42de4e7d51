//! The Gemini and Code Assist families against a loopback Google peer (tests/peers/
//! google_peer.py): thought parts and thoughtSignatures go back byte for byte on the parts
//! they came with, a call the provider sent without an id gets a stable one that is recorded
//! and never sent back, usage maps onto the canonical measures, and Code Assist wraps the
//! same request in its envelope with the OAuth bearer and the project.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use support::{assert_refused_naming, broca, dump_all, last_json, peers_dir, Peer};

fn tools_config(dir: &Path) -> std::path::PathBuf {
    let tools = dir.join("tools.json");
    let cfg = json!({"mcp": [{"name": "counting",
        "command": ["python3", peers_dir().join("counting_mcp.py")],
        "env": {"COUNT_FILE": dir.join("calls.jsonl")}}]});
    std::fs::write(&tools, cfg.to_string()).unwrap();
    tools
}

fn run(state: &Path, model: &str, base: &str, tools: &Path, env: &[(&str, &str)]) -> Output {
    broca(state)
        .envs(env.iter().copied())
        .args(["run", "--model", model, "--base-url", base, "--json"])
        .arg("--tools-config")
        .arg(tools)
        .arg("record a note")
        .output()
        .unwrap()
}

fn requests(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn assert_round_trip(state: &Path, o: &Output) -> Value {
    let r = last_json(o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Signatures came back.", "{r}");
    // The first step's blocks: the thought with its signature, then the call's signature
    // kept as a Thinking block without text before it, the call with the id broca made.
    let steps: Vec<Value> = dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "model_step_finished")
        .map(|r| r["record"].clone())
        .collect();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps[0]["content"],
        json!([
            {"thinking": {"text": "I should record it.", "signature": "c2lnLXRob3VnaHQtMDAx"}},
            {"thinking": {"text": "", "signature": "c2lnLWNhbGwtMDAy"}},
            {"tool_use": {"id": "gemini-call-1-0", "name": "record", "input": {"note": "hi"}}}
        ])
    );
    assert_eq!(steps[0]["finish_reason"], "tool_use");
    assert_eq!(
        steps[0]["usage"],
        json!({"input": 50, "output": 20, "reasoning": 12})
    );
    assert_eq!(
        steps[1]["usage"],
        json!({"input": 90, "output": 4, "cache_read": 50})
    );
    r
}

/// One conversation with the Google peer as `model` (two requests: the call, then its
/// result), checked by [`assert_round_trip`]; returns the requests the peer saw.
fn exchange(model: &str, env: &[(&str, &str)]) -> (tempfile::TempDir, Peer, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("google_peer.py", &log);
    let state = dir.path().join("state");
    let tools = tools_config(dir.path());
    let o = run(&state, model, &peer.url(), &tools, env);
    assert_round_trip(&state, &o);
    let reqs = requests(&log);
    assert_eq!(reqs.len(), 2);
    (dir, peer, reqs)
}

#[test]
fn gemini_sends_thought_signatures_back_where_they_came_from() {
    let (_dir, _peer, reqs) = exchange(
        "gemini/gemini-2.5-flash",
        &[("GEMINI_API_KEY", "gm-key-0123456789")],
    );
    for r in &reqs {
        assert_eq!(
            r["path"],
            "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(r["x-goog-api-key"], "gm-key-0123456789");
        assert!(r["authorization"].is_null());
    }
    let decls = &reqs[0]["body"]["tools"][0]["functionDeclarations"];
    assert!(
        decls
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "record"),
        "{decls}"
    );
}

#[test]
fn code_assist_wraps_the_request_with_the_bearer_and_the_project() {
    let (dir, peer, reqs) = exchange(
        "code-assist/gemini-2.5-pro",
        &[
            ("GOOGLE_CLOUD_ACCESS_TOKEN", "ya29.test-token-0123"),
            ("GOOGLE_CLOUD_PROJECT", "test-project-1"),
        ],
    );
    for r in &reqs {
        assert_eq!(r["path"], "/v1internal:streamGenerateContent?alt=sse");
        assert_eq!(r["authorization"], "Bearer ya29.test-token-0123");
        assert_eq!(r["body"]["project"], "test-project-1");
        assert_eq!(r["body"]["model"], "gemini-2.5-pro");
        assert!(r["body"]["user_prompt_id"]
            .as_str()
            .unwrap()
            .starts_with("broca-"));
        assert!(r["body"]["request"]["contents"].is_array());
    }
    // Without a project the send is refused at admission, naming what to set.
    assert_refused_naming(
        &dir.path().join("state2"),
        ("GOOGLE_CLOUD_ACCESS_TOKEN", "ya29.test-token-0123"),
        "GOOGLE_CLOUD_PROJECT",
        "code-assist/gemini-2.5-pro",
        &peer.url(),
    );
}
