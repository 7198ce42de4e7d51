//! Person-only commands (llm-runner/v1 `user_commands`, docs/plans.md): a plan's provider
//! declares commands, the session freezes them with its plan, and its owner relays them with
//! `session.user_command` to the real `broca module` against the daemon stand-in (its tool
//! module in tests/support/tool_module.rs). Each invocation is durable before it is
//! forwarded and forwarded once; a retry answers the stored reply; a lost reply is
//! `outcome_unknown`; an accepted command's progress and result come as late entries; none
//! of it reaches the transcript; and a kill between the forward and the recorded reply
//! leaves `outcome_unknown` without a second forward.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use daemon::{Daemon, ToolModule};
use module_support::*;
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{dump_all, fixture, Aimock};

fn plan() -> Value {
    json!({"tool_items": [{"provider": "ck-tools", "params": {}}]})
}

fn commands_module() -> ToolModule {
    let tools = ToolModule::new("ck-tools");
    tools
        .commands
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tools
}

/// The `user_command.invoke` requests that reached the module.
fn invokes(tools: &ToolModule) -> Vec<Value> {
    tools
        .log
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(b, _)| b["name"] == "user_command.invoke")
        .map(|(b, _)| b.clone())
        .collect()
}

fn command(d: &mut Daemon, name: &str, input: &str, id: &str) -> (FrameType, Value) {
    d.request(
        1,
        1,
        "session.user_command",
        json!({"command": name, "input": input, "invocation_id": id}),
    )
}

/// The session's first send, its plan naming the module: its run completes.
fn admit(d: &mut Daemon) {
    let send = json!({"prompt": "echo please", "model": "anthropic/m", "send_id": "first",
        "plan": plan()});
    let (_, status) = run_with(d, 1, send);
    assert_eq!(status["state"], "completed", "{status}");
}

#[test]
fn a_command_is_recorded_then_forwarded_once_and_its_reply_stays_out_of_the_transcript() {
    let tools = commands_module();
    let PlannedRig {
        dir: _dir,
        state,
        peer: _peer,
        mut d,
        mut child,
    } = planned_rig(&tools);
    let ops = ["session.user_command", "session.user_command_status"];
    assert_declares(&mut d, "user_commands", &ops);
    // Before any plan: nothing frozen, nothing written.
    let (ty, refused) = command(&mut d, "status", "", "early");
    assert_eq!(ty, FrameType::Error);
    assert_eq!(refused["code"], "unknown_user_command", "{refused}");
    admit(&mut d);

    let (_, baseline) = d.request(1, 1, "session.baseline", json!({}));
    let frozen = &baseline["result"]["baseline"]["user_commands"];
    let names: Vec<&str> = frozen
        .as_array()
        .unwrap_or_else(|| panic!("{baseline}"))
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["status", "wrapup", "crash"], "{baseline}");
    assert_eq!(frozen[1]["provider"], "ck-tools");
    assert_eq!(frozen[1]["argument_hint"], "[count]");

    // Forwarded once, its input verbatim, keyed by the answer's call key.
    let input = "  the repo\n";
    let (ty, first) = command(&mut d, "status", input, "inv-1");
    assert_eq!(ty, FrameType::Response, "{first}");
    let answer = &first["result"];
    assert_eq!(
        answer["reply"],
        json!({"state": "done", "text": "status of   the repo\n"})
    );
    let key = answer["call_key"].as_str().unwrap().to_string();
    let seen = invokes(&tools);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0]["call_key"], key);
    assert_eq!(
        seen[0]["arguments"],
        json!({"command": "status", "input": input})
    );
    // A retry is answered from the session, never forwarded again.
    let (_, again) = command(&mut d, "status", input, "inv-1");
    assert_eq!(again["result"], *answer);
    assert_eq!(invokes(&tools).len(), 1);
    let (_, status) = d.request(
        1,
        1,
        "session.user_command_status",
        json!({"call_key": key}),
    );
    assert_eq!(status["result"]["state"], "done", "{status}");

    // An accepted command: its progress and result come as late entries.
    let (_, accepted) = command(&mut d, "wrapup", "2", "inv-2");
    assert_eq!(
        accepted["result"]["reply"]["state"], "accepted",
        "{accepted}"
    );
    assert_eq!(accepted["result"]["reply"]["job"], "w1");
    let wrap_key = accepted["result"]["call_key"].clone();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let settled = loop {
        let (_, s) = d.request(
            1,
            1,
            "session.user_command_status",
            json!({"call_key": wrap_key}),
        );
        if s["result"]["state"] != "accepted" {
            break s["result"].clone();
        }
        assert!(std::time::Instant::now() < until, "never settled: {s}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(
        settled,
        json!({"state": "done", "text": "wrapped up", "progress": ["halfway"]})
    );

    // The module dies with the command: its reply is lost, so it may have run.
    let (_, lost) = command(&mut d, "crash", "", "inv-3");
    let reply = &lost["result"]["reply"];
    assert_eq!(reply["state"], "outcome_unknown", "{lost}");
    assert!(reply["text"].as_str().unwrap().contains("may have run"));
    let (_, lost_again) = command(&mut d, "crash", "", "inv-3");
    assert_eq!(lost_again["result"], lost["result"]);
    assert_eq!(
        invokes(&tools)
            .iter()
            .filter(|b| b["arguments"]["command"] == "crash")
            .count(),
        1
    );

    // Refusals name what is wrong and write nothing.
    let before = dump_all(&state).len();
    let (_, unknown) = command(&mut d, "deploy", "", "inv-4");
    assert_eq!(unknown["code"], "unknown_user_command", "{unknown}");
    assert_eq!(unknown["detail"]["command"], "deploy");
    let (_, no_key) = d.request(
        1,
        1,
        "session.user_command_status",
        json!({"call_key": "nope"}),
    );
    assert_eq!(no_key["code"], "unknown_invocation", "{no_key}");
    let long = "x".repeat(4097);
    let (_, too_long) = command(&mut d, "status", &long, "inv-5");
    assert_eq!(too_long["code"], "invalid_params", "{too_long}");
    assert_eq!(too_long["detail"]["field"], "input", "{too_long}");
    assert_eq!(dump_all(&state).len(), before);

    // The transcript never holds any of it (the suite's `user_commands_history_isolation`
    // checks the model's requests too).
    let (_, read) = d.request(1, 1, "session.read", json!({}));
    let text = read.to_string();
    for private in [
        "status of",
        "wrapped up",
        "halfway",
        "working on it",
        "may have run",
    ] {
        assert!(
            !text.contains(private),
            "{private} reached the transcript: {read}"
        );
    }
    // Operators see them counted by their first reply's state.
    let (_, h) = d.control(&json!({"op": "health.check"}));
    assert_eq!(
        h["metrics"]["diagnostics"]["user_commands"],
        json!({"done": 1, "accepted": 1, "outcome_unknown": 1}),
        "{h}"
    );
    // Each invocation's record is durable before its reply's.
    let records: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "user_command")
        .collect();
    let events: Vec<&str> = records
        .iter()
        .map(|r| r["record"]["event"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        events,
        ["invoked", "replied", "invoked", "replied", "progress", "settled", "invoked", "replied"],
        "{records:?}"
    );
    drain(&mut d, &mut child);
}

#[test]
fn killed_after_the_forward_the_command_is_outcome_unknown_and_never_forwarded_again() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = commands_module();
    let point = "user_command_forwarded";
    let (mut d, mut child) = planned_to_crash(dir.path(), "d1", &peer, &tools, point);
    admit(&mut d);
    let params = json!({"command": "status", "input": "after", "invocation_id": "k1"});
    killed_by(&mut d, &mut child, ("session.user_command", params), point);
    assert_eq!(invokes(&tools).len(), 1, "the module has the command");

    let (mut d, mut child) = planned_bound(dir.path(), "d2", &peer, &tools, &[]);
    let (_, retried) = command(&mut d, "status", "after", "k1");
    let answer = &retried["result"];
    assert_eq!(answer["reply"]["state"], "outcome_unknown", "{retried}");
    let (_, status) = d.request(
        1,
        1,
        "session.user_command_status",
        json!({"call_key": answer["call_key"]}),
    );
    assert_eq!(status["result"]["state"], "outcome_unknown", "{status}");
    assert_eq!(status["result"]["text"], answer["reply"]["text"]);
    assert_eq!(invokes(&tools).len(), 1, "never forwarded again");
    drain(&mut d, &mut child);
}

#[test]
fn an_accepted_commands_result_is_still_recorded_after_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = commands_module();
    let (d, child) = planned_bound(dir.path(), "d1", &peer, &tools, &[]);
    // Killed before its first pull (every 2 s): the result was never read.
    let accepted = accepted_then_killed(d, child);

    let (mut d, mut child) = planned_bound(dir.path(), "d2", &peer, &tools, &[]);
    let key = accepted["result"]["call_key"].clone();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let settled = loop {
        let (_, s) = d.request(
            1,
            1,
            "session.user_command_status",
            json!({"call_key": key}),
        );
        if s["result"]["state"] != "accepted" {
            break s["result"].clone();
        }
        assert!(
            std::time::Instant::now() < until,
            "never settled after the restart: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    assert_eq!(settled["state"], "done", "{settled}");
    assert_eq!(settled["progress"], json!(["halfway"]));
    assert_eq!(invokes(&tools).len(), 1, "never forwarded again");
    drain(&mut d, &mut child);
}

/// Admits the session, has its module accept `wrapup` (whose progress and result come as
/// late entries), then kills broca with SIGKILL: the accepted answer.
fn accepted_then_killed(mut d: Daemon, mut child: std::process::Child) -> Value {
    admit(&mut d);
    let (_, accepted) = command(&mut d, "wrapup", "", "w");
    assert_eq!(
        accepted["result"]["reply"]["state"], "accepted",
        "{accepted}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    accepted
}

/// `broca module` with plans on, its tool module also in the tools config (so shard 0 sweeps
/// its late results every `late_poll_ms`), under scopes (a launch nonce), route 1 bound.
fn swept_module(
    dir: &std::path::Path,
    name: &str,
    peer: &Aimock,
    tools: &ToolModule,
    late_poll_ms: u64,
) -> (Daemon, std::process::Child) {
    let mut d = Daemon::start(&dir.join(name));
    let config = json!({"modules": [{"module": "ck-tools"}], "late_poll_ms": late_poll_ms});
    let plans = json!({"plans": true, "plan_fetch_deadline_ms": 1000});
    let nonce = [("SUBC_LAUNCH_NONCE", "nonce-commands")];
    let child = with_configs(dir, &mut d, peer, &nonce, tools, &config, Some(&plans));
    assert_eq!(d.bind(1, 1, "/p", "h", "s").0, FrameType::Response);
    (d, child)
}

#[test]
fn a_result_the_sweep_reads_after_a_restart_is_recorded_for_its_command_before_the_ack() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = commands_module();
    // The first process sweeps only at its start: nothing reads the command's entries
    // before the kill (its puller's first read is 2 s away).
    let (d, child) = swept_module(dir.path(), "d1", &peer, &tools, 60_000);
    let accepted = accepted_then_killed(d, child);
    assert!(
        tools.log.acks.lock().unwrap().is_empty(),
        "nothing was read before the kill"
    );

    // The second sweeps every 200 ms, and no status is asked: shard 0's sweep reads the
    // progress and the result, and the session records them before the module's entries are
    // acked.
    let (mut d, mut child) = swept_module(dir.path(), "d2", &peer, &tools, 200);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let last = tools.log.late.lock().unwrap().len() as u64;
    let acked = |t: &ToolModule| {
        t.log
            .acks
            .lock()
            .unwrap()
            .iter()
            .any(|a| a["seq"].as_u64() >= Some(last))
    };
    while !acked(&tools) {
        assert!(
            std::time::Instant::now() < until,
            "the sweep never acked the result"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let key = accepted["result"]["call_key"].clone();
    let (_, status) = d.request(
        1,
        1,
        "session.user_command_status",
        json!({"call_key": key}),
    );
    let settled = &status["result"];
    assert_eq!(
        settled["state"], "done",
        "recorded before its ack: {status}"
    );
    assert_eq!(settled["text"], "wrapped up");
    assert_eq!(settled["progress"], json!(["halfway"]));
    assert_eq!(invokes(&tools).len(), 1, "never forwarded again");
    drain(&mut d, &mut child);
}
