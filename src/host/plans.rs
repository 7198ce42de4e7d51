//! A send's fetch plan fetched before its session admits it (llm-runner/v1 `plans`, §10.1):
//! at a session's first send, each provider the plan names is asked its `tool.catalog` over
//! the daemon (module mode), every one at once under one deadline, and the answers are
//! checked into the plan the session freezes. A refusal here writes nothing. A session that
//! froze a plan, or began without one, fetches nothing: its actor compares the plan.

use std::time::Duration;

use broca_core::admission::Prepared;
use broca_core::plan::{Arrived, Missed};
use broca_subc::toolprov::PlanMiss;
use broca_wal::SessionTriple;
use broca_wire::RpcError;

use crate::Host;

/// How long admission waits for a plan's items, all of them together.
pub(crate) const FETCH_DEADLINE: Duration = Duration::from_secs(10);

/// Fetches `p`'s plan when its session has none yet, setting what the fetch froze; the
/// admission refusal (`system_text_preset_required`, `fetch_unavailable`, `plan_stale`,
/// `tool_name_collision`) otherwise.
pub(crate) async fn fetch(ctx: &Host, t: &SessionTriple, p: &mut Prepared) -> Result<(), RpcError> {
    let Some(sent) = p.plan.as_mut() else {
        return Ok(());
    };
    let settled = crate::reads::with_session(ctx, t, |read| {
        read.is_some_and(|r| {
            let s = &r.session;
            s.plan.is_some() || !s.runs.is_empty() || !s.queued.is_empty()
        })
    })
    .await?;
    if settled {
        return Ok(());
    }
    if let Some(modules) = &ctx.module_tools {
        for provider in sent.plan.preset_less_texts() {
            let serves = modules
                .provides(
                    provider,
                    cortexkit_role_llm_runner::SYSTEM_TEXT_DEFAULT_PROVIDER_CAPABILITY,
                )
                .await;
            if !serves {
                return Err(RpcError::refusal(
                    &broca_wire::Refusal::SystemTextPresetRequired {
                        provider: provider.to_string(),
                    },
                ));
            }
        }
    }
    let asks: Vec<_> = sent
        .plan
        .fetches()
        .iter()
        .map(|f| (f.provider.clone(), sent.plan.request(f)))
        .collect();
    let answers = match (&ctx.module_tools, asks.is_empty()) {
        (_, true) => Vec::new(),
        (Some(modules), false) => modules
            .plan_catalogs((&t.harness, &t.session), &asks, FETCH_DEADLINE)
            .await
            .into_iter()
            .map(|a| {
                a.map(|(answer, specs)| Arrived { answer, specs })
                    .map_err(missed)
            })
            .collect(),
        (None, false) => asks
            .iter()
            .map(|_| {
                Err(Missed::Unavailable(
                    "broca runs standalone: no daemon's tool modules to fetch from".into(),
                ))
            })
            .collect(),
    };
    for (provider, _) in &asks {
        tracing::debug!(provider = %provider, "plan item fetched");
    }
    let frozen = sent
        .plan
        .admit(answers)
        .map_err(|r| RpcError::refusal(&r))?;
    sent.admitted = Some(Box::new(frozen));
    Ok(())
}

fn missed(m: PlanMiss) -> Missed {
    match m {
        PlanMiss::Timeout => Missed::Timeout,
        PlanMiss::Unavailable(why) => Missed::Unavailable(why),
        PlanMiss::Refused { code, message } => Missed::Refused { code, message },
    }
}
