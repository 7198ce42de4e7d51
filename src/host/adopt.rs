//! A session its host starts, and its adoption (llm-runner/v1 §9.5 `adopt`, declared with
//! `plans`): `session.host_start {plan}` (the host's own surface, a person's app: the plan
//! read, the session asked what it comes to, the plan's items fetched exactly as admission
//! fetches them, then recorded, durable before the answer) and `session.adopt` (the plan's
//! identity compared with the one applied; the adopter recorded as the owner, durable
//! before the answer). A refusal writes nothing.

use broca_core::adopt::HostStart;
use broca_fetch_plan::plan::Plan;
use broca_session::SessionCommand;
use broca_wal::SessionTriple;
use broca_wire::{Caller, Code, Method, RpcError};
use cortexkit_role_llm_runner::adopt::AdoptRequest;
use serde_json::{Map, Value};

use crate::replies::ask;
use crate::Host;

fn undeclared(method: &str) -> RpcError {
    RpcError::new(
        Code::UnknownMethod,
        format!("this runner does not declare adopt, so it serves no {method} (its config's `plans` is off)"),
    )
}

/// A plan as a request carried it: read and checked as admission reads one.
fn read(plan: Map<String, Value>) -> Result<Plan, RpcError> {
    Plan::read(&Value::Object(plan)).map_err(|r| RpcError::refusal(&r))
}

/// `session.host_start`.
pub(crate) async fn host_start(
    ctx: &Host,
    t: SessionTriple,
    plan: Map<String, Value>,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(undeclared(Method::SessionHostStart.as_str()));
    }
    crate::plans::plan_served(ctx, &Value::Object(plan.clone()))?;
    let plan = read(plan)?;
    let identity = plan.identity.clone();
    let ask_with = |frozen| {
        let (identity, caller) = (identity.clone(), caller.clone());
        move |reply| SessionCommand::HostStart {
            identity,
            plan: frozen,
            caller,
            reply,
        }
    };
    if let HostStart::Answer(answer) = ask(ctx, t.clone(), ask_with(None)).await?? {
        return Ok(answer);
    }
    let frozen = crate::plans::admit(ctx, &t, &plan)
        .await
        .map_err(|r| RpcError::refusal(&r))?;
    match ask(ctx, t.clone(), ask_with(Some(Box::new(frozen)))).await?? {
        HostStart::Answer(answer) => {
            tracing::info!(
                project_root = %t.project_root,
                harness = %t.harness,
                session = %t.session,
                identity = %identity,
                "session started by its host"
            );
            Ok(answer)
        }
        HostStart::Fetch => Err(crate::replies::unavailable()),
    }
}

/// `session.adopt`.
pub(crate) async fn adopt(
    ctx: &Host,
    t: SessionTriple,
    request: Box<AdoptRequest>,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(undeclared(Method::SessionAdopt.as_str()));
    }
    let identity = read(request.plan.clone())?.identity;
    let (caller, required) = (caller.clone(), ctx.policy_required);
    let answer = ask(ctx, t.clone(), move |reply| SessionCommand::Adopt {
        request,
        identity,
        required,
        caller,
        reply,
    })
    .await??;
    tracing::info!(
        project_root = %t.project_root,
        harness = %t.harness,
        session = %t.session,
        "session adopted"
    );
    Ok(answer)
}
