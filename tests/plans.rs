//! Fetch plans (llm-runner/v1 `plans`, docs/plans.md): a session's first send carrying a
//! plan has its items fetched from the daemon's tool modules (`broca module` against the
//! daemon stand-in, its tool module in tests/support/tool_module.rs), the plan frozen in
//! the run's start record and answered by `session.baseline`; later sends run on it without
//! fetching again, another plan is refused `plan_drift` and a plan whose items cannot
//! arrive `fetch_unavailable`, each writing nothing; the frozen plan outlives a kill -9 of
//! `broca serve`.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use std::path::Path;

use cortexkit_role_tool_provider::catalog::{composition_digest, system_text_digest};
use daemon::ToolModule;
use module_support::*;
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::serve::{metric_with, rpc, send_until_completed, spawn, Serve};
use support::{dump_all, fixture, Aimock};

const TOOLS: [&str; 7] = ["echo", "record", "hang", "die", "wait", "long", "consent"];

fn composition() -> Value {
    json!({"join_version": 1, "providers": [{"provider": "ck-tools", "tools": TOOLS}]})
}

fn plan() -> Value {
    json!({
        "tool_items": [{"provider": "ck-tools", "params": {}}],
        "system_text_items": [{"provider": "ck-tools", "params": {}}],
        "composition": composition(),
    })
}

/// The WAL's records, of every session under `state`.
fn records(state: &Path) -> usize {
    dump_all(state).len()
}

#[test]
fn a_plan_is_fetched_once_frozen_with_the_first_run_and_its_tools_run_over_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    let (mut d, mut child) = planned_bound(dir.path(), "d", &peer, &tools, &[]);
    assert_eq!(d.bind(2, 1, "/p", "h", "other").0, FrameType::Response);

    let (_, described) = d.request(1, 1, "role.describe", json!({}));
    let groups = described["result"]["capabilities"].clone();
    assert!(
        groups.as_array().unwrap().contains(&json!("plans")),
        "{groups}"
    );
    let (_, before) = d.request(1, 1, "session.baseline", json!({}));
    assert_eq!(before["result"]["state"], "not_yet", "{before}");

    // A preset-less text item of a module the daemon's catalog does not list as serving a
    // default text: refused by name before anything is asked of it or written.
    let first =
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "a", "plan": plan()});
    let (ty, refused) = d.request(1, 1, "session.send", first.clone());
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "system_text_preset_required", "{refused}");
    assert_eq!(refused["detail"]["provider"], "ck-tools", "{refused}");
    assert!(tools.log.catalogs.lock().unwrap().is_empty());
    assert_eq!(records(&state), 0);
    tools
        .default_text
        .store(true, std::sync::atomic::Ordering::SeqCst);

    // Now served: the plan's one provider asked once, with its item's params, the
    // composition and the system-text item.
    let (run_id, status) = run_with(&mut d, 1, first);
    assert_eq!(status["state"], "completed", "{status}");
    let asked = tools.log.catalogs.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0],
        json!({"params": {}, "composition": composition(), "system_text": {"params": {}}})
    );
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1)
    );
    let started = run_started(&state, &run_id);
    let frozen = &started["config"]["plan"];
    assert_eq!(
        frozen["composition_digest"],
        json!(composition_digest(&composition()).unwrap())
    );
    assert_eq!(
        started["config"]["system"],
        ToolModule::SYSTEM_TEXT,
        "the plan's text is the run's system text"
    );
    let offered = each(&started["config"]["tools"], "name");
    assert_eq!(offered, TOOLS, "the plan's tools, in its provider's order");
    assert!(each(&started["config"]["tools"], "route")
        .iter()
        .all(|r| r.starts_with("subc:ck-tools@tp1:")));

    let (_, baseline) = d.request(1, 1, "session.baseline", json!({}));
    let b = &baseline["result"]["baseline"];
    assert_eq!(baseline["result"]["state"], "ready", "{baseline}");
    assert_eq!(b["composition_digest"], frozen["composition_digest"]);
    assert_eq!(
        b["items"],
        json!([{"provider": "ck-tools", "item": "tools", "item_digest": "c1"},
               {"provider": "ck-tools", "item": "system_text",
                "item_digest": system_text_digest(ToolModule::SYSTEM_TEXT),
                "preflight_digest": system_text_digest("preflight")}])
    );

    // The plan repeated, or left out: nothing fetched again, the frozen tools offered.
    for (send_id, plan) in [("b", Some(plan())), ("c", None)] {
        let mut send = json!({"prompt": "record two", "model": "anthropic/m", "send_id": send_id});
        if let Some(p) = plan {
            send["plan"] = p;
        }
        let (run_id, status) = run_with(&mut d, 1, send);
        assert_eq!(status["state"], "completed", "{status}");
        assert_eq!(
            each(&run_started(&state, &run_id)["config"]["tools"], "name"),
            TOOLS
        );
        assert!(run_started(&state, &run_id)["config"].get("plan").is_none());
    }
    assert_eq!(tools.log.catalogs.lock().unwrap().len(), 1, "fetched once");

    // Another plan: plan_drift naming both, nothing written.
    let written = records(&state);
    let mut other = plan();
    other["system_text_items"] = json!([]);
    let (ty, refused) = d.request(
        1,
        1,
        "session.send",
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "d", "plan": other}),
    );
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "plan_drift", "{refused}");
    assert_eq!(refused["detail"]["frozen"], frozen["identity"], "{refused}");
    assert_eq!(
        refused["detail"]["sent"],
        json!(composition_digest(&other).unwrap()),
        "identities, never plans: {refused}"
    );
    assert_eq!(records(&state), written);

    // A plan whose provider is not up: fetch_unavailable, retryable, no WAL for the session.
    let absent = json!({"tool_items": [{"provider": "ck-absent", "params": {}}]});
    let (ty, refused) = d.request(
        2,
        1,
        "session.send",
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "e", "plan": absent}),
    );
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "fetch_unavailable", "{refused}");
    assert_eq!(refused["detail"]["provider"], "ck-absent", "{refused}");
    assert_eq!(refused["detail"]["class"], "transient", "{refused}");
    assert_eq!(
        records(&state),
        written,
        "nothing written, not even a new WAL"
    );
    // A module that never answers the plan's fetch: fetch_unavailable once the deadline
    // passes, the request cancelled, nothing written.
    tools
        .hang_plan_catalogs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(d.bind(3, 1, "/p", "h", "hung").0, FrameType::Response);
    let started = std::time::Instant::now();
    let (ty, refused) = d.request(
        3,
        1,
        "session.send",
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "f", "plan": plan()}),
    );
    assert_eq!(ty, FrameType::Error, "{refused}");
    assert_eq!(refused["code"], "fetch_unavailable", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("deadline"),
        "{refused}"
    );
    // The config's deadline, not the 10 s default, is what ended the wait.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    support::serve::wait_for("the late fetch cancelled", || {
        !tools.log.cancels.lock().unwrap().is_empty()
    });
    assert_eq!(records(&state), written);
    tools
        .hang_plan_catalogs
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let (_, other_baseline) = d.request(2, 1, "session.baseline", json!({}));
    assert_eq!(other_baseline["result"]["state"], "not_yet");
    drain(&mut d, &mut child);
}

#[test]
fn killed_once_the_frozen_plan_is_durable_a_restart_keeps_it_and_fetches_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    tools
        .default_text
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Killed once the first run's start record, the plan frozen in it, is durable.
    let (mut d, mut child) = planned_to_crash(dir.path(), "d1", &peer, &tools, "admitted");
    let send =
        json!({"prompt": "record two", "model": "anthropic/m", "send_id": "k", "plan": plan()});
    killed_by(
        &mut d,
        &mut child,
        ("session.send", send.clone()),
        "admitted",
    );
    assert_eq!(tools.log.catalogs.lock().unwrap().len(), 1);

    // The supervisor starts it again under a new daemon connection.
    let (mut d, mut child) = planned_bound(dir.path(), "d2", &peer, &tools, &[]);
    let (_, baseline) = d.request(1, 1, "session.baseline", json!({}));
    assert_eq!(
        baseline["result"]["baseline"]["composition_digest"],
        json!(composition_digest(&composition()).unwrap()),
        "{baseline}"
    );
    // The same send again answers its run, which ran on the frozen plan's tools.
    let (_, again) = d.request(1, 1, "session.send", send.clone());
    let run_id = again["result"]["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{again}"))
        .to_string();
    let status = wait_ended(&mut d, 1, 1, &run_id);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(
        (tools.times("call_rec_1"), tools.times("call_rec_2")),
        (1, 1)
    );
    assert_eq!(
        tools.log.catalogs.lock().unwrap().len(),
        1,
        "never fetched again"
    );
    drain(&mut d, &mut child);
    let started: Vec<Value> = dump_all(&state)
        .into_iter()
        .filter(|r| r["kind"] == "run_started")
        .collect();
    assert_eq!(started.len(), 1);
}

fn serve(state: &Path, peer: &Aimock, config: &Path) -> Serve {
    let mut cmd =
        support::serve::command(state, &peer.url(), &["--config", config.to_str().unwrap()]);
    cmd.stderr(std::process::Stdio::inherit());
    spawn(&mut cmd, state)
}

#[test]
fn serve_keeps_a_frozen_plan_across_a_kill_and_refuses_one_it_was_not_given() {
    let peer = Aimock::start(&fixture("aimock.json"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let off = dir.path().join("off.json");
    std::fs::write(&off, "{}").unwrap();
    let on = dir.path().join("on.json");
    std::fs::write(&on, json!({"plans": true}).to_string()).unwrap();
    // A plan with nothing to fetch: its composition alone.
    let plan = json!({"composition": {"join_version": 1, "note": "no items"}});

    // Plans off (the default): refused naming `plan`, nothing written.
    let s = serve(&state, &peer, &off);
    let (status, refused) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "plan": plan}),
    );
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["detail"]["field"], "plan", "{refused}");
    assert_eq!(records(&state), 0);
    drop(s);

    let mut s = serve(&state, &peer, &on);
    send_until_completed(
        &s,
        json!({"prompt": "hello", "model": "anthropic/m", "plan": plan}),
    );
    let digest = composition_digest(&plan["composition"]).unwrap();
    let baseline = |s: &Serve| rpc(s, "session.baseline", json!({})).1["result"].clone();
    assert_eq!(
        baseline(&s)["baseline"]["composition_digest"],
        json!(digest)
    );
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let s = serve(&state, &peer, &on);
    assert_eq!(
        baseline(&s)["baseline"]["composition_digest"],
        json!(digest)
    );
    send_until_completed(&s, json!({"prompt": "hello", "model": "anthropic/m"}));
    let written = records(&state);
    let (status, refused) = rpc(
        &s,
        "session.send",
        json!({"prompt": "hello", "model": "anthropic/m", "plan": {"composition": {}}}),
    );
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "plan_drift", "{refused}");
    assert_eq!(
        refused["error"]["detail"]["frozen"],
        json!(composition_digest(&plan).unwrap()),
        "{refused}"
    );
    assert_eq!(records(&state), written);
    // A session begun without a plan takes none later: plan_drift with nothing frozen.
    let other = |m: &str, p: Value| {
        let mut params = json!({"session": "s2", "prompt": "hello", "model": "anthropic/m"});
        if !p.is_null() {
            params["plan"] = p;
        }
        rpc(&s, m, params)
    };
    let (status, r) = other("session.send", Value::Null);
    assert_eq!(status, 200, "{r}");
    support::serve::wait_for("the plain run to end", || {
        rpc(
            &s,
            "run.status",
            json!({"session": "s2", "run_id": r["result"]["run_id"]}),
        )
        .1["result"]["state"]
            == "completed"
    });
    let (status, refused) = other("session.send", plan.clone());
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]["detail"].get("frozen").is_none(),
        "{refused}"
    );
    // Standalone, a plan with items has nothing to fetch from: fetch_unavailable, counted.
    let items = json!({"tool_items": [{"provider": "ck-tools", "params": {}}]});
    let (status, refused) = rpc(
        &s,
        "session.send",
        json!({"session": "s3", "prompt": "hello", "model": "anthropic/m", "plan": items}),
    );
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["code"], "fetch_unavailable", "{refused}");
    let admissions = |outcome: &str| {
        metric_with(
            &s,
            "broca_plan_admissions_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    // This process admitted none (the plan was admitted before the kill) and refused one.
    assert_eq!(
        (admissions("admitted"), admissions("fetch_unavailable")),
        (0, 1)
    );
}
