//! Mid-session changes (llm-runner/v1 §10.2 `session_change`, declared with `plans`):
//! `session.refresh` (its plan read, the session asked what it comes to, the plan's items
//! fetched exactly as admission fetches them, then accepted by the session, durable before
//! the answer), `session.refresh_policy` and `session.flush_prefix`. A refusal writes
//! nothing.

use broca_fetch_plan::plan::Plan;
use broca_session::{RefreshStep, SessionCommand};
use broca_wal::SessionTriple;
use broca_wire::{Caller, Code, RpcError};
use cortexkit_role_llm_runner::session_change::{RefreshPolicyRequest, RefreshRequest};
use serde_json::Value;

use crate::replies::ask;
use crate::Host;

fn undeclared() -> RpcError {
    RpcError::new(
        Code::UnknownMethod,
        "this runner does not declare session_change (its config's `plans` is off)",
    )
}

/// `session.refresh`.
pub(crate) async fn refresh(
    ctx: &Host,
    t: SessionTriple,
    request: Box<RefreshRequest>,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(undeclared());
    }
    let raw = Value::Object(request.plan.clone());
    crate::plans::plan_served(ctx, &raw)?;
    let plan = Plan::read(&raw).map_err(|r| RpcError::refusal(&r))?;
    let identity = plan.identity.clone();
    let ask_with = |frozen| {
        let (request, identity, caller) = (request.clone(), identity.clone(), caller.clone());
        move |reply| SessionCommand::Refresh {
            request,
            identity,
            plan: frozen,
            caller,
            reply,
        }
    };
    let counted = |e: RpcError| {
        REFRESHES.add(e.code.as_str());
        e
    };
    match ask(ctx, t.clone(), ask_with(None))
        .await?
        .map_err(counted)?
    {
        RefreshStep::Answer(answer) => {
            REFRESHES.add("repeat");
            return Ok(answer);
        }
        RefreshStep::Fetch => {}
    }
    let frozen = crate::plans::admit(ctx, &t, &plan)
        .await
        .map_err(|r| counted(RpcError::refusal(&r)))?;
    match ask(ctx, t.clone(), ask_with(Some(Box::new(frozen))))
        .await?
        .map_err(counted)?
    {
        RefreshStep::Answer(answer) => {
            REFRESHES.add("accepted");
            tracing::info!(
                project_root = %t.project_root,
                harness = %t.harness,
                session = %t.session,
                generation = request.generation,
                policy = %request.policy,
                identity = %identity,
                "session refresh accepted"
            );
            Ok(answer)
        }
        RefreshStep::Fetch => Err(crate::replies::unavailable()),
    }
}

/// Refreshes by outcome: `accepted`, `repeat`, or the refusal's code
/// (`broca_session_refreshes_total`).
static REFRESHES: crate::tally::Tally = crate::tally::Tally::new();

/// The refreshes by outcome, as `health.check`'s metrics carry them.
pub(crate) fn tally_json() -> serde_json::Value {
    REFRESHES.json()
}

/// The refreshes' family, in the Prometheus text format.
pub(crate) fn exposition() -> String {
    REFRESHES.render(
        "broca_session_refreshes_total",
        "Mid-session plan changes (session.refresh) by outcome: accepted, repeat (an identical repeat answered again), or the refusal's code.",
        "outcome",
    )
}

/// `session.refresh_policy`.
pub(crate) async fn refresh_policy(
    ctx: &Host,
    t: SessionTriple,
    request: Box<RefreshPolicyRequest>,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(undeclared());
    }
    let caller = caller.clone();
    ask(ctx, t, |reply| SessionCommand::RefreshPolicy {
        request,
        caller,
        reply,
    })
    .await?
}

/// `session.flush_prefix`.
pub(crate) async fn flush_prefix(
    ctx: &Host,
    t: SessionTriple,
    send_id: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(undeclared());
    }
    let caller = caller.clone();
    ask(ctx, t, |reply| SessionCommand::FlushPrefix {
        send_id,
        caller,
        reply,
    })
    .await?
}
