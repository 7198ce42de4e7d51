//! The compaction-runner/v1 ops (cortexkit-role-compaction W5.4 to W5.6) a session's
//! compaction provider calls on a route it opened to broca, bound to the session: its
//! transcript in the neutral part model (`session.entries`), a new view (`session.apply_view`:
//! checked against the transcript as a reader sees it, then recorded durably by the session's
//! actor before `accepted` is answered), and the view the session applies
//! (`session.applied_view`). Only the module the session's plan names as its provider is
//! answered; anyone else, and a session with no provider, is refused `unknown_session`.

use std::sync::Arc;

use broca_ck::provided;
use broca_session::SessionCommand;
use broca_wal::SessionTriple;
use broca_wire::Caller;
use cortexkit_role_compaction::ops;
use cortexkit_role_compaction::view::{ApplyViewAnswer, ApplyViewRequest, View, ViewRefusal};
use cortexkit_role_compaction::wire::{self, Refusal};
use serde_json::{json, Value};

use crate::reads::with_session;
use crate::Host;

impl Host {
    /// One request (`{method, params}`) on a compaction-runner route bound to session `t`:
    /// the op's answer object, or its refusal.
    pub async fn compaction_call(
        self: &Arc<Self>,
        t: SessionTriple,
        caller: &Caller,
        body: &[u8],
    ) -> Result<Value, Refusal> {
        let (method, params) = wire::decode(body)?;
        match method.as_str() {
            ops::SESSION_ENTRIES => entries(self, t, caller, params).await,
            ops::SESSION_APPLIED_VIEW => applied(self, t, caller).await,
            ops::SESSION_APPLY_VIEW => {
                let request: ApplyViewRequest = wire::params(params)?;
                apply(self, t, caller, request.view).await
            }
            other => Err(Refusal::unknown_method(other)),
        }
    }
}

/// Runs `f` over the session as a reader, once its provider is known to be the caller.
async fn as_provider<R: Send + 'static>(
    ctx: &Host,
    t: &SessionTriple,
    caller: &Caller,
    f: impl FnOnce(&broca_read::ReadSession) -> R + Send + 'static,
) -> Result<R, Refusal> {
    let principal = caller.principal.clone();
    let answer = with_session(ctx, t, move |read| {
        let read = read?;
        let provider = provided::provider_of(&read.session)?;
        provided::is_module(principal.as_deref(), &provider).then(|| f(read))
    })
    .await
    .map_err(|e| rpc_refusal(&e))?;
    answer.ok_or_else(|| {
        Refusal::new(
            wire::codes::UNKNOWN_SESSION,
            "this session names no compaction provider of the caller's",
            None,
        )
    })
}

async fn entries(
    ctx: &Host,
    t: SessionTriple,
    caller: &Caller,
    params: Value,
) -> Result<Value, Refusal> {
    let page = as_provider(ctx, &t, caller, move |read| {
        let applied = read.session.view.as_ref().map(|v| v.applied());
        read.numbered(|numbered| broca_ck::neutral::read(numbered, params, applied))
    })
    .await??;
    Ok(serde_json::to_value(page).expect("a page serializes"))
}

async fn applied(ctx: &Host, t: SessionTriple, caller: &Caller) -> Result<Value, Refusal> {
    let view = as_provider(ctx, &t, caller, |read| read.session.view.clone()).await?;
    Ok(match view {
        Some(v) => json!({ "view": &*v }),
        None => json!({}),
    })
}

/// `session.apply_view`: checked against the transcript as the session's WAL holds it now,
/// then handed to the actor, which records it durably unless a newer view got there first.
async fn apply(
    ctx: &Host,
    t: SessionTriple,
    caller: &Caller,
    view: View,
) -> Result<Value, Refusal> {
    let checked = Arc::new(view);
    let view = checked.clone();
    let (provider, verdict) = as_provider(ctx, &t, caller, move |read| {
        let rules = provided::session_rules(&read.session);
        let previous = read.session.view.as_deref();
        let verdict = read
            .numbered(|numbered| provided::check(numbered, previous, &view, &rules))
            .map(|_| ());
        (
            provided::provider_of(&read.session).unwrap_or_default(),
            verdict,
        )
    })
    .await?;
    let answer = match verdict {
        Err(refusal) => refused(refusal),
        Ok(()) => {
            let asked = crate::replies::ask(ctx, t, |reply| SessionCommand::ApplyView {
                provider,
                view: checked,
                reply,
            })
            .await
            .and_then(|answer| answer)
            .map_err(|e| rpc_refusal(&e))?;
            match asked {
                Ok(()) => ApplyViewAnswer::Accepted,
                Err(refusal) => refused(refusal),
            }
        }
    };
    Ok(serde_json::to_value(answer).expect("an answer serializes"))
}

fn refused(refusal: ViewRefusal) -> ApplyViewAnswer {
    ApplyViewAnswer::Refused { refusal }
}

/// broca's own error (the WAL unreadable, the session's shard unavailable) as the role's
/// refusal, under broca's code.
fn rpc_refusal(e: &broca_wire::RpcError) -> Refusal {
    Refusal::new(e.code.as_str(), e.message.clone(), None)
}
