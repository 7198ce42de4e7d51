//! A send's fetch plan fetched before its session admits it (llm-runner/v1 `plans`, §10.1):
//! at a session's first send, each provider the plan names is asked its `tool.catalog` over
//! the daemon (module mode), every one at once under one deadline, and the answers are
//! checked into the plan the session freezes. A refusal here writes nothing. A session that
//! froze a plan, or began without one, fetches nothing: its actor compares the plan.

use std::time::Duration;

use broca_core::admission::Prepared;
use broca_fetch_plan::plan::{Arrived, Missed, Plan};
use broca_subc::toolprov::PlanMiss;
use broca_wal::planrec::FrozenPlan;
use broca_wal::SessionTriple;
use broca_wire::{Refusal, RpcError};

use crate::Host;

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
    let started = std::time::Instant::now();
    let admitted = admit(ctx, t, &sent.plan).await;
    let outcome = match &admitted {
        Ok(_) => "admitted",
        Err(r) => r.code().as_str(),
    };
    count(outcome, started.elapsed());
    match admitted {
        Ok(frozen) => {
            tracing::info!(
                project_root = %t.project_root,
                harness = %t.harness,
                session = %t.session,
                identity = %frozen.identity,
                providers = sent.plan.fetches().len(),
                tools = frozen.tools.len(),
                absent = frozen.absent_items.len(),
                "fetch plan admitted"
            );
            sent.admitted = Some(Box::new(frozen));
            Ok(())
        }
        Err(r) => {
            tracing::info!(
                project_root = %t.project_root,
                harness = %t.harness,
                session = %t.session,
                code = outcome,
                "fetch plan refused: {}",
                r.message()
            );
            Err(RpcError::refusal(&r))
        }
    }
}

/// The plan `plan` admitted from its providers' answers, or the refusal.
pub(crate) async fn admit(
    ctx: &Host,
    t: &SessionTriple,
    plan: &Plan,
) -> Result<FrozenPlan, Refusal> {
    if let Some(modules) = &ctx.module_tools {
        for provider in plan.preset_less_texts() {
            let serves = modules
                .provides(
                    provider,
                    cortexkit_role_llm_runner::SYSTEM_TEXT_DEFAULT_PROVIDER_CAPABILITY,
                )
                .await;
            if !serves {
                return Err(Refusal::SystemTextPresetRequired {
                    provider: provider.to_string(),
                });
            }
        }
    }
    let asks: Vec<_> = plan
        .fetches()
        .iter()
        .map(|f| (f.provider.clone(), plan.request(f)))
        .collect();
    let answers = match (&ctx.module_tools, asks.is_empty()) {
        (_, true) => Vec::new(),
        (Some(modules), false) => modules
            .plan_catalogs(
                (&t.harness, &t.session),
                &asks,
                ctx.opts.plan_fetch_deadline,
            )
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
    let frozen = plan.admit(answers)?;
    if let (Some(modules), false) = (&ctx.module_tools, plan.steps.is_empty()) {
        let until = std::time::Instant::now() + ctx.opts.plan_fetch_deadline;
        let mut declared = Vec::new();
        for (provider, body) in plan.steps.declares(plan.composition()) {
            let left = until.saturating_duration_since(std::time::Instant::now());
            let answer = modules.step_transform_op(t, &provider, body, left).await;
            declared.push(answer.map_err(|m| match m {
                broca_tools::modules::CompactionMiss::Timeout => Missed::Timeout,
                broca_tools::modules::CompactionMiss::Unreachable(why) => Missed::Unavailable(why),
                broca_tools::modules::CompactionMiss::Refused { code, message } => {
                    Missed::Refused { code, message }
                }
            }));
        }
        broca_fetch_plan::pre_user::check_declarations(&plan.steps, declared)?;
    }
    Ok(frozen)
}

/// Plan admissions by outcome (`admitted` or the refusal's code), and the seconds they took
/// (the fetch included), since the process started: `broca_plan_admissions_total`,
/// `broca_plan_admission_seconds_total`.
static COUNTS: crate::tally::Tally = crate::tally::Tally::new();
static MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count(outcome: &'static str, took: Duration) {
    COUNTS.add(outcome);
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    MICROS.fetch_add(micros, std::sync::atomic::Ordering::Relaxed);
}

/// The plan admissions' families, in the Prometheus text format.
pub(crate) fn exposition() -> String {
    let mut out = COUNTS.render(
        "broca_plan_admissions_total",
        "Fetch plans admitted at a session's first send, or refused, by outcome (admitted, or the refusal's code).",
        "outcome",
    );
    out.push_str(&format!(
        "# HELP broca_plan_admission_seconds_total Time spent admitting fetch plans, their providers' answers awaited included.\n# TYPE broca_plan_admission_seconds_total counter\nbroca_plan_admission_seconds_total {}\n",
        MICROS.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6
    ));
    out
}

fn missed(m: PlanMiss) -> Missed {
    match m {
        PlanMiss::Timeout => Missed::Timeout,
        PlanMiss::Unavailable(why) => Missed::Unavailable(why),
        PlanMiss::Refused { code, message } => Missed::Refused { code, message },
    }
}

/// A plan's `senders` as this runner serves them, checked before the rest of the plan
/// (llm-runner/v1 §9.7): a `succeeds` only where `sender_succession` is declared (with
/// ordered delivery), well formed, naming neither its own module nor another successor's
/// predecessor (`invalid_params` naming `plan.senders[<i>].succeeds`); `senders` only with
/// ordered delivery.
pub(crate) fn plan_served(ctx: &Host, plan: &serde_json::Value) -> Result<(), RpcError> {
    let Some(plan) = plan.as_object() else {
        return Ok(()); // the plan's own check names it
    };
    compaction_served(ctx, plan)?;
    if !ctx.runs_pre_user() && plan.contains_key(broca_fetch_plan::pre_user::MEMBER) {
        return Err(RpcError::refusal(&broca_wire::Refusal::InvalidField {
            field: cortexkit_role_step_transform_provider::errors::runner_codes::PLAN_STEP_TRANSFORM_ITEMS,
            why: "this runner runs no step transforms here (only `broca module` with \
                  `\"compaction_providers\": true` runs the `pre_user` hook)"
                .into(),
        }));
    }
    let declared: &[&str] = if ctx.opts.delivery_order {
        &[cortexkit_role_llm_runner::capabilities::SENDER_SUCCESSION]
    } else {
        &[]
    };
    cortexkit_role_llm_runner::sender_succession::check_plan(plan, declared).map_err(|field| {
        RpcError::refusal(&broca_wire::Refusal::InvalidMember {
            field,
            why: "a plan sender's `succeeds` names one other module, once in the plan, and \
                  needs ordered delivery (`\"delivery_order\": true` in the config)"
                .into(),
        })
    })?;
    if !ctx.opts.delivery_order && plan.contains_key("senders") {
        return Err(RpcError::refusal(&broca_wire::Refusal::InvalidField {
            field: cortexkit_role_llm_runner::delivery_order::PLAN_SENDERS_FIELD,
            why: "a plan's `senders` needs ordered delivery (`\"delivery_order\": true` in the \
                  config)"
                .into(),
        }));
    }
    Ok(())
}

/// A plan naming a compaction provider is admitted only by a runner that hosts one
/// (`compaction_providers`, in module mode): elsewhere `invalid_params {field:
/// "plan.compaction_item"}` before anything is written (llm-runner/v1 §3). A malformed item is
/// left to the plan's own check, which names its member.
fn compaction_served(
    ctx: &Host,
    plan: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), RpcError> {
    let hosted = ctx.runs_pre_user();
    if hosted
        || !plan.contains_key(cortexkit_role_llm_runner::compaction::PLAN_COMPACTION_ITEM)
        || cortexkit_role_llm_runner::compaction::check_plan(plan).is_err()
    {
        return Ok(());
    }
    Err(RpcError::refusal(&broca_wire::Refusal::InvalidField {
        field: "plan.compaction_item",
        why: "this runner hosts no compaction provider (`\"compaction_providers\": true` in the \
              config of `broca module`); its built-in compaction is a send's `compaction`"
            .into(),
    }))
}
