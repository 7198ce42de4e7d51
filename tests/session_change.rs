//! Mid-session changes (llm-runner/v1 `session_change`, docs/plans.md): the real
//! `broca module` against the daemon stand-in (its tool module in
//! tests/support/tool_module.rs). A `session.refresh` fetches its plan from the module,
//! is durable before its answer and applies at the next run (whose model request offers the
//! plan's tools); an identical repeat is answered without a fetch, a stale generation is
//! refused; a kill once the refresh is durable keeps it pending across the restart.

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

fn refresh(generation: u64, policy: &str) -> Value {
    json!({"plan": {"tool_items": [{"provider": "ck-tools", "params": {}}]},
        "policy": policy, "generation": generation})
}

fn baseline(d: &mut Daemon) -> Value {
    let (_, b) = d.request(1, 1, "session.baseline", json!({}));
    b["result"]["baseline"].clone()
}

fn first_run(d: &mut Daemon) {
    let send = json!({"prompt": "hello", "model": "anthropic/m", "send_id": "first"});
    let (_, status) = run_with(d, 1, send);
    assert_eq!(status["state"], "completed", "{status}");
}

#[test]
fn a_refresh_is_fetched_durable_then_applied_by_the_next_run() {
    let tools = ToolModule::new("ck-tools");
    let PlannedRig {
        dir: _dir,
        state,
        peer: _peer,
        mut d,
        mut child,
    } = planned_rig(&tools);
    let ops = [
        "session.refresh",
        "session.refresh_policy",
        "session.flush_prefix",
    ];
    assert_declares(&mut d, "session_change", &ops);
    first_run(&mut d);
    let before = baseline(&mut d);
    assert_eq!(
        before["rungs"]["tools"],
        json!(["on_prefix_rebuild", "immediately"])
    );
    assert_eq!(before["accepted_generation"], 0);
    assert_eq!(
        before["tool_names"],
        json!([]),
        "a plan-less session with no tool"
    );

    let (ty, accepted) = d.request(1, 1, "session.refresh", refresh(1, "immediately"));
    assert_eq!(ty, FrameType::Response, "{accepted}");
    assert_eq!(
        accepted["result"],
        json!({"accepted_generation": 1, "pending": {"generation": 1, "policy": "immediately"},
            "run_in_progress": false, "applies_from_next_run": true})
    );
    assert_eq!(tools.log.catalogs.lock().unwrap().len(), 1, "fetched once");
    // An identical repeat: the same answer, nothing fetched; another policy is stale.
    let (_, again) = d.request(1, 1, "session.refresh", refresh(1, "immediately"));
    assert_eq!(again["result"], accepted["result"]);
    assert_eq!(tools.log.catalogs.lock().unwrap().len(), 1);
    let (_, stale) = d.request(1, 1, "session.refresh", refresh(1, "on_prefix_rebuild"));
    assert_eq!(stale["code"], "generation_stale", "{stale}");
    assert_eq!(stale["detail"]["accepted"], 1);
    let (_, unsupported) = d.request(1, 1, "session.refresh", refresh(2, "on_history_rebuild"));
    assert_eq!(unsupported["code"], "rung_unsupported", "{unsupported}");
    assert_eq!(unsupported["detail"]["surface"], "tools");
    let (_, h) = d.control(&json!({"op": "health.check"}));
    assert_eq!(
        h["metrics"]["diagnostics"]["session_refreshes"],
        json!({"accepted": 1, "repeat": 1, "generation_stale": 1, "rung_unsupported": 1}),
        "{h}"
    );
    let pending = baseline(&mut d);
    assert_eq!(
        pending["pending"],
        json!({"generation": 1, "policy": "immediately"})
    );
    assert_eq!(pending["applied_generation"], 0);

    // The next run offers the plan's tools: its model calls `echo`, which reaches the module.
    let send = json!({"prompt": "echo please", "model": "anthropic/m", "send_id": "second"});
    let (_, status) = run_with(&mut d, 1, send);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_echo_1"), 1);
    let after = baseline(&mut d);
    assert_eq!(after["applied_generation"], 1, "{after}");
    assert_eq!(after["effective"]["generation"], 1);
    assert!(after.get("pending").is_none(), "{after}");
    let started: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .collect();
    assert_eq!(started.len(), 2);
    assert!(started[0]["record"]["config"].get("plan").is_none());
    assert_eq!(started[1]["record"]["config"]["plan"]["generation"], 1);
    drain(&mut d, &mut child);
}

#[test]
fn killed_once_a_refresh_is_durable_the_restart_keeps_it_pending_and_fetches_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    let (mut d, mut child) = planned_to_crash(dir.path(), "d1", &peer, &tools, "session_changed");
    first_run(&mut d);
    let request = ("session.refresh", refresh(1, "on_prefix_rebuild"));
    killed_by(&mut d, &mut child, request, "session_changed");

    let (mut d, mut child) = planned_bound(dir.path(), "d2", &peer, &tools, &[]);
    let pending = baseline(&mut d);
    assert_eq!(pending["accepted_generation"], 1, "{pending}");
    assert_eq!(pending["pending"]["policy"], "on_prefix_rebuild");
    // The owner, its reply lost, repeats the refresh: answered from the session.
    let (_, again) = d.request(1, 1, "session.refresh", refresh(1, "on_prefix_rebuild"));
    assert_eq!(again["result"]["applies_from_next_run"], false, "{again}");
    assert_eq!(tools.log.catalogs.lock().unwrap().len(), 1, "fetched once");
    // A flush makes the next run apply it.
    let (_, flushed) = d.request(1, 1, "session.flush_prefix", json!({"send_id": "f1"}));
    assert_eq!(flushed["result"], json!({"pending_generation": 1}));
    let send = json!({"prompt": "echo please", "model": "anthropic/m", "send_id": "second"});
    let (_, status) = run_with(&mut d, 1, send);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(baseline(&mut d)["applied_generation"], 1);
    drain(&mut d, &mut child);
}
