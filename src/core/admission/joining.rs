//! Sends that join a running run (a child of `admission`): a steer admitted under the
//! settings of the run it joins, every setting it names checked against that run's frozen
//! value (the first that differs refused by name, nothing written), and the turn a steer
//! starts when its run ended before rendering it.

use broca_wal::runrec::{FrozenConfig, RunStarted, SendSteered};

use super::{input_cap, resolved_calls, resolved_mid, Admitted, Prepared, Refusal, Session};

/// Steers waiting for their step boundary, at most, per session.
pub const PENDING_STEERS_MAX: usize = 64;

/// A steer into the open run (the run of index `open`).
pub(super) fn steer(
    p: Prepared,
    media: Vec<broca_protocol::media::Media>,
    session: &Session,
    open: usize,
    now_unix_ms: u64,
) -> Result<Admitted, Refusal> {
    // The session's retention as the steer leaves it (checked by admission), kept with the
    // steer when it named one.
    let retention = p
        .named
        .contains(&"retention")
        .then_some(p.config.retention)
        .flatten();
    let run = &session.runs[open];
    if let Some(field) = p
        .named
        .iter()
        .copied()
        .find(|name| differs(name, &p.config, &run.config))
    {
        return Err(Refusal::InvalidField {
            field,
            why: format!(
                "a steer joins run {} under its settings, and its `{field}` differs from the \
                 run's; leave it out to take the run's, or send with delivery queue or interrupt",
                run.run_id
            ),
        });
    }
    if session.pending_steers.len() >= PENDING_STEERS_MAX {
        return Err(Refusal::SessionBusy {
            run_id: run.run_id.clone(),
        });
    }
    Ok(Admitted::Steered(Box::new(SendSteered {
        run_id: run.run_id.clone(),
        send_id: p.send_id,
        inputs_digest: p.inputs_digest,
        prompt: p.prompt,
        at_unix_ms: now_unix_ms,
        principal: p.caller.principal,
        scope_owner: p.caller.scope_owner,
        client_message_id: p.client_message_id,
        media,
        retention,
        retention_policy: p.config.retention_policy,
        order: p.order,
        submission_id: None,
        pre_user: p.pre_user,
    })))
}

/// Whether the setting `name` a send named resolves to other than what the run froze.
fn differs(name: &str, mine: &FrozenConfig, run: &FrozenConfig) -> bool {
    // The run's own `submit_result` (of its structured output) is not a tool a send names.
    let tools = |c: &FrozenConfig| -> Vec<String> {
        c.tools
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| n != cortexkit_role_llm_runner::structured_output::SUBMIT_RESULT_TOOL)
            .collect()
    };
    match name {
        "model" => (&mine.provider, &mine.model) != (&run.provider, &run.model),
        "system" => mine.system != run.system,
        "tools" => tools(mine) != tools(run),
        "max_steps" => mine.stop.max_steps != run.stop.max_steps,
        "budget" => {
            (mine.stop.max_total_tokens, mine.stop.max_cost_micros)
                != (run.stop.max_total_tokens, run.stop.max_cost_micros)
        }
        "max_input_tokens" => {
            mine.stop.input_cap.map(|c| c.limit) != run.stop.input_cap.map(|c| c.limit)
        }
        "context_limit" => mine.context_limit != run.context_limit,
        "generation" => mine.generation != run.generation,
        "credential_id" => mine.credential_id != run.credential_id,
        "cache_policy" => mine.cache_policy != run.cache_policy,
        "directives" => mine.directives != run.directives,
        "structured_output" => {
            super::frozen_so_key(mine.structured_output.as_ref())
                != super::frozen_so_key(run.structured_output.as_ref())
        }
        "route_decision_id" => mine.route_decision_id != run.route_decision_id,
        "compaction" => mine.compaction != run.compaction,
        _ => false,
    }
}

/// The RunStarted of the first steer a finished run left unrendered (an ordered send's only
/// when its list names `idle_start`): that steer's prompt is
/// the turn, under the settings of the run that accepted it.
pub(super) fn steer_turn(session: &Session, run_id: &str, now_unix_ms: u64) -> Option<RunStarted> {
    // An ordered send starts a turn only when its list names `idle_start`.
    let p = session
        .pending_steers
        .iter()
        .find(|p| p.record.order.as_ref().is_none_or(|o| o.may_start_a_run()))?;
    let accepted_by = &session.runs[p.run];
    let mut config = accepted_by.config.clone();
    config.stop.input_cap = input_cap(session, config.stop.input_cap);
    config.retention = session.retention;
    let r = &p.record;
    Some(RunStarted {
        run_id: run_id.to_string(),
        send_id: r.send_id.clone(),
        inputs_digest: r.inputs_digest.clone(),
        prompt: r.prompt.clone(),
        config,
        resolved_mid: resolved_mid(session),
        resolved_calls: resolved_calls(session),
        at_unix_ms: now_unix_ms,
        principal: r.principal.clone(),
        scope_owner: r.scope_owner.clone(),
        submission_id: None,
        client_message_id: r.client_message_id.clone(),
        delivery: Some(broca_wire::delivery::STEER.into()),
        steer_seq: Some(p.seq),
        media: r.media.clone(),
        order: r.order.clone(),
        // What the hooks did is on the steer's own record.
        pre_user: Vec::new(),
    })
}

/// Fills the settings a steer or an interrupt left out from `frozen`, the session's latest
/// run's (llm-runner/v1 §9: such a send takes every frozen setting it omits): the model,
/// system text, tools (the run's own `submit_result` aside), step limit, budgets, generation,
/// credential, cache policy, directives, structured output and routing decision.
pub fn inherit(req: &mut broca_wire::SendRequest, frozen: &FrozenConfig) {
    use cortexkit_role_llm_runner::structured_output::SUBMIT_RESULT_TOOL;
    if req.model.is_empty() {
        req.model = format!("{}/{}", frozen.provider, frozen.model);
    }
    req.system = req.system.take().or_else(|| frozen.system.clone());
    let demo = frozen
        .catalog
        .as_ref()
        .is_some_and(|e| e.provider.family == broca_protocol::demo::FAMILY);
    if req.tools.is_none() && !demo {
        req.tools = Some(
            frozen
                .tools
                .iter()
                .map(|t| t.name.clone())
                .filter(|n| n != SUBMIT_RESULT_TOOL)
                .collect(),
        );
    }
    req.max_steps = req.max_steps.or(Some(frozen.stop.max_steps));
    if req.budget.is_none()
        && (frozen.stop.max_total_tokens.is_some() || frozen.stop.max_cost_micros.is_some())
    {
        req.budget = Some(broca_wire::Budget {
            max_total_tokens: frozen.stop.max_total_tokens,
            max_cost_micros: frozen.stop.max_cost_micros,
        });
    }
    req.generation = req
        .generation
        .take()
        .or_else(|| Some(frozen.generation.clone()));
    // A keyless model's credential (`none`) is the model's own, not one a send names.
    let named_credential = ["env:", "file:", "vault:"]
        .iter()
        .any(|p| frozen.credential_id.starts_with(p));
    if req.credential_id.is_none() && named_credential {
        req.credential_id = Some(frozen.credential_id.clone());
    }
    req.cache_policy = req.cache_policy.or(Some(frozen.cache_policy));
    if req.directives.is_none() && !frozen.directives.is_empty() {
        req.directives = serde_json::from_value(serde_json::json!(frozen.directives)).ok();
    }
    if req.structured_output.is_none() {
        req.structured_output = frozen.structured_output.as_ref().map(|so| {
            let schema: serde_json::Value =
                serde_json::from_str(&so.schema).unwrap_or(serde_json::Value::Null);
            serde_json::json!({"mode": so.mode, "name": so.name, "schema": schema})
        });
    }
    req.route_decision_id = req
        .route_decision_id
        .take()
        .or_else(|| frozen.route_decision_id.clone());
}
