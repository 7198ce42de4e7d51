//! The chatgpt family's policy against a loopback ChatGPT backend (tests/peers/
//! chatgpt_peer.py): the headers it sends, quota headers surfaced in run.result and recorded
//! with the step, a usage limit waited out, a refusal ended as one; and the Codex mode over
//! the peer's own WebSocket server (written from RFC 6455 apart from broca's client).

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use support::{assert_refused_naming, broca, dump_all, last_json, Peer};

fn run(state: &Path, base: &str, prompt: &str) -> Output {
    run_at(state, &format!("{base}/backend-api/codex"), prompt)
}

fn run_at(state: &Path, base_url: &str, prompt: &str) -> Output {
    broca(state)
        .env("CHATGPT_ACCESS_TOKEN", "chatgpt-token-0123456789")
        .env("CHATGPT_ACCOUNT_ID", "acct-42")
        .args([
            "run",
            "--model",
            "chatgpt/gpt-5-codex",
            "--base-url",
            base_url,
        ])
        .args(["--json", prompt])
        .output()
        .unwrap()
}

/// The run's failed model attempts, as recorded.
fn failed_attempts(state: &Path, run_id: &Value) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|x| x["kind"] == "model_attempt_finished" && x["record"]["run_id"] == *run_id)
        .map(|x| x["record"].clone())
        .collect()
}

#[test]
fn the_chatgpt_policy_sends_its_headers_surfaces_quota_waits_out_limits_and_ends_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("chatgpt_peer.py", &log);
    let state = dir.path().join("state");

    let o = run(&state, &peer.url(), "quota please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Within quota.");
    let want = json!({"windows": [
        {"name": "primary", "used_basis_points": 4250, "window_minutes": 300, "resets_in_seconds": 1200},
        {"name": "secondary", "used_basis_points": 700}
    ]});
    assert_eq!(r["quota"], want, "{r}");
    let steps: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "model_step_finished")
        .collect();
    assert_eq!(steps[0]["record"]["quota"], want, "recorded with the step");

    let o = run(&state, &peer.url(), "limit please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "After the reset.");
    let failed = failed_attempts(&state, &r["run_id"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert_eq!(failed[0]["error"]["retry_after_ms"], 1000);
    assert!(failed[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("usage_limit_reached (plan plus)"));

    let o = run(&state, &peer.url(), "refuse please");
    let r = last_json(&o);
    assert_eq!(r["final_message"]["text"], "I can't help with that.", "{r}");
    let last = dump_all(&state)
        .into_iter()
        .filter(|x| x["kind"] == "model_step_finished")
        .last()
        .unwrap();
    assert_eq!(last["record"]["finish_reason"], json!({"other": "refusal"}));

    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let h: Value = serde_json::from_str(line).unwrap();
        assert_eq!(h["path"], "/backend-api/codex/responses");
        assert_eq!(h["authorization"], "Bearer chatgpt-token-0123456789");
        assert_eq!(h["chatgpt-account-id"], "acct-42");
        assert_eq!(h["openai-beta"], "responses=experimental");
        assert_eq!(h["originator"], "broca");
    }

    // Without the account id the send is refused at admission, naming what to set.
    assert_refused_naming(
        &dir.path().join("state2"),
        ("CHATGPT_ACCESS_TOKEN", "chatgpt-token-0123456789"),
        "CHATGPT_ACCOUNT_ID",
        "chatgpt/gpt-5-codex",
        &peer.url(),
    );
}

#[test]
fn the_codex_mode_speaks_to_a_websocket_server_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let peer = Peer::python("chatgpt_peer.py", &log);
    let state = dir.path().join("state");
    let base = format!(
        "{}/backend-api/codex",
        peer.url().replace("http://", "ws://")
    );

    // Text, one event split over two frames, after a ping; the quota from the upgrade's
    // reply, surfaced and recorded as over HTTP.
    let o = run_at(&state, &base, "quota please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Within quota.");
    let want = json!({"windows": [
        {"name": "primary", "used_basis_points": 4250, "window_minutes": 300, "resets_in_seconds": 1200},
        {"name": "secondary", "used_basis_points": 700}
    ]});
    assert_eq!(r["quota"], want, "{r}");
    assert_eq!(
        r["usage"],
        json!({"input": 11, "output": 3, "cache_read": 0, "reasoning": 0})
    );

    // A usage limit arrives as an error event: waited out as over HTTP, then the answer.
    let o = run_at(&state, &base, "limit please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "After the reset.");
    let failed = failed_attempts(&state, &r["run_id"]);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert_eq!(failed[0]["error"]["retry_after_ms"], 1000);

    // A refusal over the socket ends as one.
    let o = run_at(&state, &base, "refuse please");
    let r = last_json(&o);
    assert_eq!(r["final_message"]["text"], "I can't help with that.", "{r}");

    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 4, "{seen:?}");
    for h in &seen {
        assert_eq!(h["mode"], "websocket");
        assert_eq!(h["path"], "/backend-api/codex/responses");
        assert_eq!(h["version"], "13");
        assert_eq!(h["authorization"], "Bearer chatgpt-token-0123456789");
        assert_eq!(h["chatgpt-account-id"], "acct-42");
        assert_eq!(h["openai-beta"], "responses=experimental");
        assert_eq!(h["originator"], "broca");
        assert_eq!(h["first_opcode"], 1, "the first message is text");
        assert_eq!(h["message_type"], "response.create");
        assert_eq!(h["model"], "gpt-5-codex");
        assert_eq!(
            h["pong"], "are-you-there",
            "the ping answered with its payload"
        );
        assert_eq!(h["unmasked_frames"], 0, "every client frame masked");
        assert_eq!(
            h["client_closed"], true,
            "the socket closed with a close frame: {h}"
        );
    }
}
