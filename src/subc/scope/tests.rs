//! The owner's scope bookkeeping against hand-made daemon answers.

use super::*;
use serde_json::json;

fn frame(ty: FrameType, body: &Value) -> FrameIn {
    crate::frames::test_frame(ty, crate::frames::control(), body)
}

/// The daemon's answer to an apply: every upsert created, `ended` as given.
fn created(body: &[u8], ended: Value) -> FrameIn {
    let asked: Value = serde_json::from_slice(body).unwrap();
    let results: Vec<Value> = asked["upsert"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| json!({"ref": r["ref"], "scope_epoch": r["scope_epoch"], "outcome": "created", "version": 1}))
        .collect();
    frame(
        FrameType::Response,
        &json!({"op": "scope.apply", "generation": asked["generation"], "results": results,
                "end_results": [], "ended": ended}),
    )
}

#[test]
fn two_sessions_differing_only_in_their_project_root_have_two_scopes() {
    let a = record("/work/a", "h", "s", 5);
    let b = record("/work/b", "h", "s", 5);
    assert_ne!(a.scope_ref, b.scope_ref);
    assert_eq!(a.scope_ref, record("/work/a", "h", "s", 9).scope_ref);
    assert_eq!(a.workdir.as_deref(), Some("/work/a"));
    // The parts are length-framed: moving a character between them is another session.
    assert_ne!(scope_ref("/a", "bc", "d"), scope_ref("/ab", "c", "d"),);
    // A root that is not an absolute folder names none.
    assert_eq!(record("proj", "h", "s", 1).workdir, None);
    // The record and the selector as the daemon reads them.
    let wire: Value = serde_json::to_value(&a).unwrap();
    assert_eq!(wire["kind"], "head");
    assert_eq!(wire["scope_epoch"], 5);
    let sel: Value = serde_json::to_value(selector("ck-broca", &a)).unwrap();
    assert_eq!(
        sel,
        json!({"owner": {"kind": "reserved", "module_id": "ck-broca"}, "ref": a.scope_ref, "scope_epoch": 5})
    );
}

#[test]
fn the_first_sync_takes_authority_then_each_new_scope_is_applied_once() {
    let mut reg = Registry::new(1000);
    let sync: Value = serde_json::from_slice(&reg.first_sync().unwrap()).unwrap();
    assert_eq!(
        sync,
        json!({"op": "scope.sync", "generation": 1001, "scopes": []})
    );
    reg.synced(&frame(
        FrameType::Response,
        &json!({"op": "scope.sync", "generation": 1001, "results": []}),
    ))
    .unwrap();
    assert!(reg.first_sync().is_none(), "one full sync per connection");

    let a = record("/a", "h", "s", 3);
    // The same session asked twice in one batch is one upsert.
    let batch = reg.batch(&[a.clone(), a.clone()]).unwrap();
    let apply: Value = serde_json::from_slice(&batch.body).unwrap();
    assert_eq!(apply["op"], "scope.apply");
    assert_eq!(apply["generation"], 1002);
    assert_eq!(apply["upsert"].as_array().unwrap().len(), 1);
    assert_eq!(apply["end"], json!([]));
    let got = reg.applied(&created(&batch.body, json!([]))).unwrap();
    assert_eq!(got[&a.scope_ref], Ok(()));
    assert!(reg.batch(&[a.clone()]).is_none(), "live: not asked again");
    // The same ref at a later epoch (the session made again) is applied again.
    let again = record("/a", "h", "s", 4);
    let next: Value = serde_json::from_slice(&reg.batch(&[again]).unwrap().body).unwrap();
    assert_eq!(next["generation"], 1003);
    assert_eq!(next["upsert"][0]["scope_epoch"], 4);
}

#[test]
fn refusals_are_named_and_leave_the_scope_unregistered() {
    let mut reg = Registry::new(0);
    let a = record("/a", "h", "s", 1);
    let batch = reg.batch(&[a.clone()]).unwrap();
    let refused = frame(
        FrameType::Response,
        &json!({"op": "scope.apply", "generation": 1, "end_results": [],
                "results": [{"ref": a.scope_ref, "scope_epoch": 1, "outcome": "refused",
                             "code": "scope_workdir_invalid", "message": "no such folder"}]}),
    );
    let got = reg.applied(&refused).unwrap();
    let why = got[&a.scope_ref].clone().unwrap_err();
    assert!(matches!(why, ScopeError::Refused(_)), "{why}");
    let why = why.to_string();
    assert!(
        why.contains("scope_workdir_invalid") && why.contains("no such folder"),
        "{why}"
    );
    assert!(reg.batch(&[a.clone()]).is_some(), "asked again next time");
    drop(batch);
    // A whole refusal of the call.
    let whole = frame(
        FrameType::Error,
        &json!({"code": "scope_sync_required", "message": "sync first"}),
    );
    let e = reg.applied(&whole).unwrap_err();
    assert!(matches!(e, ScopeError::Refused(_)), "{e}");
    assert!(e.to_string().contains("scope_sync_required"), "{e}");
    let e = reg
        .synced(&frame(
            FrameType::Response,
            &json!({"op": "scope.apply", "generation": 1, "results": [], "end_results": []}),
        ))
        .unwrap_err();
    assert!(matches!(e, ScopeError::Unexpected(_)), "{e}");
    assert!(e.to_string().contains("another op"), "{e}");
}

#[test]
fn past_the_cap_the_least_recently_used_scope_is_ended_in_the_same_apply() {
    let mut reg = Registry::with_cap(0, 2);
    let (a, b, c) = (
        record("/a", "h", "s", 1),
        record("/b", "h", "s", 1),
        record("/c", "h", "s", 1),
    );
    for r in [&a, &b] {
        let batch = reg.batch(std::slice::from_ref(r)).unwrap();
        reg.applied(&created(&batch.body, json!([]))).unwrap();
    }
    // `a` used again: `b` is the least recently used.
    assert!(reg.batch(&[a.clone()]).is_none());
    let batch = reg.batch(&[c.clone()]).unwrap();
    let apply: Value = serde_json::from_slice(&batch.body).unwrap();
    assert_eq!(
        apply["end"],
        json!([{"ref": b.scope_ref, "scope_epoch": 1}])
    );
    reg.applied(&created(
        &batch.body,
        json!([{"ref": b.scope_ref, "scope_epoch": 1}]),
    ))
    .unwrap();
    assert_eq!(reg.live(), 2);
    assert!(
        reg.batch(&[b.clone()]).is_some(),
        "an ended scope is registered again"
    );
    // A scope the daemon says ended (expiry, say) is no longer live.
    let mut reg = Registry::new(0);
    let batch = reg.batch(&[a.clone()]).unwrap();
    reg.applied(&created(&batch.body, json!([]))).unwrap();
    let batch = reg.batch(&[c.clone()]).unwrap();
    reg.applied(&created(
        &batch.body,
        json!([{"ref": a.scope_ref, "scope_epoch": 1}]),
    ))
    .unwrap();
    assert!(reg.batch(&[a]).is_some());
    reg.forget(&c.scope_ref);
    assert!(reg.batch(&[c]).is_some());
}
