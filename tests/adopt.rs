//! A session its host starts, and its adoption (llm-runner/v1 `adopt`, docs/plans.md): the
//! real `broca module` against the daemon stand-in. The person's app (a route the daemon
//! attests as `direct`) starts the session with the installation's plan
//! (`session.host_start`) and sends the person's turn; a module adopts it and owns it from
//! then on, the app still starting the person's turns; each refusal writes nothing; a kill
//! once the adoption is durable keeps its owner and its answer.

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

/// The installation's plan (nothing to fetch: its composition alone), or another one.
fn plan(note: &str) -> Value {
    json!({"composition": {"join_version": 1, "note": note}})
}

fn policy() -> Value {
    json!({"keep": "forever", "archive_after_days": 0, "backup": false, "request_dumps": false})
}

/// Binds route `channel` to the session ("/p", "h", "s") for module `module`.
fn bind_as(d: &mut Daemon, channel: u16, module: &str) {
    let (ty, bound) = d.control(&json!({
        "op": "route.bind", "route_channel": channel, "epoch": 1,
        "target": {"kind": "management_surface", "module_id": "ck-broca"},
        "identity": {"harness": "h", "session": "s"},
        "principal": {"kind": "reserved", "module_id": module},
        "scope": {"owner": {"kind": "direct"}, "ref": "scope-s", "scope_epoch": 1,
                  "kind": "head", "workdir": "/p", "owner_authorized": false},
    }));
    assert_eq!(ty, FrameType::Response, "{bound}");
}

fn adopt(d: &mut Daemon, channel: u16, params: Value) -> Value {
    d.request(channel, 1, "session.adopt", params).1
}

fn code(answer: &Value) -> &str {
    answer["code"].as_str().unwrap_or("")
}

#[test]
fn a_session_its_host_starts_is_adopted_once_and_keeps_its_owner_across_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let peer = Aimock::start(&fixture("tools.json"));
    let tools = ToolModule::new("ck-tools");
    // Route 1 is the person's app (`direct`). Abort once the second change record (the
    // adoption, after the host's start) is durable.
    let crash = [("BROCA_CRASH_AT", "session_changed:2")];
    let (mut d, mut child) = planned_bound(dir.path(), "d1", &peer, &tools, &crash);
    assert_declares(&mut d, "adopt", &["session.adopt"]);

    // The host's start: its plan applied, answered again on a repeat; another plan drifts.
    let (_, started) = d.request(1, 1, "session.host_start", json!({"plan": plan("install")}));
    let digest = started["result"]["applied_plan_digest"].clone();
    assert!(digest.is_string(), "{started}");
    let (_, again) = d.request(1, 1, "session.host_start", json!({"plan": plan("install")}));
    assert_eq!(again["result"]["applied_plan_digest"], digest, "{again}");
    let (_, other) = d.request(1, 1, "session.host_start", json!({"plan": plan("other")}));
    assert_eq!(code(&other), "plan_drift", "{other}");
    assert_eq!(other["detail"]["frozen"], digest, "{other}");

    // Refusals, each writing nothing: the app itself (no attested identity), a plan other
    // than the host's, no storage policy where module mode requires one (none is frozen
    // yet: the daemon stand-in gives the person's sends one, as a starter's).
    bind_as(&mut d, 2, "the-owner");
    bind_as(&mut d, 3, "a-stranger");
    let records = dump_all(&dir.path().join("state")).len();
    let asked =
        |plan: Value| json!({"send_id": "adopt-1", "plan": plan, "retention_policy": policy()});
    assert_eq!(
        code(&adopt(&mut d, 1, asked(plan("install")))),
        "scope_owner_mismatch"
    );
    let drift = adopt(&mut d, 3, asked(plan("other")));
    assert_eq!(code(&drift), "plan_drift", "{drift}");
    let bare = adopt(
        &mut d,
        2,
        json!({"send_id": "adopt-1", "plan": plan("install")}),
    );
    assert_eq!(code(&bare), "retention_required", "{bare}");
    assert_eq!(
        dump_all(&dir.path().join("state")).len(),
        records,
        "refusals wrote nothing"
    );

    // The person's turn: a run carrying no send_id.
    let turn = json!({"prompt": "hello", "model": "anthropic/m"});
    let (_, status) = run_with(&mut d, 1, turn.clone());
    assert_eq!(status["state"], "completed", "{status}");

    // The adoption: durable before its answer, which is when broca aborts.
    d.send(
        FrameType::Request,
        2,
        1,
        &json!({"method": "session.adopt", "params": asked(plan("install"))}),
    );
    d.until_closed();
    assert!(
        !child.wait().unwrap().success(),
        "broca aborted at the adoption"
    );

    let (mut d, mut child) = planned_bound(dir.path(), "d2", &peer, &tools, &[]);
    bind_as(&mut d, 2, "the-owner");
    bind_as(&mut d, 3, "a-stranger");
    // The owner's retry is answered as the adoption was; another plan under its send_id is
    // a reuse; the stranger cannot take the session over, nor send into it.
    let answer = adopt(&mut d, 2, asked(plan("install")));
    assert_eq!(
        answer["result"],
        json!({"owner_bound": true, "applied_plan_digest": digest, "last_ordinal": 2}),
        "{answer}"
    );
    let reuse = adopt(
        &mut d,
        2,
        json!({"send_id": "adopt-1", "plan": plan("other"),
        "retention_policy": policy()}),
    );
    assert_eq!(code(&reuse), "send_id_reuse", "{reuse}");
    assert_eq!(reuse["detail"]["field"], "plan", "{reuse}");
    let taken = adopt(
        &mut d,
        3,
        json!({"send_id": "adopt-2", "plan": plan("install"),
        "retention_policy": policy()}),
    );
    assert_eq!(code(&taken), "scope_owner_mismatch", "{taken}");
    let (_, sent) = d.request(
        3,
        1,
        "session.send",
        json!({"prompt": "mine now", "model": "anthropic/m", "send_id": "x"}),
    );
    assert_eq!(code(&sent), "scope_owner_mismatch", "{sent}");
    // The owner reads its baseline and sends; the person's app still starts turns.
    let (_, baseline) = d.request(2, 1, "session.baseline", json!({}));
    assert_eq!(baseline["result"]["state"], "ready", "{baseline}");
    let owned = json!({"prompt": "hello again", "model": "anthropic/m", "send_id": "own-1"});
    let (_, status) = run_with(&mut d, 2, owned);
    assert_eq!(status["state"], "completed", "{status}");
    let (_, status) = run_with(&mut d, 1, turn);
    assert_eq!(status["state"], "completed", "{status}");
    drain(&mut d, &mut child);
}
