//! llm-runner/v1 `structured_output` through `broca serve`: a send asking for a shape, the
//! provider (aimock, behind a proxy that keeps each request as broca sent it) answering, and
//! what `run.result` and `run.status` report, also after a restart; a bad member refused by
//! the field the role names, with nothing written.

mod support;

use std::path::Path;

use serde_json::{json, Value};
use support::serve::{rpc, Serve};
use support::{fixture, Aimock, Peer};

fn schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})
}

/// `broca serve` on `state` whose Anthropic models all constrain output to schemas (a
/// provider-wide `*` row of the catalog overrides), reaching aimock through `proxy`.
fn serve(state: &Path, aimock: &Aimock, proxy: &Peer) -> Serve {
    let catalog = state.join("catalog.json");
    std::fs::write(
        &catalog,
        json!({"models": [{"provider": "anthropic", "model": "*",
            "capability": {"structured_output": true}}]})
        .to_string(),
    )
    .unwrap();
    support::serve::start_env(
        state,
        aimock,
        &[],
        &[
            ("BROCA_CATALOG_FILE", catalog.to_str().unwrap()),
            ("BROCA_BASE_URL_ANTHROPIC", &proxy.url()),
        ],
    )
}

/// Sends `prompt` with `structured_output` and no tools; answers the ended run's result.
fn run(s: &Serve, session: &str, prompt: &str, so: Value) -> Value {
    let (status, r) = rpc(
        s,
        "session.send",
        json!({"session": session, "prompt": prompt, "model": "anthropic/m", "tools": [],
            "structured_output": so}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    let result = support::serve::result_when_ended(s, session, &run_id);
    let (_, status) = rpc(
        s,
        "run.status",
        json!({"session": session, "run_id": run_id}),
    );
    assert_eq!(
        status["result"]["structured_output"], result["structured_output"],
        "run.status and run.result say the same"
    );
    result
}

/// The request bodies the proxy passed on, in order.
fn requests(file: &Path) -> Vec<Value> {
    support::recorded_bodies(file)
}

#[test]
fn a_shaped_run_reports_its_value_validated_and_keeps_it_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let aimock = Aimock::start(&fixture("structured.json"));
    let log = state.join("requests.jsonl");
    let proxy = Peer::recording_proxy(&log, &aimock.url());
    let s = serve(state, &aimock, &proxy);
    let final_text = json!({"mode": "final_text", "name": "verdict", "schema": schema()});

    // The final text, constrained by the provider and validated by broca.
    let passed = run(&s, "f", "so-final", final_text.clone());
    assert_eq!(passed["state"], "completed", "{passed}");
    let so = &passed["structured_output"];
    assert_eq!(
        (
            &so["mode"],
            &so["enforcement"],
            &so["validation"],
            &so["value"]
        ),
        (
            &json!("final_text"),
            &json!("enforced"),
            &json!("passed"),
            &json!({"answer": "yes"})
        ),
        "{so}"
    );
    assert!(
        so.get("reason").is_none() && so.get("skipped_siblings").is_none(),
        "{so}"
    );
    let sent = requests(&log);
    let format = &sent.last().unwrap()["output_config"]["format"];
    assert_eq!(format["type"], "json_schema", "{format}");
    assert_eq!(
        format["schema"]["additionalProperties"],
        json!(false),
        "the strict form closes the object: {format}"
    );

    // A value the schema refuses: the run still completes, the errors name where.
    let failed = run(&s, "w", "so-wrong", final_text);
    let so = &failed["structured_output"];
    assert_eq!(
        (&failed["state"], &so["validation"]),
        (&json!("completed"), &json!("failed"))
    );
    assert_eq!(
        so["value"],
        json!({"answer": 7}),
        "what the model produced is kept"
    );
    assert!(
        so["errors"][0].as_str().unwrap().starts_with("/answer: "),
        "{so}"
    );

    // submit_result ends the run after its step: the first call counts, the others are
    // never dispatched and listed in the order the model emitted them.
    let before = requests(&log).len();
    let submitted = run(
        &s,
        "t",
        "so-submit",
        json!({"mode": "submit_tool", "schema": schema()}),
    );
    assert_eq!(submitted["state"], "completed", "{submitted}");
    let so = &submitted["structured_output"];
    assert_eq!(
        (&so["validation"], &so["value"]),
        (&json!("passed"), &json!({"answer": "sunny"})),
        "{so}"
    );
    assert_eq!(
        so["skipped_siblings"],
        json!([{"tool_call_id": "call_weather_1", "tool": "get_weather"},
            {"tool_call_id": "call_submit_2", "tool": "submit_result"}])
    );
    let sent = requests(&log);
    assert_eq!(
        sent.len(),
        before + 1,
        "no request after the submitting step"
    );
    let tools = sent.last().unwrap()["tools"].as_array().unwrap().clone();
    let submit = tools
        .iter()
        .find(|t| t["name"] == "submit_result")
        .expect("submit_result is offered");
    assert_eq!(
        (
            &submit["strict"],
            &submit["input_schema"]["additionalProperties"]
        ),
        (&json!(true), &json!(false))
    );
    let (_, calls) = rpc(
        &s,
        "run.tool_calls",
        json!({"session": "t", "run_id": submitted["run_id"]}),
    );
    let outcome = |id: &str| {
        calls["result"]["calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tool_call_id"] == id)
            .map(|c| c["outcome"].clone())
    };
    assert_eq!(
        outcome("call_weather_1"),
        Some(json!("not_executed")),
        "{calls}"
    );

    // A schema that refers outside itself is refused by name, and nothing is written.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"session": "x", "prompt": "so-final", "model": "anthropic/m", "tools": [],
            "structured_output": {"mode": "final_text", "schema": {"$ref": "https://example.com/s.json"}}}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(
        r["error"]["detail"]["field"], "structured_output.schema",
        "{r}"
    );
    let (_, head) = rpc(&s, "session.head", json!({"session": "x"}));
    assert!(head["result"]["last_run_state"].is_null(), "{head}");

    // The result is the run's terminal record's: a restarted broca reports the same.
    let want = submitted["structured_output"].clone();
    drop(s);
    let s = serve(state, &aimock, &proxy);
    let (_, again) = rpc(
        &s,
        "run.result",
        json!({"session": "t", "run_id": submitted["run_id"]}),
    );
    assert_eq!(again["result"]["structured_output"], want);
}
