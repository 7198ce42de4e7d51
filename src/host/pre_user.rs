//! A person's message through the plan's `pre_user` hooks before the session's actor writes
//! it (step-transform-provider/v2; cortexkit-role-compaction A10): each subscribed provider,
//! in plan order, is asked on the session's own route within its frozen budget, and its
//! operations are applied to the text the next one sees. An unusable answer under `pass`
//! leaves the text as it stood and says so in the attribution record; under `refuse` the
//! send is refused `pre_user_unavailable` and nothing is written. The record that holds the
//! message carries the attribution: a replay reads it and never asks again.

use std::time::Duration;

use broca_core::admission::Prepared;
use broca_fetch_plan::pre_user::Hooks;
use broca_wal::SessionTriple;
use broca_wire::{Refusal, RpcError};
use serde_json::Value;

use crate::Host;

/// Runs `p`'s hooks: sets its prompt to what they made of it and its attribution record.
pub(crate) async fn run(ctx: &Host, t: &SessionTriple, p: &mut Prepared) -> Result<(), RpcError> {
    let Some(modules) = ctx.module_tools.as_ref().filter(|_| ctx.runs_pre_user()) else {
        return Ok(());
    };
    // A template send's text is made when it goes out; a send with no text has nothing for a
    // hook to act on.
    if p.prompt.is_empty() || p.order.as_ref().is_some_and(|o| o.template.is_some()) {
        return Ok(());
    }
    let Some(hooks) = hooks_of(ctx, t, p).await? else {
        return Ok(());
    };
    let mut blocks = vec![std::mem::take(&mut p.prompt)];
    let at_ms = broca_session::now_unix_ms();
    for call in hooks.calls() {
        let body = call.body(&blocks, p.delivery.as_deref(), at_ms);
        let budget = Duration::from_millis(call.budget_ms);
        let applied = match modules
            .step_transform_op(t, &call.provider, body, budget)
            .await
        {
            Ok(answer) => call.apply(&blocks, &answer).map_err(|e| e.to_string()),
            Err(miss) => Err(miss.to_string()),
        };
        match applied {
            Ok((now, record)) => {
                blocks = now;
                p.pre_user.push(record);
            }
            Err(why) if call.refuse => {
                return Err(RpcError::refusal(&Refusal::PreUserUnavailable {
                    provider: call.provider,
                    why,
                }))
            }
            Err(why) => {
                tracing::warn!(
                    project_root = %t.project_root,
                    harness = %t.harness,
                    session = %t.session,
                    provider = %call.provider,
                    "pre_user hook passed over: {why}"
                );
                p.pre_user.push(call.passed_over(&why));
            }
        }
    }
    p.prompt = blocks.into_iter().next().unwrap_or_default();
    Ok(())
}

/// The hooks of the plan `p` runs under: the one its send just admitted, or the session's
/// frozen one. None when it subscribes none, or when `p`'s send_id is already durable (its
/// record holds what the hooks did; it is never asked again).
async fn hooks_of(ctx: &Host, t: &SessionTriple, p: &Prepared) -> Result<Option<Hooks>, RpcError> {
    if let Some(sent) = p.plan.as_ref().filter(|s| s.admitted.is_some()) {
        return Ok((!sent.plan.steps.is_empty()).then(|| sent.plan.steps.clone()));
    }
    let principal = p.caller.principal.clone();
    let send_id = p.send_id.clone();
    let frozen = crate::reads::with_session(ctx, t, move |read| {
        let s = &read?.session;
        let known = send_id
            .as_deref()
            .is_some_and(|id| s.lookup_send(principal.as_deref(), id).is_some());
        if known {
            return None;
        }
        s.plan.as_ref().map(|f| f.plan.clone())
    })
    .await?;
    let Some(text) = frozen else {
        return Ok(None);
    };
    let hooks = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(plan)) => broca_fetch_plan::pre_user::read(&plan).unwrap_or_default(),
        _ => Hooks::default(),
    };
    Ok((!hooks.is_empty()).then_some(hooks))
}
