//! Steer and interrupt through `broca serve`'s `/v1/rpc`, on the keyless demo model whose
//! built-in tool takes 1.5 s: a steer sent while the tool runs joins after its result; a
//! `kill -9` between a steer's record and its use delivers it once, as the next turn; an
//! interrupt during the tool call waits for the call (never killed, never run again), ends
//! the run cancelled and starts its own run.

mod support;

use serde_json::{json, Value};
use support::serve::{attach_json, rpc, until_unit, wait_for, Serve};
use support::{broca, dump_all};

/// The session `rpc` talks to, as the CLI names it.
const BASE: [&str; 6] = support::serve::CLI_SESSION;

fn serve(state: &std::path::Path) -> Serve {
    let mut cmd = broca(state);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .args(["serve", "--listen", "127.0.0.1:0", "--shards", "2"]);
    support::serve::spawn(&mut cmd, state)
}

/// Sends `prompt` to the demo model and returns once its tool call's intent is durable (the
/// tool then runs for 1.5 s): the run's id.
fn send_until_tool_runs(state: &std::path::Path, s: &Serve) -> String {
    let mut attach = attach_json(state, &BASE);
    let (status, r) = rpc(
        s,
        "session.send",
        json!({"prompt": "count these four words", "model": "demo/tour", "send_id": "first"}),
    );
    assert_eq!(status, 200, "{r}");
    until_unit(&mut attach, "tool_call");
    let _ = attach.kill();
    let _ = attach.wait();
    r["result"]["run_id"].as_str().unwrap().to_string()
}

fn result_of(s: &Serve, run_id: &str) -> Value {
    rpc(s, "run.result", json!({"run_id": run_id})).1["result"].clone()
}

fn wait_ended(s: &Serve, run_id: &str) -> Value {
    wait_for("the run to end", || {
        result_of(s, run_id)["state"] != "active"
    });
    result_of(s, run_id)
}

/// The records of one kind in the state dir's WALs.
fn records(state: &std::path::Path, kind: &str) -> Vec<Value> {
    dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect()
}

/// The session's messages as `session.read` serves them: role and text of each entry.
fn read(s: &Serve) -> Vec<(String, String, String)> {
    let page = rpc(s, "session.read", json!({"limit": 100})).1;
    page["result"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["mid"].as_str().unwrap_or_default().to_string(),
                m["role"].as_str().unwrap_or_default().to_string(),
                m.to_string(),
            )
        })
        .collect()
}

fn steer(s: &Serve, prompt: &str) -> (u16, Value) {
    rpc(
        s,
        "session.send",
        json!({"prompt": prompt, "delivery": "steer", "send_id": "steer-1"}),
    )
}

#[test]
fn a_steer_while_a_tool_runs_joins_after_its_result_and_is_answered_as_that_step() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = serve(&state);
    let run_id = send_until_tool_runs(&state, &s);
    // No model named: the steer takes the running run's settings.
    let (status, r) = steer(&s, "and please say thanks");
    assert_eq!(status, 200, "{r}");
    let first = &r["result"];
    assert_eq!(
        (&first["state"], &first["run_id"]),
        (&json!("active"), &json!(run_id)),
        "{r}"
    );
    assert!(first.get("delivered").is_none(), "not rendered yet: {r}");
    // A setting that differs from the run's is refused by name, nothing written.
    let (status, r) = rpc(
        &s,
        "session.send",
        json!({"prompt": "x", "delivery": "steer", "send_id": "steer-2", "max_steps": 3}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["detail"]["field"], "max_steps", "{r}");

    let ended = wait_ended(&s, &run_id);
    assert_eq!(ended["state"], "completed", "{ended}");
    let (_, again) = steer(&s, "and please say thanks");
    let receipt = &again["result"];
    assert_eq!(receipt["state"], "finished", "{again}");
    assert_eq!(receipt["run_id"], run_id.as_str(), "{again}");
    assert_eq!(receipt["delivered"]["as"], "step", "{again}");
    let mid = receipt["delivered"]["ref"].as_str().unwrap().to_string();
    // The steer's message sits after the tool's result and before the final answer.
    let messages = read(&s);
    let at = messages
        .iter()
        .position(|m| m.0 == mid)
        .expect("the steer's message is read");
    assert_eq!(messages[at].1, "user");
    assert!(
        messages[at].2.contains("and please say thanks"),
        "{:?}",
        messages[at]
    );
    assert_eq!(messages[at - 1].1, "tool", "{messages:?}");
    assert_eq!(messages[at + 1].1, "assistant", "{messages:?}");
    assert_eq!(at + 2, messages.len(), "{messages:?}");
    let status = rpc(&s, "run.status", json!({"run_id": run_id})).1;
    assert_eq!(
        status["result"]["undelivered_steers"],
        json!([]),
        "{status}"
    );
    assert_eq!(records(&state, "send_steered").len(), 1);
    // One run: the steer joined it.
    assert_eq!(records(&state, "run_started").len(), 1);
}

#[test]
fn a_kill_between_a_steers_record_and_its_use_delivers_it_once_as_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // broca aborts right after the steer's record is durable: before its answer, before any
    // step could render it.
    let mut cmd = broca(&state);
    cmd.env_remove("ANTHROPIC_API_KEY")
        .env("BROCA_CRASH_AT", "steered:1")
        .args(["serve", "--listen", "127.0.0.1:0", "--shards", "2"]);
    let mut s = support::serve::spawn(&mut cmd, &state);
    let run_id = send_until_tool_runs(&state, &s);
    let body = json!({"method": "session.send", "params": {
        "project_root": "/proj", "harness": "h", "session": "s1",
        "prompt": "then summarize", "delivery": "steer", "send_id": "steer-1"}})
    .to_string();
    let raw = format!(
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    );
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    std::io::Write::write_all(&mut c, raw.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut answer);
    assert!(answer.is_empty(), "answered before the crash: {answer:?}");
    let died = s.child.wait().unwrap();
    assert!(!died.success(), "broca aborted at its crash point");
    assert_eq!(records(&state, "send_steered").len(), 1);
    drop(s);

    let s = serve(&state);
    let first = wait_ended(&s, &run_id);
    assert_eq!(first["state"], "interrupted", "{first}");
    // The run never rendered it, so it is the next turn: answered as that turn, once.
    wait_for("the steer's turn to start", || {
        steer(&s, "then summarize").1["result"]["delivered"]["as"] == "turn"
    });
    let (_, r) = steer(&s, "then summarize");
    let turn = r["result"]["run_id"].as_str().unwrap().to_string();
    assert_ne!(turn, run_id);
    assert_eq!(r["result"]["delivered"]["ref"], turn.as_str(), "{r}");
    assert_eq!(wait_ended(&s, &turn)["state"], "completed");
    let status = rpc(&s, "run.status", json!({"run_id": run_id})).1;
    assert_eq!(
        status["result"]["undelivered_steers"],
        json!(["steer-1"]),
        "{status}"
    );
    let reads = read(&s);
    let mentions = reads
        .iter()
        .filter(|m| m.1 == "user" && m.2.contains("then summarize"))
        .count();
    assert_eq!(mentions, 1, "{reads:?}");
    // The cut call was never run again: its only result is outcome-unknown (the new turn
    // made a call of its own).
    let first_call = records(&state, "tool_dispatch_intent")[0]["record"]["calls"][0]["id"].clone();
    let results: Vec<Value> = records(&state, "tool_result")
        .into_iter()
        .filter(|r| r["record"]["call_id"] == first_call)
        .collect();
    assert_eq!(
        results.len(),
        1,
        "{first_call}: {:?}",
        records(&state, "tool_result")
    );
    assert!(
        results[0].to_string().contains("outcome unknown"),
        "{}",
        results[0]
    );
    let started = records(&state, "run_started");
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(
        started[1].to_string().contains("steer_seq"),
        "{}",
        started[1]
    );
}

#[test]
fn an_interrupt_during_a_tool_call_waits_for_the_call_then_starts_its_own_run() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = serve(&state);
    let run_id = send_until_tool_runs(&state, &s);
    let interrupt = json!({
        "prompt": "stop; count these three instead",
        "delivery": "interrupt",
        "send_id": "int-1",
    });
    let (status, r) = rpc(&s, "session.send", interrupt.clone());
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["state"], "pending", "{r}");
    let first = wait_ended(&s, &run_id);
    assert_eq!(first["state"], "cancelled", "{first}");
    wait_for("the interrupt's run to start", || {
        rpc(&s, "session.send", interrupt.clone()).1["result"]["delivered"]["as"] == "turn"
    });
    let r = rpc(&s, "session.send", interrupt).1;
    let own = r["result"]["run_id"].as_str().unwrap().to_string();
    assert_ne!(own, run_id);
    assert_eq!(wait_ended(&s, &own)["state"], "completed");
    // The running call was waited for, not killed: its result is the tool's own answer.
    let results = records(&state, "tool_result");
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].to_string().contains("4 words"), "{}", results[0]);
    assert!(results[1].to_string().contains("5 words"), "{}", results[1]);
    // The new run names the interrupting send.
    let started = records(&state, "run_started");
    assert_eq!(started.len(), 2);
    assert!(
        started[1].to_string().contains("\"int-1\""),
        "{}",
        started[1]
    );
}

#[test]
fn broca_send_steers_into_the_running_run_and_follows_it_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let _s = serve(&state);
    let mut attach = attach_json(&state, &BASE);
    let first = broca(&state)
        .arg("send")
        .args(BASE)
        .args(["--model", "demo/tour", "count these four words"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until_unit(&mut attach, "tool_call");
    let _ = attach.kill();
    let _ = attach.wait();
    // No model: the steer takes the running run's; it follows that run to its end.
    let o = broca(&state)
        .arg("send")
        .args(BASE)
        .args(["--delivery", "steer", "and say thanks"])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(err.contains("steered into the running run"), "{err}");
    assert!(err.contains(": completed"), "{err}");
    assert!(out.contains("The tool says"), "{out}");
    let _ = first.wait_with_output();
    assert_eq!(records(&state, "send_steered").len(), 1);
    assert_eq!(records(&state, "run_started").len(), 1);
    // A mode the CLI does not know is a usage error.
    let o = broca(&state)
        .arg("send")
        .args(BASE)
        .args(["--delivery", "later", "x"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
