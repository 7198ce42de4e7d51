//! A send's llm-runner/v1 members (a child of `request`): the ones broca takes, moved into
//! broca's own parameters, and the ones it refuses by the role's rules, by name.

use serde_json::{Map, Value};

use super::invalid;
use crate::RpcError;

/// The llm-runner/v1 members of a send that broca takes or refuses by the role's rules,
/// taken out of `params`: `delivery` (a string: `queue`, what an absent one means, `steer`
/// or `interrupt`, kept as broca's `delivery` when not `queue`; an unknown mode or a list is
/// refused `invalid_params`; only a steer or an interrupt may leave out `model`), `stop_when.max_steps` (broca's `max_steps`),
/// `generation.max_output_tokens` (checked here, so a refusal names it); `plan` is kept
/// as sent (the host refuses it unless plans are on, and admission reads it).
pub(super) fn role_send_members(params: &mut Map<String, Value>) -> Result<(), RpcError> {
    if let Some(order) = delivery_order(params)? {
        params.insert("order".into(), order);
    } else if let Some(mode) = delivery(params.remove("delivery"))? {
        params.insert("delivery".into(), Value::String(mode.into()));
    } else if !params.contains_key("model") {
        return Err(invalid("session.send: missing field `model`").with_field("model"));
    }
    route_decision_id(params.get("route_decision_id"))?;
    if params.contains_key("max_input_tokens") {
        return Err(
            invalid("the session's input cap is sent as `budget.max_input_tokens`")
                .with_field("max_input_tokens"),
        );
    }
    // The role's `budget` is closed: of its members broca keeps the session's input cap.
    let input_cap = match params.remove("budget") {
        None => None,
        Some(budget) => role_budget(budget)?,
    };
    let run_budget = stop_when(params)?;
    if !run_budget.is_empty() {
        params.insert("budget".into(), Value::Object(run_budget));
    }
    if let Some(cap) = input_cap {
        params.insert("max_input_tokens".into(), cap.into());
    }
    retention_policy(params)?;
    generation(params.get("generation"))?;
    client_message_id(params.get("client_message_id"))?;
    directives(params.get("directives"))?;
    structured_output(params.get("structured_output"))?;
    Ok(())
}

/// `structured_output`: `{mode, schema, name?}`, strict; each refusal names the member's
/// path as llm-runner/v1 §9.4 spells it. What depends on the run (its tools, whether the
/// schema compiles) is admission's.
fn structured_output(given: Option<&Value>) -> Result<(), RpcError> {
    use cortexkit_role_llm_runner::structured_output::{
        check_schema, name_well_formed, StructuredOutput, MAX_SCHEMA_JCS_BYTES,
    };
    let Some(given) = given else {
        return Ok(());
    };
    let refuse = |field: String, why: String| Err(invalid(why).with_field(field));
    let Some(members) = given.as_object() else {
        return refuse(
            "structured_output".into(),
            format!("`structured_output` must be an object {{mode, schema, name?}}, not {given}"),
        );
    };
    if let Some(unknown) = members
        .keys()
        .find(|k| !matches!(k.as_str(), "mode" | "schema" | "name"))
    {
        return refuse(
            format!("structured_output.{unknown}"),
            format!("`structured_output` has no member `{unknown}` (it takes mode, schema, name)"),
        );
    }
    if !matches!(
        members.get("mode").and_then(Value::as_str),
        Some("final_text" | "submit_tool")
    ) {
        return refuse(
            "structured_output.mode".into(),
            "`structured_output.mode` must be `final_text` or `submit_tool`".into(),
        );
    }
    if let Some(name) = members.get("name") {
        if !name.as_str().is_some_and(name_well_formed) {
            return refuse(
                "structured_output.name".into(),
                "`structured_output.name` must be 1 to 48 of [a-z0-9_]".into(),
            );
        }
    }
    let schema_refused = |why: String| refuse("structured_output.schema".into(), why);
    let Some(schema) = members.get("schema").filter(|s| s.is_object()) else {
        return schema_refused("`structured_output.schema` must be a JSON Schema object".into());
    };
    if let Err(problem) = check_schema(schema) {
        return schema_refused(format!(
            "`structured_output.schema` is refused: {problem:?} (no reference outside the \
             document, and `$schema`, when given, is draft 2020-12)"
        ));
    }
    let so: StructuredOutput = match serde_json::from_value(given.clone()) {
        Ok(so) => so,
        Err(e) => {
            return refuse(
                "structured_output".into(),
                format!("structured_output: {e}"),
            )
        }
    };
    match so.schema_jcs() {
        Ok(jcs) if jcs.len() <= MAX_SCHEMA_JCS_BYTES => Ok(()),
        Ok(jcs) => schema_refused(format!(
            "`structured_output.schema` has {} bytes in canonical form; the limit is \
             {MAX_SCHEMA_JCS_BYTES}",
            jcs.len()
        )),
        Err(_) => schema_refused("`structured_output.schema` has no canonical form".into()),
    }
}

/// `directives`: a list of distinct directive names the role defines (`wake`).
fn directives(given: Option<&Value>) -> Result<(), RpcError> {
    let Some(given) = given else {
        return Ok(());
    };
    let names: Option<Vec<cortexkit_role_llm_runner::directives::DirectiveName>> =
        serde_json::from_value(given.clone()).ok();
    match names {
        Some(names)
            if !names
                .iter()
                .enumerate()
                .any(|(i, n)| names[..i].contains(n)) =>
        {
            Ok(())
        }
        _ => Err(invalid(format!(
            "`directives` must be a list of distinct directive names (known: wake), not {given}"
        ))
        .with_field("directives")),
    }
}

/// `client_message_id`: 1 to 64 of `[A-Za-z0-9_-]` (llm-runner/v1 §9.11).
fn client_message_id(given: Option<&Value>) -> Result<(), RpcError> {
    match given {
        None => Ok(()),
        Some(Value::String(id))
            if cortexkit_role_llm_runner::display::client_message_id_valid(id) =>
        {
            Ok(())
        }
        Some(other) => Err(invalid(format!(
            "`client_message_id` must be 1 to 64 of [A-Za-z0-9_-], not {other}"
        ))
        .with_field("client_message_id")),
    }
}

/// `delivery` as a list (llm-runner/v1 §9.7), with the members that ride beside it taken out
/// of `params`: broca's `order`; `None` for a string or absent `delivery` (which then carries
/// none of the list's members). Each refusal names the member it is about: `delivery` for a
/// list that is empty, names a mode twice or an unknown mode; `template` for a template send
/// with a `prompt` or a send with neither.
fn delivery_order(params: &mut Map<String, Value>) -> Result<Option<Value>, RpcError> {
    use cortexkit_role_llm_runner::delivery_order::{DeliveryOrder, Mode, MEMBERS, TEMPLATE_FIELD};
    let Some(Value::Array(list)) = params.get("delivery") else {
        if let Some(member) = MEMBERS.iter().find(|m| params.contains_key(**m)) {
            return Err(invalid(format!(
                "`{member}` rides only beside a list of delivery modes in `delivery`"
            ))
            .with_field(*member));
        }
        return Ok(None);
    };
    let modes: Vec<Mode> = serde_json::from_value(Value::Array(list.clone())).map_err(|_| {
        invalid("a delivery list holds only tool_result, turn_system, steer and idle_start")
            .with_field("delivery")
    })?;
    params.remove("delivery");
    let order = DeliveryOrder::decode(Some(&modes), params)
        .map_err(|member| invalid(format!("`{member}` is malformed")).with_field(member))?;
    let order = order.expect("a list decodes to an order");
    let prompt = params.get("prompt").and_then(Value::as_str);
    let ok = match &order.template {
        Some(_) => prompt.is_none(),
        None => prompt.is_some_and(|p| !p.is_empty()),
    };
    if !ok {
        return Err(invalid(
            "a send carries either a non-empty `prompt` or a plan `template`, never both",
        )
        .with_field(TEMPLATE_FIELD));
    }
    for member in MEMBERS {
        params.remove(*member);
    }
    if order.template.is_some() {
        // The text is the template's rendering, which admission makes.
        params.insert("prompt".into(), Value::String(String::new()));
    }
    let order = broca_protocol::delivery::SendOrder {
        modes: order.modes,
        dedupe_key: order.dedupe_key,
        expires_at_ms: order.expires_at_ms,
        template: order.template,
    };
    if let Some(why) = order.list_problem() {
        return Err(invalid(why).with_field("delivery"));
    }
    Ok(Some(
        serde_json::to_value(order).expect("an order serializes"),
    ))
}

/// `delivery`: a string: `queue` (what an absent one means: `None`), `steer` or
/// `interrupt`; an unknown mode is refused naming `delivery`.
fn delivery(given: Option<Value>) -> Result<Option<&'static str>, RpcError> {
    use crate::send::delivery::{INTERRUPT, STEER};
    match given {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(mode)) => match mode.as_str() {
            "queue" => Ok(None),
            STEER => Ok(Some(STEER)),
            INTERRUPT => Ok(Some(INTERRUPT)),
            _ => Err(invalid(format!(
                "`delivery` must be queue, steer or interrupt, not {mode:?}"
            ))
            .with_field("delivery")),
        },
        Some(other) => Err(invalid(format!(
            "`delivery` must be queue, steer or interrupt, not {other}"
        ))
        .with_field("delivery")),
    }
}

/// `route_decision_id`: a non-empty string of at most 256 bytes when present.
fn route_decision_id(given: Option<&Value>) -> Result<(), RpcError> {
    match given {
        None => Ok(()),
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 256 => Ok(()),
        Some(other) => Err(invalid(format!(
            "`route_decision_id` must be a string of 1 to 256 bytes, not {other}"
        ))
        .with_field("route_decision_id")),
    }
}

/// `stop_when`: `max_steps` (broca's `max_steps`, moved into `params`), and the run's token
/// and cost budgets, answered as broca's `budget`.
fn stop_when(params: &mut Map<String, Value>) -> Result<Map<String, Value>, RpcError> {
    // `stop_when.max_steps` is the role's spelling of broca's `max_steps`; the run's token
    // and cost budgets are broca's own stop conditions beside it.
    let mut run_budget = Map::new();
    match params.remove("stop_when") {
        None => {}
        Some(Value::Object(mut stop)) => {
            let steps = stop.remove("max_steps");
            for name in ["max_total_tokens", "max_cost_micros"] {
                match stop.remove(name) {
                    None => {}
                    Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {
                        run_budget.insert(name.into(), Value::Number(n));
                    }
                    Some(other) => {
                        return Err(invalid(format!(
                            "`stop_when.{name}` must be a positive integer, not {other}"
                        ))
                        .with_field(format!("stop_when.{name}")))
                    }
                }
            }
            if let Some(other) = stop.keys().next() {
                return Err(invalid(format!(
                    "`stop_when.{other}` is not a stop condition broca takes"
                ))
                .with_field(format!("stop_when.{other}")));
            }
            match steps {
                None => {}
                Some(Value::Number(n))
                    if n.as_u64().is_some_and(|n| n > 0 && n <= u32::MAX as u64) =>
                {
                    if params.contains_key("max_steps") {
                        return Err(invalid(
                            "`max_steps` and `stop_when.max_steps` name the same limit: send one",
                        )
                        .with_field("stop_when.max_steps"));
                    }
                    params.insert("max_steps".into(), Value::Number(n));
                }
                Some(other) => {
                    return Err(invalid(format!(
                        "`stop_when.max_steps` must be a positive integer, not {other}"
                    ))
                    .with_field("stop_when.max_steps"))
                }
            }
        }
        Some(other) => {
            return Err(
                invalid(format!("`stop_when` must be an object, not {other}"))
                    .with_field("stop_when"),
            )
        }
    }
    Ok(run_budget)
}

/// `generation.max_output_tokens`, checked here so that a refusal names it.
fn generation(given: Option<&Value>) -> Result<(), RpcError> {
    match given {
        None => {}
        Some(Value::Object(g)) => match g.get("max_output_tokens") {
            None => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {}
            Some(other) => {
                return Err(invalid(format!(
                    "`generation.max_output_tokens` must be a positive integer, not {other}"
                ))
                .with_field("generation.max_output_tokens"))
            }
        },
        Some(other) => {
            return Err(
                invalid(format!("`generation` must be an object, not {other}"))
                    .with_field("generation"),
            )
        }
    }
    Ok(())
}

/// The refusal of a send carrying `plan` on a runner that does not declare `plans`: its
/// field is `plan`, or the member a runner without output references names.
pub fn plan_not_admitted(plan: &Value) -> RpcError {
    let output_refs = plan
        .get("tool_items")
        .and_then(Value::as_array)
        .is_some_and(|items| items.iter().any(|i| i.get("output_refs").is_some()));
    let field = if output_refs {
        "plan.tool_items[].output_refs"
    } else {
        "plan"
    };
    invalid(format!(
        "this runner admits no fetch plan (`{field}`; `\"plans\": true` in the config turns \
         them on); a send names its tools in `tools`"
    ))
    .with_field(field)
}

/// The role's `budget` of a send: a closed object whose members are `nudges`,
/// `finalize_at_tool_calls`, `finalize_text` and `max_input_tokens` (each `nudges[]` element
/// `at_tool_calls` and `text`); an unknown member is refused by its full path. broca keeps
/// the session's input cap (a u64 of at least 1, answered here); it nudges and finalizes
/// nothing, so those members are refused by name rather than ignored. broca's own run
/// budgets moved to `stop_when`, and a refusal says so.
fn role_budget(budget: Value) -> Result<Option<u64>, RpcError> {
    let Value::Object(budget) = budget else {
        return Err(
            invalid(format!("`budget` must be an object, not {budget}")).with_field("budget")
        );
    };
    const MEMBERS: [&str; 4] = [
        "nudges",
        "finalize_at_tool_calls",
        "finalize_text",
        "max_input_tokens",
    ];
    for key in budget.keys() {
        if !MEMBERS.contains(&key.as_str()) {
            let why = match key.as_str() {
                "max_total_tokens" | "max_cost_micros" => {
                    format!("a run's `{key}` is a stop condition: send it as `stop_when.{key}`")
                }
                _ => format!(
                    "`budget.{}` is not a budget member (known: {})",
                    key.escape_debug(),
                    MEMBERS.join(", ")
                ),
            };
            return Err(invalid(why).with_field(format!("budget.{key}")));
        }
    }
    if let Some(nudges) = budget.get("nudges") {
        let Value::Array(list) = nudges else {
            return Err(invalid("`budget.nudges` must be a list").with_field("budget.nudges"));
        };
        for (i, nudge) in list.iter().enumerate() {
            let Value::Object(nudge) = nudge else {
                return Err(invalid(format!("`budget.nudges[{i}]` must be an object"))
                    .with_field(format!("budget.nudges[{i}]")));
            };
            if let Some(k) = nudge
                .keys()
                .find(|k| !["at_tool_calls", "text"].contains(&k.as_str()))
            {
                return Err(invalid(format!(
                    "`budget.nudges[{i}].{}` is not a nudge member (known: at_tool_calls, text)",
                    k.escape_debug()
                ))
                .with_field(format!("budget.nudges[{i}].{k}")));
            }
        }
    }
    for member in ["nudges", "finalize_at_tool_calls", "finalize_text"] {
        if budget.contains_key(member) {
            return Err(invalid(format!(
                "this runner does not serve `budget.{member}`; a send's budget here is its \
                 `max_input_tokens`"
            ))
            .with_field(format!("budget.{member}")));
        }
    }
    match budget.get("max_input_tokens") {
        None => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => Ok(n.as_u64()),
        Some(other) => Err(invalid(format!(
            "`budget.max_input_tokens` must be an integer of at least 1, not {other}"
        ))
        .with_field("budget.max_input_tokens")),
    }
}

/// `retention_policy` (llm-runner/v1 `session_retention`): checked here so a refusal names the
/// member path; never beside `retention`.
fn retention_policy(params: &Map<String, Value>) -> Result<(), RpcError> {
    use crate::{decode_policy, PolicyRefusal};
    let Some(v) = params.get("retention_policy") else {
        return Ok(());
    };
    if params.contains_key("retention") {
        return Err(
            invalid("send either `retention` (seconds) or `retention_policy`, not both")
                .with_field("retention_policy"),
        );
    }
    match decode_policy(v) {
        Ok(_) => Ok(()),
        Err(PolicyRefusal::Field(path)) => {
            Err(invalid(PolicyRefusal::Field(path.clone()).message()).with_field(path))
        }
        Err(PolicyRefusal::Backup) => Err(RpcError::refusal(&crate::Refusal::BackupUnsupported(
            crate::BACKUP_REASON.into(),
        ))),
    }
}

/// The refusal of a send whose `delivery` is a list on a runner that does not serve the
/// `delivery_order` group: `invalid_params` naming `delivery`, as a strict older decode would.
pub fn list_not_admitted() -> RpcError {
    invalid(
        "a list of delivery modes needs the delivery_order group, which this runner does not \
         declare",
    )
    .with_field("delivery")
}
