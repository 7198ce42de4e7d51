//! The demo model (`demo/tour`) on a machine with no key and no network: the whole durable
//! loop through `broca run` and through `broca serve` with `broca send`, including a
//! `kill -9` in the middle of its tool call and the restart that seals the run without
//! running the call again.

mod support;

use serde_json::Value;
use support::{broca, dump_all, last_json};

/// The records of one kind in the state dir's WALs.
fn records(state: &std::path::Path, kind: &str) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect()
}

#[test]
fn broca_run_shows_the_loop_offline_with_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let o = broca(&state)
        .env_remove("ANTHROPIC_API_KEY")
        .current_dir(dir.path())
        .args([
            "run",
            "--model",
            "demo/tour",
            "--json",
            "count these five words please",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let result = last_json(&o);
    assert_eq!(result["state"], "completed", "{result}");
    assert!(
        result["final_message"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("your message has 5 words"),
        "{result}"
    );
    // Two model steps' usage, and a cost of zero.
    assert_eq!(result["usage"]["output"], 90, "{result}");
    assert_eq!(result["cost"]["micros"], 0, "{result}");
    // One durable intent, one result: the tool ran once, through the WAL like any tool.
    assert_eq!(records(&state, "tool_dispatch_intent").len(), 1);
    assert_eq!(records(&state, "tool_result").len(), 1);
    // A demo is free.
    let o = broca(&state).args(["export", "usage"]).output().unwrap();
    assert!(o.status.success());
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let fact: Value = serde_json::from_str(line).unwrap();
        assert_eq!(fact["provider"], "demo", "{fact}");
        assert_eq!(
            (
                &fact["charge_basis"]["input"],
                &fact["charge_basis"]["output"]
            ),
            (&serde_json::json!(0.0), &serde_json::json!(0.0)),
            "{fact}"
        );
    }
}

#[test]
fn a_kill_in_the_middle_of_the_demo_tool_seals_the_run_and_never_runs_the_call_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let serve = || {
        let mut cmd = broca(&state);
        cmd.env_remove("ANTHROPIC_API_KEY").args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "2",
        ]);
        support::serve::spawn(&mut cmd, &state)
    };
    let mut s = serve();
    let base = ["--project-root", "/demo", "--session", "s1"];
    support::serve::kill_mid_demo_tool(&state, &mut s, &base, "one two three");
    drop(s);

    let _s = serve();
    let o = broca(&state)
        .arg("status")
        .args(base)
        .arg("--json")
        .output()
        .unwrap();
    let st = last_json(&o);
    assert_eq!(st["state"], "interrupted", "{st}");
    assert_eq!(
        st["indeterminate_tool_calls"].as_array().map(Vec::len),
        Some(1),
        "{st}"
    );
    // One intent, and its only result says the outcome is unknown: never dispatched again.
    assert_eq!(records(&state, "tool_dispatch_intent").len(), 1);
    let results = records(&state, "tool_result");
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].to_string().contains("outcome unknown"),
        "{}",
        results[0]
    );
}
