//! A session whose plan names a compaction provider (cortexkit-role-compaction's
//! `compaction-runner/v1`, docs/compaction-providers.md): the real `broca module` against the
//! daemon stand-in, with `"compaction_providers": true`. The provider's route reads the
//! transcript in the neutral part model, hands over a view, which is durable before it is
//! accepted (a kill right then keeps it), and the next model request (seen through a recording
//! proxy in front of aimock) goes out through it, every numbered part behind its number.

#[path = "support/daemon.rs"]
#[allow(dead_code)]
mod daemon;
#[path = "support/module.rs"]
mod module_support;
mod support;

use std::path::Path;
use std::process::Child;

use daemon::{Daemon, ToolModule};
use module_support::*;
use serde_json::{json, Value};
use subc_protocol::FrameType;
use support::{dump_all, fixture, recorded_bodies, Aimock, Peer};

const PROVIDER: &str = "ck-compactor";

/// `broca module` with plans and compaction providers on, its model calls through `model`,
/// the stand-in module `provider` behind the daemon, route 1 bound (as the person's `direct`
/// app) to the session ("/p", "h", "s").
fn start(
    dir: &Path,
    name: &str,
    model: &str,
    crash: &[(&str, &str)],
    provider: &ToolModule,
) -> (Daemon, Child) {
    let peer_env = [("BROCA_BASE_URL_ANTHROPIC", model)];
    let extra: Vec<(&str, &str)> = peer_env.iter().chain(crash).copied().collect();
    let mut d = Daemon::start(&dir.join(name));
    let unused = Aimock::start(&fixture("tools.json"));
    let child = with_configs(
        dir,
        &mut d,
        &unused,
        &extra,
        provider,
        &json!({"modules": []}),
        Some(&json!({"plans": true, "compaction_providers": true})),
    );
    assert_eq!(d.bind(1, 1, "/p", "h", "s").0, FrameType::Response);
    (d, child)
}

/// Binds route `channel` to the session as module `module`'s compaction-runner route.
fn bind_provider(d: &mut Daemon, channel: u16, module: &str, roles: Value) -> (FrameType, Value) {
    d.control(&json!({
        "op": "route.bind", "route_channel": channel, "epoch": 1,
        "target": {"kind": "management_surface", "module_id": "ck-broca"},
        "identity": {"harness": "h", "session": "s"},
        "principal": {"kind": "reserved", "module_id": module},
        "role_versions": roles,
        "scope": {"owner": {"kind": "direct"}, "ref": "scope-s", "scope_epoch": 1,
                  "kind": "head", "workdir": "/p", "owner_authorized": false},
    }))
}

fn compaction_route(d: &mut Daemon, channel: u16, module: &str) {
    let (ty, bound) = bind_provider(d, channel, module, json!({"compaction-runner": "v1"}));
    assert_eq!(ty, FrameType::Response, "{bound}");
}

fn plan() -> Value {
    json!({
        "composition": {"join_version": 1},
        "compaction_item": {"provider": PROVIDER, "preset": "head", "params": {}},
    })
}

/// The texts of a recorded Anthropic request's messages, in order.
fn texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            blocks => blocks
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("|"),
        })
        .collect()
}

fn all_entries(d: &mut Daemon, channel: u16) -> Value {
    let (ty, page) = d.request(
        channel,
        1,
        "session.entries",
        json!({"select": {"by": "after"}, "detail": "full"}),
    );
    assert_eq!(ty, FrameType::Response, "{page}");
    page
}

#[test]
fn a_providers_view_is_recorded_before_it_is_accepted_and_the_next_request_goes_out_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let aimock = Aimock::start(&fixture("tools.json"));
    let log = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&log, &aimock.url());
    let crash = [("BROCA_CRASH_AT", "view_accepted:1")];
    let provider = ToolModule::new(PROVIDER);
    let (mut d, mut child) = start(dir.path(), "d1", &proxy.url(), &crash, &provider);

    // The session's first send freezes the plan naming the provider; its request already
    // shows each numbered part behind its number.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "plan": plan()}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(texts(&recorded_bodies(&log)[0]), ["§1§ hello"]);

    // Route refusals at bind: two roles at once, a version broca does not serve.
    for roles in [
        json!({"compaction-runner": "v1", "llm-runner": "v1"}),
        json!({"compaction-runner": "v2"}),
    ] {
        let (ty, refused) = bind_provider(&mut d, 5, PROVIDER, roles.clone());
        assert_eq!(ty, FrameType::Error, "{roles}: {refused}");
        assert_eq!(refused["code"], "unknown_route_role", "{refused}");
    }
    // A module that is not the session's provider is refused every op, by name.
    compaction_route(&mut d, 3, "ck-stranger");
    let (ty, stranger) = d.request(
        3,
        1,
        "session.entries",
        json!({"select": {"by": "after"}, "detail": "compact"}),
    );
    assert_eq!(
        (ty, stranger["code"].as_str()),
        (FrameType::Error, Some("unknown_session")),
        "{stranger}"
    );

    // The provider reads the transcript, numbered, and the session applies no view yet.
    compaction_route(&mut d, 2, PROVIDER);
    let page = all_entries(&mut d, 2);
    let entries = page["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{page}");
    assert_eq!(entries[0]["parts"][0]["text"], "hello");
    assert_eq!(entries[0]["parts"][0]["tag"], 1);
    assert_eq!(entries[1]["parts"][0]["text"], "Hello there.");
    assert_eq!(entries[1]["parts"][0]["tag"], 2);
    assert_eq!(page["head"]["newest"]["ordinal"], 2);
    assert_eq!(
        d.request(2, 1, "session.applied_view", json!({})).1,
        json!({})
    );
    let (ty, bad) = d.request(
        2,
        1,
        "session.entries",
        json!({"select": {"by": "after", "limit": 0}, "detail": "full"}),
    );
    assert_eq!(
        (ty, bad["code"].as_str()),
        (FrameType::Error, Some("invalid_params")),
        "{bad}"
    );
    assert_eq!(bad["detail"]["field"], "select.limit");
    let (ty, unknown) = d.request(2, 1, "session.compact_everything", json!({}));
    assert_eq!(
        (ty, unknown["code"].as_str()),
        (FrameType::Error, Some("unknown_method")),
        "{unknown}"
    );

    // A view whose checksum does not match is refused, and nothing is written.
    let records = dump_all(&state).len();
    let first = &entries[0];
    let edits = json!([{"since": 1, "op": "replace", "mid": first["mid"], "part": first["parts"][0]["id"],
                        "field": "text", "value": "[a greeting]", "expect": first["parts"][0]["digest"]}]);
    let forged = json!({"version": 1, "checksum": "0".repeat(64), "edits": edits});
    let (_, answer) = d.request(2, 1, "session.apply_view", json!({"view": forged}));
    assert_eq!(
        answer,
        json!({"answer": "refused", "refusal": {"code": "bad_checksum"}})
    );
    assert_eq!(
        dump_all(&state).len(),
        records,
        "a refused view wrote nothing"
    );

    // The view, sealed: durable before its answer, which is when broca aborts.
    let view = json!({"version": 1, "checksum": checksum(1, &edits), "edits": edits});
    d.send(
        FrameType::Request,
        2,
        1,
        &json!({"method": "session.apply_view", "params": {"view": view}}),
    );
    d.until_closed();
    assert!(
        !child.wait().unwrap().success(),
        "broca aborted once the view was durable"
    );

    let (mut d, child) = start(dir.path(), "d2", &proxy.url(), &[], &provider);
    compaction_route(&mut d, 2, PROVIDER);
    let (_, applied) = d.request(2, 1, "session.applied_view", json!({}));
    assert_eq!(applied["view"], view, "the view survived the kill");
    let (_, again) = d.request(2, 1, "session.apply_view", json!({"view": view}));
    assert_eq!(again["refusal"]["code"], "stale_version", "{again}");
    assert_eq!(all_entries(&mut d, 2)["head"]["applied_view"]["version"], 1);

    // The next request goes out through it: the replaced text as the view wrote it (final,
    // no number), every other part behind its number.
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello again", "model": "anthropic/m"}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let bodies = recorded_bodies(&log);
    assert_eq!(
        texts(bodies.last().unwrap()),
        ["[a greeting]", "§2§ Hello there.", "§3§ hello again"]
    );
    drain(&mut d, &mut { child });
}

/// A view's checksum (cortexkit-role-compaction W7): SHA-256 of the JCS text of
/// `{"version", "edits"}`, computed by the contract crate's own types.
fn checksum(version: u64, edits: &Value) -> String {
    let edits: Vec<cortexkit_role_compaction::view::Edit> =
        serde_json::from_value(edits.clone()).unwrap();
    cortexkit_role_compaction::view::View::seal(version, edits).checksum
}

/// Waits (5 s at most) until `list` holds `n` items, and answers them.
fn at_least(list: &std::sync::Arc<std::sync::Mutex<Vec<Value>>>, n: usize) -> Vec<Value> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let seen = list.lock().unwrap().clone();
        if seen.len() >= n || std::time::Instant::now() > until {
            return seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn the_provider_is_set_up_told_each_change_and_ridden_when_a_request_would_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let aimock = Aimock::start(&fixture("tools.json"));
    let log = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&log, &aimock.url());
    let provider = ToolModule::new(PROVIDER);
    let c = provider.compactor.clone();
    let (mut d, child) = start(dir.path(), "d", &proxy.url(), &[], &provider);

    // The first send: Setup before the first notice, a ride for the cache broca cannot know
    // warm (its first request), notices as the send, then the answer, are durable. The Setup
    // is slow to answer, so the message's notice can only go after it: the ride waits.
    *c.slow_setup_ms.lock().unwrap() = 300;
    let padding = "hello ".repeat(100);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": padding, "model": "anthropic/m", "plan": plan()}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let setups = at_least(&c.setups, 1);
    assert_eq!(setups.len(), 1, "{setups:?}");
    assert_eq!(setups[0]["preset"], "head");
    assert_eq!(
        setups[0]["model"],
        json!({"provider": "anthropic", "model": "m"})
    );
    assert_eq!(
        setups[0]["detects"],
        json!([
            "cache_expired",
            "model_change",
            "account_change",
            "surface_change",
            "over_limit"
        ])
    );
    let rides = at_least(&c.rides, 1);
    assert_eq!(rides[0]["causes"], json!(["cache_expired"]), "{rides:?}");
    // The person's message was told before the ride went (N3).
    assert!(
        c.told_before_ride.lock().unwrap()[0].contains(&1),
        "the message was not told before the ride: {:?}",
        c.notices.lock().unwrap()
    );
    // Every entry reaches the provider, in compact form, each notice numbered from 1.
    let told = |notices: &[Value]| -> Vec<u64> {
        notices
            .iter()
            .flat_map(|n| n["entries"].as_array().cloned().unwrap_or_default())
            .map(|e| e["ordinal"].as_u64().unwrap())
            .collect()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !told(&c.notices.lock().unwrap()).contains(&2) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let notices = c.notices.lock().unwrap().clone();
    let seqs: Vec<u64> = notices.iter().map(|n| n["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{notices:?}"
    );
    let mut ordinals = told(&notices);
    ordinals.dedup();
    assert_eq!(ordinals, [1, 2], "{notices:?}");
    assert_eq!(notices.last().unwrap()["newest"]["ordinal"], 2);
    assert_eq!(notices[0]["entries"][0]["parts"][0]["tag"], 1);

    // The provider's next ride brings a view: the first turn cut, a head in its place.
    compaction_route(&mut d, 2, PROVIDER);
    let page = all_entries(&mut d, 2);
    let edits = json!([
        {"since": 1, "op": "insert", "at": "start",
         "message": {"id": "head", "role": "user", "texts": ["Earlier: a long greeting."]}},
        {"since": 1, "op": "cut", "through": page["entries"][1]["mid"]},
    ]);
    let view = json!({"version": 1, "checksum": checksum(1, &edits), "edits": edits});
    *c.ride_view.lock().unwrap() = Some(view.clone());

    // A send whose reply's room leaves about 100 tokens of the model's window (128,000, the
    // catalog giving none): the whole history does not fit, so broca rides with
    // `over_limit`, applies the view to that very request, and it fits.
    let rides_before = c.rides.lock().unwrap().len();
    let small = json!({"prompt": "hello again", "model": "anthropic/m",
                       "generation": {"max_output_tokens": 127_900}});
    let (_, status) = run_with(&mut d, 1, small.clone());
    assert_eq!(status["state"], "completed", "{status}");
    let rides = c.rides.lock().unwrap().clone();
    assert_eq!(rides.len(), rides_before + 1, "{rides:?}");
    assert_eq!(rides.last().unwrap()["causes"], json!(["over_limit"]));
    assert!(rides.last().unwrap()["request_tokens"].as_u64().unwrap() > 100);
    assert_eq!(
        texts(recorded_bodies(&log).last().unwrap()),
        ["Earlier: a long greeting.", "§3§ hello again"]
    );
    let (_, applied) = d.request(2, 1, "session.applied_view", json!({}));
    assert_eq!(applied["view"], view, "the ride's view is the session's");
    // Its cut is the session's compaction marker, reported in a notice.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let marked = |n: &Value| n["events"] == json!([{"event": "marker_written", "version": 1}]);
    while !c.notices.lock().unwrap().iter().any(marked) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        c.notices.lock().unwrap().iter().any(marked),
        "{:?}",
        c.notices.lock().unwrap()
    );

    // A provider that restarted answers a notice `setup_required`: broca sets it up again,
    // and the notice after starts the count over.
    *c.forget.lock().unwrap() = 1;
    let setups_before = c.setups.lock().unwrap().len();
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m"}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let setups = at_least(&c.setups, setups_before + 1);
    assert_eq!(setups.len(), setups_before + 1, "set up again once");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let restarted = |ns: &[Value]| ns.iter().filter(|n| n["seq"] == 1).count() == 2;
    while !restarted(&c.notices.lock().unwrap()) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        restarted(&c.notices.lock().unwrap()),
        "{:?}",
        c.notices.lock().unwrap()
    );

    // With no view that makes it fit, the turn ends at the ceiling and nothing goes out.
    let sent = recorded_bodies(&log).len();
    let tiny = json!({"prompt": "hello once more", "model": "anthropic/m",
                      "generation": {"max_output_tokens": 127_990}});
    let (_, status) = run_with(&mut d, 1, tiny.clone());
    assert_eq!(status["state"], "context_ceiling", "{status}");
    assert_eq!(
        recorded_bodies(&log).len(),
        sent,
        "no request went out over the window"
    );

    // A provider silent on a ride holds up that request alone: the run's cancel is answered
    // while the ride waits (30 s for a request over the window), and the run ends cancelled
    // with nothing sent.
    *c.silent_rides.lock().unwrap() = 1;
    let rides_now = c.rides.lock().unwrap().len();
    let (ty, started) = d.request(1, 1, "session.send", tiny);
    assert_eq!(ty, FrameType::Response, "{started}");
    let run_id = started["result"]["run_id"].as_str().unwrap().to_string();
    at_least(&c.rides, rides_now + 1);
    let (ty, cancelled) = d.request(1, 1, "run.cancel", json!({"run_id": run_id}));
    assert_eq!(
        (ty, cancelled["result"].clone()),
        (FrameType::Response, json!("ack")),
        "{cancelled}"
    );
    let status = wait_ended(&mut d, 1, 1, &run_id);
    assert_eq!(
        status["state"], "cancelled",
        "cancelled while its ride waited: {status}"
    );
    assert_eq!(recorded_bodies(&log).len(), sent, "nothing went out");

    // A request under another model rides with `model_change`, one with other system text
    // with `surface_change`, and nothing else (the cache is warm).
    let rides_before = c.rides.lock().unwrap().len();
    let changes = [
        (
            json!({"prompt": "hello", "model": "anthropic/m2"}),
            "model_change",
        ),
        (
            json!({"prompt": "hello", "model": "anthropic/m2", "system": "Be brief."}),
            "surface_change",
        ),
    ];
    for (i, (send, cause)) in changes.into_iter().enumerate() {
        let (_, status) = run_with(&mut d, 1, send);
        assert_eq!(status["state"], "completed", "{status}");
        let rides = c.rides.lock().unwrap().clone();
        assert_eq!(rides.len(), rides_before + i + 1, "{rides:?}");
        assert_eq!(rides.last().unwrap()["causes"], json!([cause]));
    }
    drain(&mut d, &mut { child });
}

/// A plan naming the provider as the session's compaction provider and as its `pre_user` step
/// transform, with the subscription `sub`.
fn plan_with_hook(sub: Value) -> Value {
    let mut p = plan();
    p["step_transform_items"] = json!([{"provider": PROVIDER, "preset": "head", "params": {},
                                        "subscriptions": [sub]}]);
    p
}

fn pre_user(on_unavailable: &str, budget_ms: u64) -> Value {
    json!({"hook": "pre_user", "ops": ["prepend"], "on_unavailable": on_unavailable,
           "budget_ms": budget_ms})
}

/// What the WAL's send records (`run_started`, `send_queued`, `send_steered`) of the session
/// hold: each one's prompt and its `pre_user` attribution.
fn written(state: &Path) -> Vec<(Value, Value)> {
    dump_all(state)
        .into_iter()
        .filter(|r| {
            ["run_started", "send_queued", "send_steered"]
                .contains(&r["kind"].as_str().unwrap_or(""))
        })
        .map(|r| {
            (
                r["record"]["prompt"].clone(),
                r["record"]["pre_user"].clone(),
            )
        })
        .collect()
}

#[test]
fn a_persons_message_goes_through_the_providers_pre_user_hook_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let aimock = Aimock::start(&fixture("tools.json"));
    let log = dir.path().join("requests.jsonl");
    let proxy = Peer::recording_proxy(&log, &aimock.url());
    let provider = ToolModule::new(PROVIDER);
    let c = provider.compactor.clone();
    let (mut d, child) = start(dir.path(), "d1", &proxy.url(), &[], &provider);

    // The runner says it runs the hook.
    let (_, described) = d.request(1, 1, "role.describe", json!({}));
    assert_eq!(
        described["result"]["step_hooks"],
        json!(["pre_user"]),
        "{described}"
    );

    // Plans refused before anything is written, each by name: a hook broca does not run, a
    // `replace` by a module that is not the session's compaction provider, a budget above
    // what the provider declares (its declaration is asked at admission).
    let refused = |d: &mut Daemon, plan: Value| {
        let send = json!({"prompt": "hello", "model": "anthropic/m", "plan": plan});
        let (ty, answer) = d.request(1, 1, "session.send", send);
        assert_eq!(ty, FrameType::Error, "{answer}");
        answer
    };
    let post_tool = json!({"hook": "post_tool", "ops": ["append"], "on_unavailable": "pass",
                           "budget_ms": 100});
    let answer = refused(&mut d, plan_with_hook(post_tool));
    assert_eq!(answer["code"], "invalid_params", "{answer}");
    assert_eq!(
        answer["detail"]["field"], "plan.step_transform_items",
        "{answer}"
    );
    let mut stranger = plan_with_hook(pre_user("pass", 100));
    stranger["step_transform_items"][0]["provider"] = json!("ck-stranger");
    stranger["step_transform_items"][0]["subscriptions"][0]["ops"] = json!(["replace"]);
    let answer = refused(&mut d, stranger);
    assert_eq!(
        answer["detail"]["problem"], "replace_not_reduction_owner",
        "{answer}"
    );
    assert_eq!(
        (
            answer["detail"]["item"].clone(),
            answer["detail"]["subscription"].clone()
        ),
        (json!(0), json!(0))
    );
    let answer = refused(&mut d, plan_with_hook(pre_user("pass", 5000)));
    assert_eq!(answer["code"], "plan_stale", "{answer}");
    assert_eq!(
        answer["detail"]["differences"],
        json!([{"kind": "subscription_loosened", "provider": PROVIDER, "hook": "pre_user",
                "phase": null, "field": "budget_ms"}])
    );
    assert_eq!(
        c.declares.lock().unwrap().len(),
        1,
        "asked once, for the plan that got that far"
    );
    assert!(
        c.hooks.lock().unwrap().is_empty(),
        "no hook ran for a refused plan"
    );
    assert!(
        !state.join("wal").exists() || written(&state).is_empty(),
        "nothing was written"
    );

    // The plan as declared: the person's message goes through the hook before it is written,
    // and the record holding it says what the provider did.
    let good = plan_with_hook(pre_user("pass", 1000));
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello", "model": "anthropic/m", "plan": good}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let hooks = c.hooks.lock().unwrap().clone();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["hook"], "pre_user");
    assert_eq!(hooks[0]["blocks"], json!(["hello"]));
    assert_eq!(hooks[0]["preset"], "head");
    assert!(hooks[0]["at_ms"].as_u64().is_some(), "{hooks:?}");
    assert!(
        hooks[0].get("delivery").is_none(),
        "a person's message has no delivery"
    );
    assert_eq!(texts(&recorded_bodies(&log)[0]), ["§1§ [+0s] hello"]);
    let records = written(&state);
    assert_eq!(records[0].0, "[+0s] hello");
    assert_eq!(
        records[0].1,
        json!([{"module": PROVIDER, "ops": [{"op": "prepend", "block": 0, "text": "[+0s] ",
                                             "note": "gap since the last message"}]}]),
        "the record that holds the message says what the hook did"
    );

    // A provider that does not answer within the budget is passed over (`pass`): the message
    // is written as sent, and the record says so.
    c.hook_answers.lock().unwrap().push_back(None);
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello, still there?", "model": "anthropic/m"}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let records = written(&state);
    assert_eq!(records[1].0, "hello, still there?");
    assert_eq!(records[1].1[0]["module"], PROVIDER);
    assert!(
        records[1].1[0]["unavailable"].as_str().is_some(),
        "{:?}",
        records[1]
    );

    // An answer outside the subscription (an `append` where the plan subscribed `prepend`)
    // is not used either.
    c.hook_answers
        .lock()
        .unwrap()
        .push_back(Some(json!({"answer": "ops",
        "ops": [{"op": "append", "block": 0, "text": " (edited)"}]})));
    let (_, status) = run_with(
        &mut d,
        1,
        json!({"prompt": "hello and now?", "model": "anthropic/m"}),
    );
    assert_eq!(status["state"], "completed", "{status}");
    let records = written(&state);
    assert_eq!(records[2].0, "hello and now?");
    assert!(
        records[2].1[0]["unavailable"]
            .as_str()
            .is_some_and(|w| w.contains("op_not_subscribed")),
        "{:?}",
        records[2]
    );

    // A retried send_id whose record is durable is never run through the hook again.
    let keyed = json!({"prompt": "hello keyed", "model": "anthropic/m", "send_id": "k1"});
    let (run_id, _) = run_with(&mut d, 1, keyed.clone());
    let asked = c.hooks.lock().unwrap().len();
    let (_, again) = d.request(1, 1, "session.send", keyed);
    assert_eq!(again["result"]["run_id"], run_id.as_str(), "{again}");
    assert_eq!(
        c.hooks.lock().unwrap().len(),
        asked,
        "the retry asked nothing"
    );

    // Under `refuse`, a hook without a usable answer refuses the send, and nothing is written
    // (another session, whose plan says so).
    assert_eq!(d.bind(4, 1, "/p", "h", "s2").0, FrameType::Response);
    c.hook_answers.lock().unwrap().push_back(None);
    let strict = json!({"prompt": "hello", "model": "anthropic/m",
                        "plan": plan_with_hook(pre_user("refuse", 300))});
    let before = dump_all(&state).len();
    let (ty, answer) = d.request(4, 1, "session.send", strict.clone());
    assert_eq!(ty, FrameType::Error, "{answer}");
    assert_eq!(answer["code"], "pre_user_unavailable", "{answer}");
    assert_eq!(answer["detail"]["provider"], PROVIDER, "{answer}");
    assert_eq!(
        dump_all(&state).len(),
        before,
        "a refused send wrote nothing"
    );
    // The same send, answered this time, starts the session.
    let (_, status) = run_with(&mut d, 4, strict);
    assert_eq!(status["state"], "completed", "{status}");
    drain(&mut d, &mut { child });
}
