use cortexkit_role_step_transform_provider::vectors;
use serde_json::{json, Value};

use super::*;

fn subscriptions_vectors() -> Value {
    serde_json::from_str(vectors::file("subscriptions.json").expect("the role ships it")).unwrap()
}

fn cases<'a>(file: &'a Value, key: &str) -> &'a Vec<Value> {
    file[key].as_array().unwrap_or_else(|| panic!("{key}"))
}

fn plan(items: Value) -> Map<String, Value> {
    let Value::Object(p) = json!({
        "compaction_item": {"provider": "ck-compactor", "preset": "head"},
        "step_transform_items": items,
    }) else {
        unreachable!()
    };
    p
}

fn item(provider: &str, subscriptions: Value) -> Value {
    json!([{"provider": provider, "preset": "head", "subscriptions": subscriptions}])
}

#[test]
fn the_roles_reduction_vectors_hold_for_pre_user() {
    let file = subscriptions_vectors();
    let mut seen = 0;
    for case in cases(&file, "reduction") {
        if case["subscription"]["hook"] != "pre_user" {
            continue; // broca runs no other hook: read refuses them all
        }
        seen += 1;
        let mut p = plan(item(
            case["provider"].as_str().unwrap(),
            json!([case["subscription"]]),
        ));
        match case["reduction_owner"].as_str() {
            Some(owner) => p["compaction_item"]["provider"] = json!(owner),
            None => {
                p.remove("compaction_item");
            }
        }
        let got = read(&p).err();
        let want = case["problem"]
            .as_str()
            .map(|problem| Refusal::InvalidSubscription {
                item: 0,
                subscription: 0,
                problem: problem.to_string(),
            });
        assert_eq!(got, want, "{}", case["name"]);
    }
    assert!(seen >= 2, "the vectors hold pre_user cases");
}

#[test]
fn the_roles_admission_vectors_hold_for_declarations() {
    let file = subscriptions_vectors();
    let mut seen = 0;
    for case in cases(&file, "items") {
        let expected = &case["expected"];
        if expected["code"] == "invalid_params" {
            continue; // read's part (the shape and the reduction rule), before any fetch
        }
        seen += 1;
        let hooks = Hooks {
            items: vec![Item {
                provider: case["provider"].as_str().unwrap().to_string(),
                preset: case["preset"].as_str().map(str::to_string),
                params: Map::new(),
                subscriptions: serde_json::from_value(case["subscriptions"].clone()).unwrap(),
            }],
        };
        let answer = match &case["declaration"] {
            Value::Null => Err(Missed::Refused {
                code: "invalid_params".into(),
                message: "no such preset".into(),
            }),
            _ => Ok(file["declaration"].clone()),
        };
        let got = check_declarations(&hooks, vec![answer]);
        match expected["code"].as_str() {
            None => assert_eq!(got, Ok(()), "{}", case["name"]),
            Some(_) => assert_eq!(
                got,
                Err(Refusal::PlanStale {
                    differences: expected["detail"]["differences"]
                        .as_array()
                        .unwrap()
                        .clone()
                }),
                "{}",
                case["name"]
            ),
        }
    }
    assert!(seen >= 3, "{seen}");
}

#[test]
fn a_plan_is_refused_by_name_for_what_broca_does_not_run() {
    let sub = |hook: &str| json!({"hook": hook, "ops": ["append"], "on_unavailable": "pass", "budget_ms": 10});
    let field_of = |r: Result<Hooks, Refusal>| r.err().and_then(|r| r.field().map(str::to_string));
    assert_eq!(
        field_of(read(&plan(item("ck-x", json!([sub("post_tool")]))))),
        Some("plan.step_transform_items".into())
    );
    assert_eq!(
        field_of(read(&plan(json!({"provider": "ck-x"})))),
        Some("plan.step_transform_items".into())
    );
    let zero =
        json!({"hook": "pre_user", "ops": ["append"], "on_unavailable": "pass", "budget_ms": 0});
    assert_eq!(
        read(&plan(item("ck-x", json!([sub("pre_user"), zero])))).err(),
        Some(Refusal::InvalidSubscription {
            item: 0,
            subscription: 1,
            problem: "zero_budget".into()
        })
    );
    let hooks = read(&plan(item("ck-x", json!([sub("pre_user")])))).unwrap();
    assert_eq!(hooks.calls().len(), 1);
    // Without the member, nothing runs.
    assert!(read(&Map::new()).unwrap().is_empty());
}

#[test]
fn an_answer_is_applied_only_within_the_subscription() {
    let hooks = read(&plan(item(
        "ck-compactor",
        json!([{"hook": "pre_user", "ops": ["prepend", "replace"], "on_unavailable": "refuse",
                "budget_ms": 60_000}]),
    )))
    .unwrap();
    let call = &hooks.calls()[0];
    assert!(call.refuse);
    assert_eq!(
        call.budget_ms, BUDGET_CAP_MS,
        "the engine's cap bounds a frozen budget"
    );
    let body: Value = serde_json::from_slice(&call.body(&["hi".into()], Some("steer"), 7)).unwrap();
    assert_eq!(
        body,
        json!({"method": "transform.hook", "params": {"hook": "pre_user", "blocks": ["hi"],
               "delivery": "steer", "at_ms": 7, "preset": "head", "params": {}}})
    );
    let blocks = vec!["hi".to_string()];
    let ops = json!({"answer": "ops", "ops": [
        {"op": "prepend", "block": 0, "text": "b "}, {"op": "prepend", "block": 0, "text": "a "},
        {"op": "replace", "block": 0, "value": "whole", "note": "n"}]});
    let (now, record) = call.apply(&blocks, &ops).unwrap();
    assert_eq!(now, ["whole"]);
    assert_eq!(record["module"], "ck-compactor");
    assert_eq!(record["ops"][2]["note"], "n");
    let (now, _) = call
        .apply(&blocks, &json!({"answer": "ops", "ops": [
            {"op": "prepend", "block": 0, "text": "b "}, {"op": "prepend", "block": 0, "text": "a "}]}))
        .unwrap();
    assert_eq!(now, ["a b hi"], "prepends stack outward");
    assert_eq!(
        call.apply(&blocks, &json!({"answer": "pass"})).unwrap().1,
        json!({"module": "ck-compactor", "pass": true})
    );
    for (answer, why) in [
        (
            json!({"answer": "ops", "ops": [{"op": "append", "block": 0, "text": "x"}]}),
            "op_not_subscribed",
        ),
        (
            json!({"answer": "ops", "ops": [{"op": "prepend", "block": 1, "text": "x"}]}),
            "block_out_of_range",
        ),
        (
            json!({"answer": "mutate", "input": {}}),
            "answer_not_allowed",
        ),
        (json!({"answer": "later"}), "answer_not_allowed"),
        (json!({"ops": []}), "does not decode"),
    ] {
        let err = call.apply(&blocks, &answer).unwrap_err().to_string();
        assert!(err.contains(why), "{answer}: {err}");
    }
}
