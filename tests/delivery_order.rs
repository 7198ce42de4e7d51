//! Ordered delivery (llm-runner/v1 `delivery_order`, docs/delivery.md) through `broca serve`'s
//! `/v1/rpc` with `"delivery_order": true`, on the keyless demo model whose built-in tool
//! takes 1.5 s: a list without `idle_start` waits for a run another send starts and goes out
//! at its first step; a `dedupe_key` replaces the waiting send of the same key; a send past
//! its `expires_at_ms` is never delivered; a list naming `tool_result` first goes out with the
//! next tool result; `idle_start` starts a run; each entry says how it went out.

mod support;

use serde_json::{json, Value};
use support::broca;
use support::serve::{attach_json, rpc, try_rpc, until_unit, wait_for, Serve};

const BASE: [&str; 6] = support::serve::CLI_SESSION;

fn serve(state: &std::path::Path, ordered: bool) -> Serve {
    serve_with(state, json!({"delivery_order": ordered}))
}

/// `broca serve` with the config file `config`.
fn serve_with(state: &std::path::Path, config_file: Value) -> Serve {
    serve_env(state, config_file, &[])
}

/// `broca serve` with the config file `config` and `env` in its environment.
fn serve_env(state: &std::path::Path, config_file: Value, env: &[(&str, &str)]) -> Serve {
    std::fs::create_dir_all(state).unwrap();
    let config = state.with_extension("json");
    std::fs::write(&config, config_file.to_string()).unwrap();
    let mut cmd = broca(state);
    cmd.envs(env.iter().copied());
    cmd.env_remove("ANTHROPIC_API_KEY").args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "2",
        "--config",
    ]);
    cmd.arg(&config);
    support::serve::spawn(&mut cmd, state)
}

/// A send with `members` beside its prompt and send_id.
fn send(s: &Serve, prompt: &str, send_id: &str, members: Value) -> (u16, Value) {
    let mut params = json!({"prompt": prompt, "send_id": send_id});
    params
        .as_object_mut()
        .unwrap()
        .extend(members.as_object().unwrap().clone());
    rpc(s, "session.send", params)
}

/// The entries of `session.read`.
fn entries(s: &Serve) -> Vec<Value> {
    let page = rpc(s, "session.read", json!({"limit": 100})).1;
    page["result"]["messages"].as_array().unwrap().clone()
}

/// The user entries whose text holds `marker` (the demo model's tool call quotes them).
fn holding(entries: &[Value], marker: &str) -> Vec<Value> {
    entries
        .iter()
        .filter(|e| e["role"] == "user" && e["message"].to_string().contains(marker))
        .cloned()
        .collect()
}

fn last_run_ended(s: &Serve) -> bool {
    let status = rpc(s, "run.status", json!({})).1;
    status["result"]["state"] != "active"
}

#[test]
fn lists_wait_for_their_boundary_and_each_entry_says_how_it_went_out() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = serve(&state, true);
    let steer = json!({"model": "demo/tour", "delivery": ["steer"]});
    // An idle session: a list without idle_start starts nothing, it waits.
    let (status, r) = send(&s, "queued-for-a-run", "w1", steer.clone());
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["state"], "pending", "{r}");
    assert!(r["result"]["submission_id"].is_string(), "{r}");
    assert!(entries(&s).is_empty(), "nothing was delivered");
    // The same key replaces the waiting send; a send already past its time never goes out.
    let keyed = json!({"model": "demo/tour", "delivery": ["steer"], "dedupe_key": "k"});
    assert_eq!(send(&s, "replaced-one", "d1", keyed.clone()).0, 200);
    assert_eq!(send(&s, "replacing-one", "d2", keyed.clone()).0, 200);
    let (_, again) = send(&s, "replaced-one", "d1", keyed.clone());
    assert_eq!(again["result"], json!({"state": "superseded"}), "{again}");
    let late = json!({"model": "demo/tour", "delivery": ["steer"], "expires_at_ms": 1});
    assert_eq!(send(&s, "too-late", "e1", late.clone()).0, 200);
    let status = rpc(&s, "session.send_status", json!({"send_id": "e1"})).1;
    assert_eq!(status["result"], json!({"state": "expired"}), "{status}");

    // The owner's turn: its tool runs 1.5 s; the waiting sends go out at its first step.
    let mut attach = attach_json(&state, &BASE);
    let (status, r) = send(
        &s,
        "count these four words",
        "turn",
        json!({"model": "demo/tour"}),
    );
    assert_eq!(status, 200, "{r}");
    let run_id = r["result"]["run_id"].as_str().unwrap().to_string();
    until_unit(&mut attach, "tool_call");
    let _ = attach.kill();
    let _ = attach.wait();
    // While the tool runs, a list naming tool_result first goes out with its result.
    let rides = json!({"delivery": ["tool_result", "steer"]});
    let (status, r) = send(&s, "rides-the-result", "t1", rides.clone());
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["state"], "pending", "{r}");
    // Until it goes out, a re-send and a status answer it pending with its submission.
    let (_, again) = send(&s, "rides-the-result", "t1", rides.clone());
    assert_eq!(again["result"], r["result"], "{again}");
    let status = rpc(&s, "session.send_status", json!({"send_id": "t1"})).1;
    assert_eq!(status["result"], r["result"], "{status}");
    // A keyed one the run holds is replaced by the next of its key.
    let mid_run = json!({"delivery": ["tool_result", "steer"], "dedupe_key": "m"});
    assert_eq!(send(&s, "replaced-mid-run", "m1", mid_run.clone()).0, 200);
    assert_eq!(send(&s, "replacing-mid-run", "m2", mid_run.clone()).0, 200);
    wait_for("the run to end", || last_run_ended(&s));

    let all = entries(&s);
    for marker in ["queued-for-a-run", "replacing-one"] {
        let held = holding(&all, marker);
        assert_eq!(held.len(), 1, "{marker} delivered once: {all:?}");
        assert_eq!(
            held[0]["delivered_as"],
            json!({"mode": "steer"}),
            "{marker}"
        );
        assert_eq!(held[0]["run"]["run_id"], run_id.as_str());
    }
    let replacing = holding(&all, "replacing-mid-run");
    assert_eq!(replacing.len(), 1, "{all:?}");
    assert_eq!(replacing[0]["delivered_as"]["mode"], "tool_result");
    let (_, again) = send(&s, "replaced-mid-run", "m1", mid_run);
    assert_eq!(again["result"], json!({"state": "superseded"}), "{again}");
    for marker in ["replaced-one", "too-late", "replaced-mid-run"] {
        assert!(holding(&all, marker).is_empty(), "{marker} never delivered");
    }
    let key = all
        .iter()
        .flat_map(|e| e["tool_calls"].as_array().cloned().unwrap_or_default())
        .find_map(|c| c["call_key"].as_str().map(str::to_string))
        .expect("the run's call has its key");
    let rode = holding(&all, "rides-the-result");
    assert_eq!(rode.len(), 1, "{all:?}");
    assert_eq!(
        rode[0]["delivered_as"],
        json!({"mode": "tool_result", "call_key": key})
    );
    let (_, again) = send(&s, "too-late", "e1", late);
    assert_eq!(again["result"], json!({"state": "expired"}), "{again}");
    let (_, again) = send(&s, "replaced-one", "d1", keyed.clone());
    assert_eq!(again["result"], json!({"state": "superseded"}), "{again}");
    // Another list under a send_id is a reuse naming `delivery`; another expiry is not.
    let (status, r) = send(
        &s,
        "replaced-one",
        "d1",
        json!({"model": "demo/tour", "delivery": ["steer", "idle_start"], "dedupe_key": "k"}),
    );
    assert_eq!(status, 409, "{r}");
    assert_eq!(r["error"]["detail"]["field"], "delivery", "{r}");

    // idle_start on an idle session starts the run.
    let (status, r) = send(
        &s,
        "starts-a-run",
        "i1",
        json!({"model": "demo/tour", "delivery": ["steer", "idle_start"]}),
    );
    assert_eq!(status, 200, "{r}");
    assert!(r["result"]["run_id"].is_string(), "{r}");
    wait_for("the run to end", || last_run_ended(&s));
    let started = holding(&entries(&s), "starts-a-run");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["delivered_as"], json!({"mode": "idle_start"}));
}

#[test]
fn a_list_is_refused_where_ordered_delivery_is_off_writing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = serve(&state, false);
    let (status, r) = send(
        &s,
        "p",
        "x1",
        json!({"model": "demo/tour", "delivery": ["idle_start"]}),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["detail"]["field"], "delivery", "{r}");
    assert!(support::dump_all(&state).is_empty(), "nothing written");
}

/// A first send carrying a plan whose senders are `senders`.
fn planned_send(s: &Serve, senders: Value) -> (u16, Value) {
    let plan = json!({"composition": {"join_version": 1}, "senders": senders});
    send(s, "p", "x1", json!({"model": "demo/tour", "plan": plan}))
}

#[test]
fn a_plan_senders_succession_is_checked_before_the_plan_naming_its_member() {
    let dir = tempfile::tempdir().unwrap();
    // Without ordered delivery no `succeeds` is served: refused naming it, before the
    // plan's `senders` themselves.
    let state = dir.path().join("off");
    let s = serve_with(&state, json!({"plans": true}));
    let (status, r) = planned_send(
        &s,
        json!([{"module": "a"}, {"module": "b", "succeeds": "a"}]),
    );
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["code"], "invalid_params", "{r}");
    assert_eq!(
        r["error"]["detail"]["field"], "plan.senders[1].succeeds",
        "{r}"
    );
    let (_, r) = planned_send(&s, json!([{"module": "a"}]));
    assert_eq!(r["error"]["detail"]["field"], "plan.senders", "{r}");
    assert!(support::dump_all(&state).is_empty(), "nothing written");
    drop(s);

    // With it, `sender_succession` is declared; a module succeeding itself, a predecessor
    // named twice, a malformed one are each refused by their place.
    let state = dir.path().join("on");
    let s = serve_with(&state, json!({"plans": true, "delivery_order": true}));
    let groups = rpc(&s, "role.describe", json!({})).1["result"]["capabilities"].clone();
    assert!(
        groups
            .as_array()
            .unwrap()
            .contains(&json!("sender_succession")),
        "{groups}"
    );
    for (senders, field) in [
        (
            json!([{"module": "a", "succeeds": "a"}]),
            "plan.senders[0].succeeds",
        ),
        (
            json!([{"module": "a", "succeeds": "z"}, {"module": "b", "succeeds": "z"}]),
            "plan.senders[1].succeeds",
        ),
        (
            json!([{"module": "a", "succeeds": 7}]),
            "plan.senders[0].succeeds",
        ),
    ] {
        let (status, r) = planned_send(&s, senders);
        assert_eq!(status, 400, "{r}");
        assert_eq!(r["error"]["detail"]["field"], field, "{r}");
    }
    assert!(support::dump_all(&state).is_empty(), "nothing written");
    // A well-formed succession is admitted with its plan.
    let (status, r) = planned_send(
        &s,
        json!([{"module": "a"}, {"module": "b", "succeeds": "a"}]),
    );
    assert_eq!(status, 200, "{r}");
}

#[test]
fn a_waiting_list_and_a_replaced_one_keep_their_state_across_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut s = serve(&state, true);
    let keyed = json!({"model": "demo/tour", "delivery": ["steer"], "dedupe_key": "k"});
    let (_, first) = send(&s, "waits-across-a-kill", "w1", keyed.clone());
    let waiting = first["result"]["submission_id"].clone();
    assert!(waiting.is_string(), "{first}");
    // The second key replaces nothing: another key. The third replaces the first.
    let other = json!({"model": "demo/tour", "delivery": ["steer"], "dedupe_key": "other"});
    assert_eq!(send(&s, "kept-beside-it", "w2", other.clone()).0, 200);
    assert_eq!(send(&s, "replaces-the-first", "w3", keyed.clone()).0, 200);
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let s = serve(&state, true);
    let (_, again) = send(&s, "waits-across-a-kill", "w1", keyed.clone());
    assert_eq!(again["result"], json!({"state": "superseded"}), "{again}");
    let (_, again) = send(&s, "kept-beside-it", "w2", other);
    assert_eq!(again["result"]["state"], "pending", "{again}");
    let (status, r) = send(&s, "an owner's turn", "turn", json!({"model": "demo/tour"}));
    assert_eq!(status, 200, "{r}");
    wait_for("the run to end", || last_run_ended(&s));
    let all = entries(&s);
    assert!(holding(&all, "waits-across-a-kill").is_empty(), "{all:?}");
    for marker in ["kept-beside-it", "replaces-the-first"] {
        let held = holding(&all, marker);
        assert_eq!(held.len(), 1, "{marker}: {all:?}");
        assert_eq!(held[0]["delivered_as"], json!({"mode": "steer"}));
    }
}

#[test]
fn a_run_killed_right_after_its_start_takes_the_waiting_lists_when_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = json!({"delivery_order": true});
    // broca aborts once the owner's run start is durable, before anything else is written.
    let mut s = serve_env(&state, config.clone(), &[("BROCA_CRASH_AT", "admitted:1")]);
    let waits = json!({"model": "demo/tour", "delivery": ["steer"]});
    let (_, r) = send(&s, "waits-for-the-resumed-run", "w1", waits);
    assert_eq!(r["result"]["state"], "pending", "{r}");
    let turn = json!({"prompt": "count these four words", "send_id": "turn",
        "model": "demo/tour"});
    let answer = try_rpc(&s, "session.send", turn);
    assert_eq!(answer, None, "broca aborted before its answer");
    assert!(!s.child.wait().unwrap().success());

    // The restart resumes the run, which takes the waiting list: it goes out in that run.
    let s = serve(&state, true);
    wait_for("the resumed run to end", || last_run_ended(&s));
    let all = entries(&s);
    let held = holding(&all, "waits-for-the-resumed-run");
    assert_eq!(held.len(), 1, "{all:?}");
    assert_eq!(held[0]["delivered_as"], json!({"mode": "steer"}));
    let turn = holding(&all, "count these four words");
    assert_eq!(
        held[0]["run"]["run_id"], turn[0]["run"]["run_id"],
        "{all:?}"
    );
}
