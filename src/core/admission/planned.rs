//! A send's fetch plan at admission (llm-runner/v1 `plans`, docs/plans.md): the plan a
//! send carried, and the config of a send on a planned session (its tools and text the
//! frozen plan's) or of the send that admits a session with its plan.

use broca_wire::Refusal;

use super::Prepared;
use crate::replay::Session;

/// A send's fetch plan: as read, and as admission's fetch froze it (set only when the
/// session had no plan when the host looked).
#[derive(Debug, Clone, PartialEq)]
pub struct SentPlan {
    pub plan: broca_fetch_plan::plan::Plan,
    pub admitted: Option<Box<broca_wal::planrec::FrozenPlan>>,
}

/// A send's config on a planned session, or on the send that admits a session with its
/// plan: the plan's tools and text (llm-runner/v1 `plans`). A plan other than the frozen
/// one, or one sent to a session that began without, is refused `plan_drift`.
pub(super) fn plan(p: &mut Prepared, session: &Session) -> Result<(), Refusal> {
    let named_tools = p.named.contains(&"tools");
    let drift = |frozen: Option<&str>, sent: &broca_fetch_plan::plan::Plan| Refusal::PlanDrift {
        frozen: frozen.map(str::to_string),
        sent: sent.identity.clone(),
    };
    // A change accepted and not applied yet (llm-runner/v1 `session_change`) applies as this
    // send's run starts: a plan that is the effective one or the accepted one is no drift.
    let rebuilt = session
        .runs
        .last()
        .is_some_and(|r| r.config.model != p.config.model);
    if let Some(pending) = session.change.pending(session.plan.as_deref()) {
        let Some(pending) = session.change.due(session.plan.as_deref(), rebuilt) else {
            // Waiting for its rung: the effective plan (or none) stays live; a plan that is
            // the accepted one is no drift.
            let effective = session.plan.as_ref().map(|f| f.identity.as_str());
            if let Some(sent) = p.plan.take() {
                cortexkit_role_llm_runner::session_change::check_send_drift(
                    effective,
                    Some(&pending.plan.identity),
                    &sent.plan.identity,
                )
                .map_err(|_| drift(Some(&pending.plan.identity), &sent.plan))?;
            }
            return match &session.plan {
                Some(frozen) => broca_fetch_plan::plan::apply(&mut p.config, frozen, named_tools),
                None => Ok(()),
            };
        };
        if let Some(sent) = p.plan.take() {
            let effective = session.plan.as_ref().map(|f| f.identity.as_str());
            cortexkit_role_llm_runner::session_change::check_send_drift(
                effective,
                Some(&pending.plan.identity),
                &sent.plan.identity,
            )
            .map_err(|_| drift(Some(&pending.plan.identity), &sent.plan))?;
        }
        broca_fetch_plan::plan::apply(&mut p.config, &pending.plan, named_tools)?;
        p.config.plan = Some(pending.plan.clone());
        return Ok(());
    }
    match (&session.plan, p.plan.take()) {
        (Some(frozen), Some(sent)) if sent.plan.identity != frozen.identity => {
            Err(drift(Some(&frozen.identity), &sent.plan))
        }
        (Some(frozen), _) => broca_fetch_plan::plan::apply(&mut p.config, frozen, named_tools),
        (None, Some(sent)) if !session.runs.is_empty() || !session.queued.is_empty() => {
            Err(drift(None, &sent.plan))
        }
        (None, Some(sent)) => match sent.admitted {
            Some(frozen) => {
                broca_fetch_plan::plan::apply(&mut p.config, &frozen, named_tools)?;
                p.config.plan = Some(frozen);
                Ok(())
            }
            // The host saw the plan frozen when it looked; the session says otherwise.
            None => Err(Refusal::FetchUnavailable {
                provider: String::new(),
                why: "the session's plan changed while this send was admitted".into(),
            }),
        },
        (None, None) => Ok(()),
    }
}
