//! Conformance against an independent provider peer: `@copilotkit/aimock` serves the
//! Anthropic Messages, OpenAI Chat and OpenAI Responses endpoints (SSE, and Responses over a
//! WebSocket) on loopback from tests/fixtures/aimock.json, and the real `broca run` binary
//! talks to it. Each family: text, a streamed tool call, usage, 429 with Retry-After and 529
//! retried, a truncated stream retried with its partial output dropped, 401 pausing the run,
//! a 400 context-length error, and the key never written anywhere.

mod support;

use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};
use support::{broca, dump_all, fixture, last_json, Aimock};

const KEY: &str = "sk-conformance-0123456789abcdef";

fn run(state: &Path, provider: &str, base_url: &str, session: &str, prompt: &str) -> Output {
    broca(state)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("OPENAI_API_KEY", KEY)
        .env("GEMINI_API_KEY", KEY)
        .env("AWS_ACCESS_KEY_ID", "AKIDCONFORMANCE")
        .env("AWS_SECRET_ACCESS_KEY", KEY)
        .env("AWS_REGION", "us-east-1")
        .env("CHATGPT_ACCESS_TOKEN", KEY)
        .env("CHATGPT_ACCOUNT_ID", "acct-conformance")
        .args(["run", "--model"])
        .arg(format!("{provider}/test-model"))
        .args([
            "--base-url",
            base_url,
            "--session",
            session,
            "--max-steps",
            "1",
            "--json",
        ])
        .arg(prompt)
        .output()
        .expect("broca runs")
}

fn records_of_kind(state: &Path, run_id: &str, kind: &str) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == kind && r["record"]["run_id"] == run_id)
        .map(|r| r["record"].clone())
        .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn conformance(provider: &str, scheme: &str) {
    let peer = Aimock::start(&fixture("aimock.json"));
    let base = format!("{scheme}://127.0.0.1:{}", peer.port);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();

    // Text, streamed, with usage exactly as reported.
    let o = run(state, provider, &base, "text", "hello there");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert!(
        stdout(&o).starts_with("Hello! How can I help you today?\n"),
        "{}",
        stdout(&o)
    );
    assert_eq!(r["state"], "completed");
    assert_eq!(
        r["final_message"]["text"],
        "Hello! How can I help you today?"
    );
    assert_eq!(r["usage"], json!({"input": 12, "output": 9}));

    // A streamed tool call: recorded with the caller's id, name and arguments.
    let o = run(state, provider, &base, "tool", "weather in Paris");
    let r = last_json(&o);
    assert_eq!(o.status.code(), Some(1), "{r}");
    assert_eq!(r["state"], "max_steps");
    let steps = records_of_kind(state, r["run_id"].as_str().unwrap(), "model_step_finished");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["finish_reason"], "tool_use");
    let content = steps[0]["content"].as_array().unwrap();
    assert_eq!(content[0], json!({"text": {"text": "Let me check."}}));
    assert_eq!(
        content[1],
        json!({"tool_use": {"id": "call_weather_1", "name": "get_weather",
                            "input": {"city": "Paris", "unit": "celsius"}}})
    );
    assert_eq!(steps[0]["usage"], json!({"input": 42, "output": 17}));

    // 429 with Retry-After, then success: the failed attempt is recorded, transient, with
    // the wait the provider asked for.
    let o = run(state, provider, &base, "flaky", "flaky please");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "Recovered after retry.");
    let failed = records_of_kind(
        state,
        r["run_id"].as_str().unwrap(),
        "model_attempt_finished",
    );
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"]["class"], "transient");
    let ws = scheme == "ws";
    if !ws {
        // Over a WebSocket the error arrives as an error event: no status, no Retry-After.
        assert_eq!(failed[0]["error"]["retry_after_ms"], 1000);
        assert!(failed[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 429"));
    }

    // 529 overloaded, then success.
    let o = run(state, provider, &base, "overload", "overload now");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    let failed = records_of_kind(
        state,
        r["run_id"].as_str().unwrap(),
        "model_attempt_finished",
    );
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert!(
        ws || failed[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("HTTP 529")
    );

    // A stream cut mid-answer: transient, retried; the partial text is never a step.
    let o = run(state, provider, &base, "cut", "cut short");
    let r = last_json(&o);
    assert!(o.status.success(), "{r}");
    assert_eq!(r["final_message"]["text"], "The whole answer.");
    let run_id = r["run_id"].as_str().unwrap();
    let failed = records_of_kind(state, run_id, "model_attempt_finished");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["error"]["class"], "transient");
    assert!(
        failed[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cut"),
        "{}",
        failed[0]
    );
    let steps = records_of_kind(state, run_id, "model_step_finished");
    assert_eq!(steps.len(), 1);
    assert_eq!(
        steps[0]["content"],
        json!([{"text": {"text": "The whole answer."}}])
    );

    // 401: the run pauses, auth_required.
    let o = run(state, provider, &base, "auth", "err-401");
    let r = last_json(&o);
    assert_eq!(o.status.code(), Some(1), "{r}");
    assert_eq!(
        (r["state"].as_str(), r["reason"].as_str()),
        (Some("paused"), Some("auth_required"))
    );
    assert_eq!(r["error"]["class"], "auth_required");
    assert!(String::from_utf8_lossy(&o.stderr).contains("auth_required"));

    // 400 with the family's context-length signal.
    let prompt = match provider {
        "anthropic" => "ctx-anthropic",
        "gemini" => "ctx-gemini",
        "bedrock" => "ctx-bedrock",
        _ => "ctx-openai",
    };
    let o = run(state, provider, &base, "ctx", prompt);
    let r = last_json(&o);
    assert_eq!(o.status.code(), Some(1), "{r}");
    assert_eq!(r["state"], "context_limit");
    assert_eq!(r["error"]["class"], "context_overflow");

    // The key reached the provider and nothing else.
    support::assert_no_file_holds(state, KEY);
}

#[test]
fn anthropic_messages_against_aimock() {
    conformance("anthropic", "http");
}

#[test]
fn openai_chat_against_aimock() {
    conformance("openai", "http");
}

#[test]
fn openai_responses_against_aimock() {
    conformance("openai-responses", "http");
}

#[test]
fn gemini_against_aimock() {
    conformance("gemini", "http");
}

#[test]
fn bedrock_converse_against_aimock() {
    conformance("bedrock", "http");
}

#[test]
fn chatgpt_against_aimock() {
    conformance("chatgpt", "http");
}

#[test]
fn chatgpt_over_websocket_against_aimock() {
    conformance("chatgpt", "ws");
}

#[test]
fn openai_responses_over_websocket_against_aimock() {
    conformance("openai-responses", "ws");
}

#[test]
fn a_missing_key_refuses_the_send_naming_the_variable_and_writes_nothing() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let o = broca(dir.path())
        .env_remove("ANTHROPIC_API_KEY")
        .args([
            "run",
            "--model",
            "anthropic/m",
            "--base-url",
            &peer.url(),
            "--json",
            "hello",
        ])
        .output()
        .unwrap();
    let r = last_json(&o);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(r["error"]["code"], "auth_required", "{r}");
    assert_eq!(r["error"]["class"], "auth_required", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ANTHROPIC_API_KEY is not set"),
        "{r}"
    );
    let wal = dir.path().join("wal");
    let written = broca::wal::listing::wal_dir_files(&wal).unwrap_or_default();
    assert!(written.is_empty(), "a refused send wrote {written:?}");
}

#[test]
fn bad_usage_exits_2_with_one_line_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    for (args, says) in [
        (vec!["run", "hello"], "--model"),
        (
            vec!["run", "--model", "nope/m", "hi"],
            "unknown provider `nope`",
        ),
        (
            vec![
                "run",
                "--model",
                "openai/m",
                "--base-url",
                "http://example.com",
                "hi",
            ],
            "only for loopback",
        ),
        (vec!["run", "--model", "openai/m"], "PROMPT"),
        (
            vec!["run", "--model", "openai/m", "--max-steps", "x", "hi"],
            "--max-steps",
        ),
    ] {
        let o = broca(dir.path()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}
