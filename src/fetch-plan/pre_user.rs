//! A person's message through the plan's step transforms before it is written
//! (`step-transform-provider/v2`; cortexkit-role-compaction A10), sans-IO: the plan's
//! `step_transform_items` read and checked ([`read`]), the providers' declarations checked
//! against them at admission ([`check_declarations`]), each `pre_user` call made
//! ([`Hooks::calls`]) and each answer checked and applied ([`Hooks::apply`]).
//!
//! broca runs the `pre_user` hook alone (`role.describe.step_hooks`): a plan subscribing any
//! other hook is refused `invalid_params {field: "plan.step_transform_items"}`. What each
//! provider did to a message (its operations and their notes, or why it was passed over) is
//! written on the record that holds the message, the attribution record: nothing is diffed,
//! and a replay never asks again.

use broca_wire::Refusal;
use cortexkit_role_step_transform_provider::answer::{apply_ops, check_answer, HookAnswer};
use cortexkit_role_step_transform_provider::hook::{HookCall, Subject};
use cortexkit_role_step_transform_provider::subscription::{
    check_reduction, Declaration, DeclareRequest, Hook, OnUnavailable, Subscription,
    SubscriptionProblem,
};
use cortexkit_role_step_transform_provider::OpRequest;
use serde_json::{json, Map, Value};

use crate::Missed;

/// The plan member this module reads.
pub const MEMBER: &str = "step_transform_items";

/// The longest broca waits on one provider's hook, whatever its frozen budget says (the
/// engine-wide cap of step-transform-provider/v2 §4).
pub const BUDGET_CAP_MS: u64 = 10_000;

/// One `step_transform_items` entry: its provider, preset, params and subscriptions.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub provider: String,
    pub preset: Option<String>,
    pub params: Map<String, Value>,
    pub subscriptions: Vec<Subscription>,
}

/// The plan's step-transform items, in plan order: empty when it names none.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hooks {
    pub items: Vec<Item>,
}

fn invalid(item: usize, subscription: usize, problem: &SubscriptionProblem) -> Refusal {
    Refusal::InvalidSubscription {
        item,
        subscription,
        problem: problem.name().to_string(),
    }
}

fn malformed(why: String) -> Refusal {
    Refusal::InvalidField {
        field:
            cortexkit_role_step_transform_provider::errors::runner_codes::PLAN_STEP_TRANSFORM_ITEMS,
        why,
    }
}

/// Reads `plan`'s `step_transform_items`: each `{provider, preset?, params?, subscriptions}`,
/// every subscription well formed (`invalid_params` with `item`, `subscription` and
/// `problem`, the first in plan order), a `pre_user` one (the only hook broca runs), and a
/// `replace` only for the session's compaction provider (its reduction owner).
pub fn read(plan: &Map<String, Value>) -> Result<Hooks, Refusal> {
    let Some(raw) = plan.get(MEMBER) else {
        return Ok(Hooks::default());
    };
    let Some(list) = raw.as_array() else {
        return Err(malformed(
            "`plan.step_transform_items` must be an array".into(),
        ));
    };
    let owner = plan
        .get(cortexkit_role_llm_runner::compaction::PLAN_COMPACTION_ITEM)
        .and_then(|c| c.get("provider"))
        .and_then(Value::as_str);
    let mut items: Vec<Item> = Vec::with_capacity(list.len());
    for (i, raw) in list.iter().enumerate() {
        let bad = |why: &str| malformed(format!("`plan.step_transform_items[{i}]`: {why}"));
        let Some(o) = raw.as_object() else {
            return Err(bad(
                "must be an object {provider, preset?, params?, subscriptions}",
            ));
        };
        let provider = match o.get("provider") {
            Some(Value::String(p)) if !p.is_empty() => p.clone(),
            _ => return Err(bad("`provider` must be a module id")),
        };
        if items.iter().any(|it| it.provider == provider) {
            return Err(bad("names a provider an earlier item names"));
        }
        let preset = match o.get("preset") {
            None | Some(Value::Null) => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(_) => return Err(bad("`preset` must be a string")),
        };
        let params = match o.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(p)) => p.clone(),
            Some(_) => return Err(bad("`params` must be an object")),
        };
        let Some(subs) = o.get("subscriptions").and_then(Value::as_array) else {
            return Err(bad("`subscriptions` must be an array"));
        };
        let mut subscriptions = Vec::with_capacity(subs.len());
        for (s, raw) in subs.iter().enumerate() {
            let sub: Subscription = serde_json::from_value(raw.clone()).map_err(|e| {
                malformed(format!(
                    "`plan.step_transform_items[{i}].subscriptions[{s}]`: {e}"
                ))
            })?;
            sub.check().map_err(|p| invalid(i, s, &p))?;
            check_reduction(&sub, &provider, owner).map_err(|p| invalid(i, s, &p))?;
            if sub.hook != Hook::PreUser {
                return Err(malformed(format!(
                    "`plan.step_transform_items[{i}].subscriptions[{s}]`: this runner runs the \
                     `pre_user` hook alone (role.describe's `step_hooks`)"
                )));
            }
            subscriptions.push(sub);
        }
        items.push(Item {
            provider,
            preset,
            params,
            subscriptions,
        });
    }
    Ok(Hooks { items })
}

impl Hooks {
    /// Whether the plan subscribes any hook.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The `transform.declare` request of each item, in order, with the plan's composition.
    pub fn declares(&self, composition: Option<&Map<String, Value>>) -> Vec<(String, Vec<u8>)> {
        self.items
            .iter()
            .map(|item| {
                let mut request = DeclareRequest::new(item.params.clone());
                if let Some(p) = &item.preset {
                    request = request.with_preset(p.clone());
                }
                if let Some(c) = composition {
                    request = request.with_composition(c.clone());
                }
                let op = OpRequest::new(
                    cortexkit_role_step_transform_provider::ops::TRANSFORM_DECLARE,
                    request,
                );
                (
                    item.provider.clone(),
                    serde_json::to_vec(&op).expect("a declare request serializes"),
                )
            })
            .collect()
    }

    /// The `pre_user` calls to make, in plan order: each subscription's provider, what happens
    /// when it is unavailable and its budget (capped).
    pub fn calls(&self) -> Vec<Call> {
        let mut calls = Vec::new();
        for item in &self.items {
            for sub in item
                .subscriptions
                .iter()
                .filter(|s| s.hook == Hook::PreUser)
            {
                calls.push(Call {
                    provider: item.provider.clone(),
                    preset: item.preset.clone(),
                    params: item.params.clone(),
                    refuse: sub.on_unavailable == OnUnavailable::Refuse,
                    budget_ms: sub.budget_ms.min(BUDGET_CAP_MS),
                    ops: sub.ops.clone(),
                });
            }
        }
        calls
    }
}

/// One `pre_user` call to make.
#[derive(Debug, Clone)]
pub struct Call {
    pub provider: String,
    preset: Option<String>,
    params: Map<String, Value>,
    /// `on_unavailable: refuse`: the send is refused when the call gets no usable answer.
    pub refuse: bool,
    pub budget_ms: u64,
    ops: Vec<cortexkit_role_step_transform_provider::subscription::Op>,
}

impl Call {
    /// The `transform.hook` request for the message's text `blocks` as they stand (after the
    /// providers before this one), its `delivery` (absent for a plain send) and its time on
    /// this machine.
    pub fn body(&self, blocks: &[String], delivery: Option<&str>, at_ms: u64) -> Vec<u8> {
        let subject = Subject::PreUser {
            blocks: blocks.to_vec(),
            mark: None,
            delivery: delivery.map(str::to_string),
            at_ms: Some(at_ms),
        };
        let call = HookCall::new(subject).with_item(self.preset.clone(), self.params.clone());
        let op = OpRequest::new(
            cortexkit_role_step_transform_provider::ops::TRANSFORM_HOOK,
            call,
        );
        serde_json::to_vec(&op).expect("a hook call serializes")
    }

    /// Applies the provider's `answer` to `blocks`: the new blocks and the attribution record
    /// (`{module, ops}`, the operations as answered, each with its note; `{module, pass:
    /// true}` for a pass), or why the answer is not usable (not an answer, an operation the
    /// plan did not subscribe, a block out of range): the hook is then unavailable for this
    /// call.
    pub fn apply(
        &self,
        blocks: &[String],
        answer: &Value,
    ) -> Result<(Vec<String>, Value), Unusable> {
        let decoded: HookAnswer =
            serde_json::from_value(answer.clone()).map_err(Unusable::Decode)?;
        let subject = Subject::PreUser {
            blocks: blocks.to_vec(),
            mark: None,
            delivery: None,
            at_ms: None,
        };
        check_answer(&subject, &self.ops, None, &decoded)
            .map_err(|p| Unusable::NotAllowed(p.name()))?;
        match decoded {
            HookAnswer::Ops { ops } => {
                let new = apply_ops(blocks, &ops).map_err(|p| Unusable::Ops(p.name()))?;
                let ops = serde_json::to_value(&ops).unwrap_or(Value::Null);
                Ok((new, json!({"module": self.provider, "ops": ops})))
            }
            _ => Ok((
                blocks.to_vec(),
                json!({"module": self.provider, "pass": true}),
            )),
        }
    }

    /// The attribution record of a call passed over under `on_unavailable: pass` (why).
    pub fn passed_over(&self, why: &str) -> Value {
        json!({"module": self.provider, "unavailable": why})
    }
}

/// Checks the plan's items against their providers' current declarations (one answer per
/// [`Hooks::declares`], in order): `fetch_unavailable` for a provider that did not answer,
/// `plan_stale` with one difference per subscription the declaration no longer covers.
pub fn check_declarations(
    hooks: &Hooks,
    answers: Vec<Result<Value, Missed>>,
) -> Result<(), Refusal> {
    let mut differences = Vec::new();
    for (item, answer) in hooks.items.iter().zip(answers) {
        let preset = item.preset.clone().unwrap_or_default();
        let declared = match answer {
            Ok(v) => v,
            Err(Missed::Refused { code, .. })
                if code == "invalid_params" && item.preset.is_some() =>
            {
                differences.push(json!({"kind": "preset_missing", "provider": item.provider,
                    "preset": preset}));
                continue;
            }
            Err(missed) => {
                return Err(Refusal::FetchUnavailable {
                    provider: item.provider.clone(),
                    why: format!("its declaration: {}", missed.why()),
                })
            }
        };
        let declaration: Declaration =
            serde_json::from_value(declared).map_err(|e| Refusal::FetchUnavailable {
                provider: item.provider.clone(),
                why: format!("its declaration does not decode: {e}"),
            })?;
        if let Some((_, p)) = declaration.check().into_iter().next() {
            return Err(Refusal::FetchUnavailable {
                provider: item.provider.clone(),
                why: format!("its declaration is malformed: {}", p.name()),
            });
        }
        for sub in &item.subscriptions {
            if let Err(p) = declaration.bound(sub) {
                match p.clone().stale_difference(
                    &item.provider,
                    &preset,
                    sub.hook.clone(),
                    sub.phase.clone(),
                ) {
                    Some(d) => differences.push(serde_json::to_value(d).unwrap_or(Value::Null)),
                    None => {
                        return Err(malformed(format!(
                            "a subscription of `{}`: {}",
                            item.provider,
                            p.name()
                        )))
                    }
                }
            }
        }
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(Refusal::PlanStale { differences })
    }
}

#[cfg(test)]
#[path = "pre_user_tests.rs"]
mod tests;

/// Why a `pre_user` hook's answer is not usable (the hook is then unavailable for the call).
#[derive(Debug)]
pub enum Unusable {
    /// The answer does not decode.
    Decode(serde_json::Error),
    /// The answer is not one the plan allows (the role's problem name).
    NotAllowed(&'static str),
    /// An operation does not apply to the blocks (the role's problem name).
    Ops(&'static str),
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Decode(e) => write!(f, "its answer does not decode: {e}"),
            Unusable::NotAllowed(name) => write!(f, "its answer is not allowed: {name}"),
            Unusable::Ops(name) => write!(f, "its operations: {name}"),
        }
    }
}

impl std::error::Error for Unusable {}
