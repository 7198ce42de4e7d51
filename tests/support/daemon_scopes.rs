//! The daemon stand-in's scope table (tests/support/daemon.rs): what an owner's `scope.sync`
//! and `scope.apply` do to it, and how a scoped `route.open` is admitted against it.

use std::sync::{Arc, Mutex};

use serde_json::Value;

/// The daemon's scope records by ref, with their owner (the registered module).
pub type ScopeTable = Arc<Mutex<std::collections::HashMap<String, (String, Value)>>>;

/// The answer to `owner`'s scope op `op` (`scope.sync` replaces its set, `scope.apply`
/// upserts and ends), applied to `table`.
pub(super) fn answer(table: &ScopeTable, owner: &str, op: &str, body: &Value) -> Value {
    let mut table = table.lock().unwrap();
    let mut results = Vec::new();
    let mut end_results = Vec::new();
    let upserts = if op == "scope.sync" {
        table.retain(|_, (o, _)| o != owner);
        &body["scopes"]
    } else {
        for e in body["end"].as_array().into_iter().flatten() {
            let r = e["ref"].as_str().unwrap_or("").to_string();
            let live = table
                .get(&r)
                .is_some_and(|(_, rec)| rec["scope_epoch"] == e["scope_epoch"]);
            if live {
                table.remove(&r);
            }
            end_results.push(
                serde_json::json!({"ref": r, "scope_epoch": e["scope_epoch"],
                "outcome": if live { "ended" } else { "not_live" }}),
            );
        }
        &body["upsert"]
    };
    for rec in upserts.as_array().into_iter().flatten() {
        let r = rec["ref"].as_str().unwrap_or("").to_string();
        let before = table.insert(r.clone(), (owner.to_string(), rec.clone()));
        let outcome = match before {
            None => "created",
            Some((_, old)) if old["scope_epoch"] != rec["scope_epoch"] => "replaced",
            Some((_, old)) if &old == rec => "unchanged",
            Some(_) => "updated",
        };
        results.push(
            serde_json::json!({"ref": r, "scope_epoch": rec["scope_epoch"],
            "outcome": outcome, "version": 1}),
        );
    }
    let mut answer =
        serde_json::json!({"op": op, "generation": body["generation"], "results": results});
    if op == "scope.apply" {
        answer["end_results"] = Value::Array(end_results);
    }
    answer
}

/// A route.open's scope as the daemon admits it: only its owner (the opener's consumer
/// identity, a reserved module) opens under it, and only at its live epoch. Answers the stamp
/// the module's bind carries (`Null` for an unscoped open).
pub(super) fn admit(scopes: &ScopeTable, body: &Value) -> Result<Value, &'static str> {
    let sel = &body["scope"];
    if sel.is_null() {
        return Ok(Value::Null);
    }
    if sel["scope_epoch"].is_null() {
        return Err("scope_epoch_required");
    }
    let table = scopes.lock().unwrap();
    let Some((owner, rec)) = table.get(sel["ref"].as_str().unwrap_or("")) else {
        return Err("scope_not_live");
    };
    if rec["scope_epoch"] != sel["scope_epoch"] {
        return Err("scope_not_live");
    }
    let opener = body["consumer_identity"]["module_id"].as_str();
    if sel["owner"]["kind"] != "reserved"
        || sel["owner"]["module_id"].as_str() != Some(owner)
        || opener != Some(owner)
    {
        return Err("scope_not_carrier");
    }
    Ok(serde_json::json!({
        "owner": sel["owner"], "ref": sel["ref"], "scope_epoch": rec["scope_epoch"],
        "kind": rec["kind"], "workdir": rec["workdir"], "owner_authorized": false,
    }))
}
