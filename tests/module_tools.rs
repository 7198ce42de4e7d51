//! Module mode's tools of tool_provider modules: `broca module` against the daemon stand-in
//! (tests/support/daemon.rs, its tool module in tests/support/tool_module.rs) with aimock as
//! the provider: calls over the session's own route at most once, a kill around a call, a
//! module up after broca started, per-tool reply deadlines, call keepalives and the sessions'
//! scopes their routes open under.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use std::time::Duration;

use daemon::{Daemon, ToolModule};
use module_support::*;
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{fixture, Aimock};

#[test]
fn tools_of_a_tool_module_go_over_the_sessions_own_route_and_run_at_most_once() {
    // (The rig's folder and provider live as long as their bindings.)
    let ToolsRig {
        dir: _dir,
        state,
        peer: _peer,
        mut d,
        mut child,
        tools,
    } = tools_rig("nonce-t", "/t");

    // Two calls in one step, each delivered once with its own key and the frozen pin.
    let (run_id, status) = run_on_route(&mut d, "record two", "a");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1)
    );
    let calls = tools.log.calls.lock().unwrap().clone();
    let keys: std::collections::HashSet<&str> = calls
        .iter()
        .map(|(c, _)| c["call_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "a call key per call: {calls:?}");
    assert!(calls
        .iter()
        .all(|(c, _)| c["schema_pin"].as_str().unwrap().starts_with("tp1:record:")));
    // The catalog route is broca's own; the calls' route is the session's, opened with broca's
    // consumer identity.
    let opens = tools.log.opens.lock().unwrap().clone();
    assert_eq!(opens[0]["identity"]["session"], "tool-catalog", "{opens:?}");
    let session_open = opens
        .iter()
        .find(|o| o["identity"] == json!({"harness": "h", "session": "s"}))
        .unwrap_or_else(|| panic!("a route for the session: {opens:?}"));
    assert_eq!(
        session_open["target"],
        json!({"kind": "tool_provider", "module_id": "ck-tools"})
    );
    assert_eq!(
        session_open["consumer_identity"],
        json!({"module_id": "ck-broca", "launch_nonce": "nonce-t"})
    );
    let started = run_started(&state, &run_id);
    let frozen = each(&started["config"]["tools"], "route");
    assert!(
        frozen.iter().all(|r| r.starts_with("subc:ck-tools@tp1:")),
        "every tool frozen with its module and pin (ck-missing offers none): {frozen:?}"
    );
    let results: Vec<Value> = support::dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "tool_result")
        .collect();
    assert!(
        results.iter().any(|r| r.to_string().contains("recorded")),
        "the module's answer is the result: {results:?}"
    );

    // A session that differs only in its project root gets a route of its own.
    assert_eq!(d.bind(5, 1, "/u", "h", "s").0, FrameType::Response);
    let opened_before = tools.log.opens.lock().unwrap().len();
    let (_, status) = run_on(&mut d, 5, "record two", "u1");
    assert_eq!(status["state"], "completed", "{status}");
    let opens = tools.log.opens.lock().unwrap().clone();
    assert!(
        opens.len() > opened_before,
        "a route opened for the other project's session: {opens:?}"
    );
    let first_channels: Vec<u16> = calls.iter().map(|(_, c)| *c).collect();
    let now = tools.log.calls.lock().unwrap().clone();
    assert!(
        now[calls.len()..]
            .iter()
            .all(|(_, c)| !first_channels.contains(c)),
        "two sessions that differ only in their project root shared a tool route: {now:?}"
    );

    // The daemon says the route went stale before delivery: reopened, sent once more, run once.
    tools
        .stale_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let opened_before = tools.log.opens.lock().unwrap().len();
    let (_, status) = run_on_route(&mut d, "echo please", "b");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_echo_1"), 1);
    assert_eq!(
        tools.log.opens.lock().unwrap().len(),
        opened_before + 1,
        "one reopen"
    );

    // Refusals the daemon marks retryable are retried; the call still runs once.
    tools
        .stale_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .extend(["module_warming".to_string(), "module_reloading".to_string()]);
    let (_, status) = run_on_route(&mut d, "record again", "c");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_rec_9"), 1);

    // A call the module never answers: cancelled at its call timeout, indeterminate, the run
    // ends interrupted naming it; it is never sent again.
    // (Each on a session of its own: the next send there answers the model for the lost call.)
    assert_eq!(d.bind(2, 1, "/t", "h", "s2").0, FrameType::Response);
    assert_eq!(d.bind(3, 1, "/t", "h", "s3").0, FrameType::Response);
    let (_, status) = run_on(&mut d, 2, "hang call", "d");
    assert_eq!(
        status["state"], "interrupted",
        "a delivered call that went unanswered was sent again or taken as done: {status}"
    );
    assert!(status.to_string().contains("call_hang_1"), "{status}");
    assert_eq!(tools.times("call_hang_1"), 1);
    // The cancel frame reaches the stand-in's thread on its own time.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while tools.log.cancels.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        tools.log.cancels.lock().unwrap().len(),
        1,
        "the call is cancelled"
    );

    // The module dies with a call delivered: indeterminate too; the next send reconnects.
    let (_, status) = run_on(&mut d, 3, "die call", "e");
    assert_eq!(status["state"], "interrupted", "{status}");
    assert!(status.to_string().contains("call_die_1"), "{status}");
    let (_, status) = run_on_route(&mut d, "echo please", "f");
    assert_eq!(status["state"], "completed", "after a reconnect: {status}");
    assert_eq!(
        tools.times("call_die_1"),
        1,
        "a call delivered before the module died was sent again"
    );
    assert_eq!(tools.times("call_hang_1"), 1, "never sent again");

    // A route refused for good: the call is refused before delivery and the model is told.
    assert_eq!(d.bind(4, 1, "/t", "h", "s4").0, FrameType::Response);
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .push("capability_forbidden".into());
    let calls_before = tools.log.calls.lock().unwrap().len();
    let (run_id, status) = run_on(&mut d, 4, "record again", "g");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        tools.log.calls.lock().unwrap().len(),
        calls_before,
        "nothing delivered"
    );
    let refused = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "tool_result" && r["record"]["run_id"] == run_id.as_str())
        .unwrap();
    assert!(
        refused.to_string().contains("capability_forbidden"),
        "the model is told why: {refused}"
    );

    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("tool module `ck-missing`"), "{err}");
    assert!(!err.contains("nonce-t"), "the launch nonce is never logged");
}

#[test]
fn killed_around_a_tool_modules_call_a_restart_never_sends_it_twice() {
    let peer = Aimock::start(&fixture("tools.json"));
    // intent: killed once the intent is durable, before the call goes; tool_result: killed
    // once the module's answer is durable.
    for (point, delivered) in [("intent", 0), ("tool_result", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let tools = ToolModule::new("ck-tools");
        let mut d = Daemon::start(&dir.path().join("d1"));
        let crash = format!("{point}:1");
        let mut child = with_these_tools(
            dir.path(),
            &mut d,
            &peer,
            &[("BROCA_CRASH_AT", &crash)],
            &tools,
        );
        assert_eq!(d.bind(1, 1, "/k", "h", "s").0, FrameType::Response);
        let send = json!({"prompt": "echo please", "model": "anthropic/m", "send_id": "k1"});
        d.send(
            FrameType::Request,
            1,
            1,
            &json!({"method": "session.send", "params": send}),
        );
        d.until_closed();
        assert_aborted(&mut child, point);
        assert_eq!(
            tools.times("call_echo_1"),
            delivered,
            "{point}: before the restart"
        );

        // The supervisor starts it again under a new daemon connection.
        let mut d = Daemon::start(&dir.path().join("d2"));
        let mut child = with_these_tools(dir.path(), &mut d, &peer, &[], &tools);
        assert_eq!(d.bind(1, 1, "/k", "h", "s").0, FrameType::Response);
        let (_, again) = d.request(1, 1, "session.send", send.clone());
        let run_id = again["result"]["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{again}"))
            .to_string();
        let s = wait_ended(&mut d, 1, 1, &run_id);
        if delivered == 0 {
            // Its intent is durable and its outcome unknown: never sent, the run interrupted.
            assert_eq!(s["state"], "interrupted", "{point}: {s}");
            assert!(s.to_string().contains("call_echo_1"), "{point}: {s}");
        } else {
            assert_eq!(
                s["state"], "completed",
                "{point}: the run goes on from the result: {s}"
            );
        }
        drain(&mut d, &mut child);
        assert_eq!(
            tools.times("call_echo_1"),
            delivered,
            "{point}: at most once across the restart"
        );
        let records = support::dump_all(&state);
        let count = |kind: &str| records.iter().filter(|r| r["kind"] == kind).count();
        assert_eq!(count("run_started"), 1, "{point}");
        assert_eq!(count("tool_dispatch_intent"), 1, "{point}");
        assert_eq!(count("run_finished") + count("run_paused"), 1, "{point}");
    }
}

#[test]
fn a_tool_module_up_after_broca_started_is_offered_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module is not up at start: its catalog's route is refused for good, once.
    let tools = ToolModule::new("ck-tools");
    tools
        .refuse_opens
        .lock()
        .unwrap()
        .push("capability_forbidden".into());
    let config = json!({"modules": [{"module": "ck-tools", "call_timeout_ms": 1500}],
           "module_retry_ms": 1500});
    let mut child = with_tools_config(
        dir.path(),
        &mut d,
        &peer,
        &[("BROCA_LOG", "info")],
        &tools,
        &config,
    );
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);
    let catalog_opens = || {
        tools
            .log
            .opens
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o["identity"]["session"] == "tool-catalog")
            .count()
    };

    let offered = |run_id: &str| -> Vec<String> {
        run_started(&state, run_id)["config"]["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };

    // Before it answers, a run is offered none of its tools.
    let (early, _) = run_on_route(&mut d, "record two", "a");
    if catalog_opens() < 2 {
        let early = offered(&early);
        assert!(!early.iter().any(|t| t == "record"), "{early:?}");
    }

    // It is asked again while broca serves; from its answer on, its tools are offered.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while catalog_opens() < 2 {
        assert!(
            std::time::Instant::now() < until,
            "the module was never asked again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut run = String::new();
    for attempt in 0..40 {
        let (run_id, status) = run_on_route(&mut d, "record two", &format!("b{attempt}"));
        assert_eq!(status["state"], "completed", "{status}");
        if offered(&run_id).iter().any(|t| t == "record") {
            run = run_id;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!run.is_empty(), "the module's tools were never offered");
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1),
        "its tools run over its route"
    );
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(
        err.contains("tool module up after broca started"),
        "the pickup is logged: {err}"
    );
}

#[test]
fn a_tool_declaring_a_reply_deadline_is_waited_for_past_the_modules_call_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module's call timeout is 1.5 s; `wait` declares its hold (2.5 s here) plus 1 s.
    let (mut child, tools) = with_tools(dir.path(), &mut d, &peer, &[]);
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);

    let (run_id, status) = run_on_route(&mut d, "wait call", "w");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_wait_1"), 1);
    assert!(
        tools.log.cancels.lock().unwrap().is_empty(),
        "the call was given up at the module's call timeout"
    );
    // The deadline is the one frozen with the tool.
    let frozen = run_started(&state, &run_id)["config"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "wait")
        .cloned()
        .unwrap();
    assert_eq!(frozen["reply"]["max_ms"], 10_000, "{frozen}");
    let result = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "tool_result" && r["record"]["run_id"] == run_id.as_str())
        .unwrap();
    assert!(
        result.to_string().contains("waited_ms") && result["record"]["result"]["is_error"] != true,
        "{result}"
    );
    drain(&mut d, &mut child);
}

#[test]
fn a_call_kept_alive_outlasts_the_call_timeout_and_a_silent_one_is_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let mut d = Daemon::start(&dir.path().join("d"));
    // The module provides call-keepalive/v1; its call timeout is 1.5 s, and (a debug build's
    // knob for tests) a call may go 1 s without a keepalive.
    let tools = ToolModule::new("ck-tools");
    tools
        .keepalive
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut child = with_these_tools(
        dir.path(),
        &mut d,
        &peer,
        &[("BROCA_TEST_KEEPALIVE_SILENCE_MS", "1000")],
        &tools,
    );
    assert_eq!(d.bind(1, 1, "/t", "h", "s").0, FrameType::Response);
    assert_eq!(d.bind(2, 1, "/t", "h", "s2").0, FrameType::Response);

    // 3 s of work with a keepalive every 200 ms: twice the call timeout, and it completes.
    let (_, status) = run_on_route(&mut d, "long call", "a");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_long_1"), 1);
    assert!(tools.log.cancels.lock().unwrap().is_empty());
    let opens = tools.log.opens.lock().unwrap().clone();
    assert!(
        opens.iter().all(|o| o["consumer_capabilities"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == "call-keepalive/v1"))),
        "every route declares call-keepalive/v1: {opens:?}"
    );

    // The same work gone silent: given up once no keepalive came for 1 s, cancelled, never
    // sent again.
    tools
        .keepalive
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let (_, status) = run_on(&mut d, 2, "long call", "b");
    assert_eq!(status["state"], "interrupted", "{status}");
    assert!(status.to_string().contains("call_long_1"), "{status}");
    assert_eq!(
        tools.times("call_long_1"),
        2,
        "one call per session, each sent once"
    );
    // (The stand-in reads the CANCEL once its 3 s of work are over.)
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while tools.log.cancels.lock().unwrap().is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        tools.log.cancels.lock().unwrap().len(),
        1,
        "the silent call is cancelled"
    );
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("no keepalive for"), "{err}");
}

/// The scope stamps of the calls delivered to the tool module, in order (each call's route's
/// bind stamp).
fn call_stamps(tools: &ToolModule) -> Vec<Value> {
    let stamps = tools.log.stamps.lock().unwrap().clone();
    let calls = tools.log.calls.lock().unwrap().clone();
    calls
        .iter()
        .map(|(_, ch)| stamps.get(ch).cloned().unwrap_or(Value::Null))
        .collect()
}

#[test]
fn two_sessions_in_two_projects_call_tools_over_two_routes_under_two_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    let nonce = [("SUBC_LAUNCH_NONCE", "nonce-scopes")];
    let began = unix_ms();
    let mut d = Daemon::start(&dir.path().join("d1"));
    let mut child = with_these_tools(dir.path(), &mut d, &peer, &nonce, &tools);
    // Two sessions that differ only in their project root.
    assert_eq!(d.bind(1, 1, "/proj/a", "h", "s").0, FrameType::Response);
    assert_eq!(d.bind(2, 1, "/proj/b", "h", "s").0, FrameType::Response);
    let (_, a) = run_on(&mut d, 1, "record two", "a");
    let (_, b) = run_on(&mut d, 2, "record two", "b");
    assert_eq!(
        (a["state"].as_str(), b["state"].as_str()),
        (Some("completed"), Some("completed"))
    );

    // Each session's calls went over its own route, whose bind carries its own scope: the
    // module learns each session's folder from the daemon's stamp.
    let stamps = call_stamps(&tools);
    assert_eq!(stamps.len(), 4, "{stamps:?}");
    let channels: Vec<u16> = tools
        .log
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, c)| *c)
        .collect();
    assert_eq!(channels[0], channels[1]);
    assert_eq!(channels[2], channels[3]);
    assert_ne!(channels[0], channels[2], "two routes: {channels:?}");
    for (i, want) in [
        (0, "/proj/a"),
        (1, "/proj/a"),
        (2, "/proj/b"),
        (3, "/proj/b"),
    ] {
        assert_eq!(
            stamps[i]["workdir"], want,
            "a tool route opened without its session's scope: call {i}: {stamps:?}"
        );
        assert_eq!(
            stamps[i]["owner"],
            json!({"kind": "reserved", "module_id": "ck-broca"})
        );
        assert_eq!(stamps[i]["kind"], "head");
    }
    assert_ne!(stamps[0]["ref"], stamps[2]["ref"], "two scopes");
    // broca took the owner's sync authority with one full (empty) sync, then registered each
    // session's scope once; its epoch is the session's creation.
    let ops = d.scope_ops.lock().unwrap().clone();
    assert_eq!(ops[0]["op"], "scope.sync", "{ops:?}");
    assert_eq!(ops[0]["scopes"], json!([]));
    let applied: Vec<&Value> = ops[1..]
        .iter()
        .flat_map(|o| o["upsert"].as_array().unwrap())
        .collect();
    assert_eq!(applied.len(), 2, "each scope registered once: {ops:?}");
    let gens: Vec<u64> = ops
        .iter()
        .map(|o| o["generation"].as_u64().unwrap())
        .collect();
    assert!(
        gens.windows(2).all(|w| w[0] < w[1]),
        "generations rise: {gens:?}"
    );
    let epoch_a = stamps[0]["scope_epoch"].as_u64().unwrap();
    assert!(
        (began..=unix_ms()).contains(&epoch_a),
        "{epoch_a} from {began}"
    );
    drain(&mut d, &mut child);

    // After a restart (a new daemon too) the same session's scope comes back at the same
    // epoch: the same session, not a new one under a reused ref.
    let mut d = Daemon::start(&dir.path().join("d2"));
    let mut child = with_these_tools(dir.path(), &mut d, &peer, &nonce, &tools);
    assert_eq!(d.bind(1, 1, "/proj/a", "h", "s").0, FrameType::Response);
    let (_, again) = run_on(&mut d, 1, "record two", "a2");
    assert_eq!(again["state"], "completed", "{again}");
    let stamps = call_stamps(&tools);
    assert_eq!(stamps[4]["workdir"], "/proj/a");
    assert_eq!(stamps[4]["scope_epoch"].as_u64(), Some(epoch_a));
    assert_eq!(stamps[4]["ref"], stamps[0]["ref"]);
    drain(&mut d, &mut child);

    // A daemon that does not admit scoped routes: the route opens unscoped, and broca says
    // the module learns no folder.
    let mut d = Daemon::start(&dir.path().join("d3"));
    d.advertise_scopes = false;
    let mut child = with_these_tools(dir.path(), &mut d, &peer, &nonce, &tools);
    assert_eq!(d.bind(1, 1, "/proj/a", "h", "s").0, FrameType::Response);
    let (_, old) = run_on(&mut d, 1, "record two", "a3");
    assert_eq!(old["state"], "completed", "{old}");
    assert_eq!(call_stamps(&tools)[6], Value::Null);
    assert!(d.scope_ops.lock().unwrap().is_empty());
    drain(&mut d, &mut child);
    let err = stderr_of(&mut child);
    assert!(err.contains("does not advertise scopes/v1"), "{err}");
}

#[test]
fn a_held_call_is_answered_by_its_late_result_and_acked() {
    let ToolsRig {
        dir: _dir,
        state,
        peer: _peer,
        mut d,
        mut child,
        tools,
    } = tools_rig("nonce-late", "/late");
    // `consent` answers a held first reply at once; its result comes 1.5 s later, after a
    // `held` update, as late results.
    let (run_id, status) = run_on_route(&mut d, "consent call", "c1");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(tools.times("call_consent_1"), 1, "sent once");
    let result = support::dump_all(&state)
        .into_iter()
        .find(|r| r["kind"] == "tool_result" && r["record"]["run_id"] == run_id)
        .unwrap_or_else(|| panic!("a tool result for {run_id}"));
    let text = result["record"].to_string();
    assert!(
        text.contains("approved: deploy"),
        "the held call's answer is its late result, not the interim content: {text}"
    );
    assert!(!text.contains("Please approve"), "{text}");
    // broca read the module's late results (from the start, then from its cursor) and acked
    // through the entry that settled the call.
    let reads = tools.log.late_reads.lock().unwrap().clone();
    assert!(reads.len() >= 2, "{reads:?}");
    assert_eq!(reads[0]["since"], Value::Null);
    assert!(!reads.last().unwrap()["since"].is_null(), "{reads:?}");
    let acks = tools.log.acks.lock().unwrap().clone();
    assert_eq!(
        acks.last().map(|a| a["seq"].as_u64()),
        Some(Some(2)),
        "acked through the result: {acks:?}"
    );
    // The route that carried it declared held replies.
    let opens = tools.log.opens.lock().unwrap().clone();
    assert!(opens
        .iter()
        .filter(|o| o["identity"]["session"] == "s")
        .all(|o| o["consumer_capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("held-reply/v1"))));
    drain(&mut d, &mut child);
}

/// The `tool_result_late` records in the WALs under `state`.
fn late_records(state: &std::path::Path) -> Vec<Value> {
    support::dump_all(state)
        .into_iter()
        .filter(|r| r["kind"] == "tool_result_late")
        .map(|r| r["record"].clone())
        .collect()
}

/// Polls `what` every 50 ms until it holds, for at most 20 s.
fn until(what: &str, mut holds: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !holds() {
        assert!(std::time::Instant::now() < end, "{what} within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_late_result_after_a_kill_is_recorded_once_and_the_call_never_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    let config = json!({"modules": [{"module": "ck-tools", "call_timeout_ms": 1500}],
        "late_poll_ms": 200});
    let nonce = [("SUBC_LAUNCH_NONCE", "nonce-late-kill")];
    let mut d = Daemon::start(&dir.path().join("d1"));
    let mut child = with_tools_config(dir.path(), &mut d, &peer, &nonce, &tools, &config);
    assert_eq!(d.bind(1, 1, "/late-kill", "h", "s").0, FrameType::Response);
    let send = json!({"prompt": "consent call", "model": "anthropic/m", "send_id": "k1"});
    let (_, sent) = d.request(1, 1, "session.send", send);
    let run_id = sent["result"]["run_id"].as_str().unwrap().to_string();
    // Killed while the module holds the call (its result comes 1.5 s after the call). The
    // status reads keep the daemon's side of broca's connection answering (its scopes).
    until("the module has the call", || {
        d.request(1, 1, "run.status", json!({"run_id": run_id}));
        tools.times("call_consent_1") == 1
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(late_records(&state).is_empty());

    // Restarted: the run is sealed without the call's outcome, and the module's late result
    // for it is recorded in the session once it comes; killed again right after that record
    // is durable, before the ack.
    let mut d = Daemon::start(&dir.path().join("d2"));
    let crash = [nonce[0], ("BROCA_CRASH_AT", "tool_result_late:1")];
    let mut child = with_tools_config(dir.path(), &mut d, &peer, &crash, &tools, &config);
    assert_eq!(d.bind(1, 1, "/late-kill", "h", "s").0, FrameType::Response);
    d.until_closed();
    assert_aborted(&mut child, "tool_result_late");
    assert_eq!(late_records(&state).len(), 1);
    assert!(
        !tools.log.acks.lock().unwrap().iter().any(|a| a["seq"] == 2),
        "not acked before its record is durable"
    );

    // Once more: the same result, read again, is not recorded again; now it is acked.
    let mut d = Daemon::start(&dir.path().join("d3"));
    let mut child = with_tools_config(dir.path(), &mut d, &peer, &nonce, &tools, &config);
    assert_eq!(d.bind(1, 1, "/late-kill", "h", "s").0, FrameType::Response);
    let status = wait_ended(&mut d, 1, 1, &run_id);
    assert_eq!(status["state"], "interrupted", "{status}");
    until("the late result acked", || {
        tools.log.acks.lock().unwrap().iter().any(|a| a["seq"] == 2)
    });
    let late = late_records(&state);
    assert_eq!(late.len(), 1, "recorded once: {late:?}");
    assert_eq!(late[0]["run_id"], run_id.as_str());
    assert_eq!(late[0]["call_id"], "call_consent_1");
    assert_eq!(late[0]["outcome"], "result");
    assert_eq!(late[0]["content"], "approved: deploy");
    assert_eq!(late[0]["module"], "ck-tools");
    drain(&mut d, &mut child);

    // Another restart reads the module's late results from the start again: the same entry
    // is not recorded twice, and the call was never sent again.
    let acks_before = tools.log.acks.lock().unwrap().len();
    let mut d = Daemon::start(&dir.path().join("d4"));
    let mut child = with_tools_config(dir.path(), &mut d, &peer, &nonce, &tools, &config);
    until("the late results read and acked again", || {
        tools.log.acks.lock().unwrap().len() > acks_before
    });
    drain(&mut d, &mut child);
    assert_eq!(late_records(&state).len(), 1, "still recorded once");
    assert_eq!(tools.times("call_consent_1"), 1, "never sent again");
}
