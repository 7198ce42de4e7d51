//! Sends with an ordered delivery (llm-runner/v1 §9.7 `delivery_order`; a child of
//! `admission`): which wait for a run's boundaries, which may start a run, and the queued
//! sends a `dedupe_key` replaces.

use broca_protocol::delivery::SendOrder;
use broca_wal::runrec::{SendEnded, SendQueued, SendRetracted};
use cortexkit_role_llm_runner::delivery_order::{
    admit, admit_delivery, plan_senders, render, Mode, PlanSender, TemplateProblem,
};
use cortexkit_role_llm_runner::send::Delivery;
use serde_json::{Map, Value};

use super::{Prepared, Refusal, Session};

/// Whether `p`'s list names a mode a run in progress can take (`steer`, `tool_result`).
pub(super) fn joins_a_run(p: &Prepared) -> bool {
    p.order.as_ref().is_some_and(|o| {
        o.modes
            .iter()
            .any(|m| matches!(m, Mode::Steer | Mode::ToolResult))
    })
}

/// Whether a queued send may start a run once none is active: every send but a list
/// without `idle_start`, which waits for a run another send starts.
pub(crate) fn starts_a_run(q: &SendQueued) -> bool {
    q.order.as_ref().is_none_or(|o| o.may_start_a_run())
}

/// The queued, undelivered sends `p` replaces: those of the same sender with the same
/// `dedupe_key` (another sender's, another key's or a delivered one never), each ended
/// `superseded` by `p`'s submission.
pub(super) fn replaced(
    p: &Prepared,
    session: &Session,
    run_id: &str,
    now_unix_ms: u64,
) -> Vec<SendRetracted> {
    let Some(key) = p.order.as_ref().and_then(|o| o.dedupe_key.as_deref()) else {
        return Vec::new();
    };
    let sender = p.caller.principal.as_deref();
    let same = |principal: Option<&str>, order: Option<&broca_protocol::delivery::SendOrder>| {
        principal == sender && order.and_then(|o| o.dedupe_key.as_deref()) == Some(key)
    };
    let by = format!("sub_{run_id}");
    let queued = session
        .queued
        .iter()
        .filter(|q| same(q.principal.as_deref(), q.order.as_ref()))
        .map(|q| q.submission_id.clone());
    // A send waiting for a run's boundary (one the open run holds is let go of first by the
    // session, which keeps it when the run rendered it already).
    let waiting = session
        .pending_steers
        .iter()
        .filter(|w| same(w.record.principal.as_deref(), w.record.order.as_ref()))
        .filter_map(|w| w.record.submission_id.clone());
    queued
        .chain(waiting)
        .map(|submission_id| SendRetracted {
            submission_id,
            at_unix_ms: now_unix_ms,
            ended: Some(SendEnded::Superseded { by: by.clone() }),
        })
        .collect()
}

/// The records that hand the open run the queued sends waiting for one (a list naming
/// `steer` or `tool_result`, queued while no run was open): each a `SendSteered` keeping its
/// submission, or its end when its time passed first. Appended as the run starts, before its
/// first step.
pub fn join_waiting(session: &Session, now_unix_ms: u64) -> Vec<broca_wal::Record> {
    use broca_wal::runrec::SendSteered;
    use broca_wal::Record;
    let Some(open) = &session.open else {
        return Vec::new();
    };
    let run_id = &session.runs[open.index].run_id;
    session
        .queued
        .iter()
        .filter(|q| {
            q.order.as_ref().is_some_and(|o| {
                o.modes
                    .iter()
                    .any(|m| matches!(m, Mode::Steer | Mode::ToolResult))
            })
        })
        .map(|q| {
            let order = q.order.clone();
            if order.as_ref().is_some_and(|o| {
                cortexkit_role_llm_runner::delivery_order::expired(o.expires_at_ms, now_unix_ms)
            }) {
                return Record::SendRetracted(SendRetracted {
                    submission_id: q.submission_id.clone(),
                    at_unix_ms: now_unix_ms,
                    ended: Some(SendEnded::Expired),
                });
            }
            Record::SendSteered(Box::new(SendSteered {
                run_id: run_id.clone(),
                send_id: q.send_id.clone(),
                inputs_digest: q.inputs_digest.clone(),
                prompt: q.prompt.clone(),
                at_unix_ms: q.at_unix_ms,
                principal: q.principal.clone(),
                scope_owner: q.scope_owner.clone(),
                client_message_id: q.client_message_id.clone(),
                media: q.media.clone(),
                retention: None,
                retention_policy: None,
                order,
                submission_id: Some(q.submission_id.clone()),
                pre_user: Vec::new(),
            }))
        })
        .collect()
}

/// The ends of the queued ordered sends whose time passed undelivered, at `now_unix_ms`
/// (a send waiting for a run's boundary ends there instead, by the run).
pub fn expired_queued(session: &Session, now_unix_ms: u64) -> Vec<SendRetracted> {
    session
        .queued
        .iter()
        .filter(|q| {
            q.order.as_ref().is_some_and(|o| {
                cortexkit_role_llm_runner::delivery_order::expired(o.expires_at_ms, now_unix_ms)
            })
        })
        .map(|q| SendRetracted {
            submission_id: q.submission_id.clone(),
            at_unix_ms: now_unix_ms,
            ended: Some(SendEnded::Expired),
        })
        .collect()
}

/// The plan senders that govern admission now (llm-runner/v1 §9.7): the accepted refresh's
/// plan's while one is pending (a refresh replaces them at acceptance), else the frozen
/// plan's; none without a plan.
pub(crate) fn senders(session: &Session) -> Vec<PlanSender> {
    let plan = session
        .change
        .pending(session.plan.as_deref())
        .map(|a| &*a.plan)
        .or(session.plan.as_deref());
    plan.and_then(|p| serde_json::from_str::<Map<String, Value>>(&p.plan).ok())
        .and_then(|m| plan_senders(&m).ok())
        .unwrap_or_default()
}

/// Whether `caller` may send into the session: its owner always; another caller only when
/// the plan names it, matched on its attested principal (never a request field), listing
/// `idle_start` (or the strings `queue` and `steer`, which stand for lists holding it) and
/// sending `interrupt` only as its entry grants.
pub(super) fn sender_admitted(
    caller: &broca_wire::Caller,
    order: Option<&SendOrder>,
    delivery: Option<&str>,
    session: &Session,
) -> Result<(), Refusal> {
    let owners = session.owners();
    // The host's own surface starts the person's turns on a session it started (§9.5).
    if caller.owns(&owners) || session.is_host(caller) {
        return Ok(());
    }
    let (Some(principal), Some(owner)) = (caller.principal.as_deref(), owners.first()) else {
        return Err(Refusal::ScopeOwnerMismatch);
    };
    let senders = senders(session);
    let (principal, owner) = (plan_name(&senders, principal), module_of(owner));
    let checked = match order {
        Some(o) => admit(principal, Some(owner), &senders, &o.modes),
        None => {
            let delivery = match delivery {
                Some(broca_wire::delivery::STEER) => Delivery::Steer,
                Some(broca_wire::delivery::INTERRUPT) => Delivery::Interrupt,
                _ => Delivery::Queue,
            };
            admit_delivery(principal, Some(owner), &senders, delivery)
        }
    };
    checked.map_err(|(code, _)| {
        if code == cortexkit_role_llm_runner::errors::SCOPE_OWNER_MISMATCH {
            Refusal::ScopeOwnerMismatch
        } else {
            Refusal::InvalidField {
                field: "delivery",
                why: format!(
                    "the session's plan does not grant `{principal}` this delivery (starting a \
                     run needs its `idle_start` grant, `interrupt` its `interrupt` grant)"
                ),
            }
        }
    })
}

/// A template send's one text: the plan's template for its sender (the owner's being an
/// entry naming the owner) rendered with the send's slots, each checked here. A `part_tag`
/// slot takes the number the session's next request shows its part with (its compaction
/// provider's view, handed in as `Prepared::shown_parts`); a part not shown, as every part of a
/// session without a provider, is `template_part_gone`.
pub(super) fn render_template(p: &mut Prepared, session: &Session) -> Result<(), Refusal> {
    let Some(use_) = p.order.as_ref().and_then(|o| o.template.clone()) else {
        return Ok(());
    };
    let mut senders = senders(session);
    if session.plan.is_none() {
        if let Some(sent) = &p.plan {
            senders = plan_senders(&sent.plan.value).unwrap_or_default();
        }
    }
    let sender = p
        .caller
        .principal
        .as_deref()
        .or(session.owners().first().copied())
        .map(module_of);
    let templates = senders
        .iter()
        .find(|s| Some(s.module.as_str()) == sender)
        .map(|s| s.templates.as_slice())
        .unwrap_or_default();
    let shown = std::mem::take(&mut p.shown_parts);
    match render(templates, &use_, |r| {
        shown.get(&(r.mid.clone(), r.part.clone())).copied()
    }) {
        Ok(text) => {
            p.prompt = text;
            Ok(())
        }
        Err(TemplateProblem::PartGone(slot)) => Err(Refusal::TemplatePartGone { slot }),
        Err(problem) => Err(Refusal::InvalidField {
            field: "template",
            why: format!(
                "the template cannot render ({problem:?}): the sender's plan entry must declare \
                 it with that digest, and every slot must hold a value of its type"
            ),
        }),
    }
}

/// The module an attested principal names (`reserved:<module>`), as a plan's `senders` name
/// it.
pub(crate) fn module_of(principal: &str) -> &str {
    principal.strip_prefix("reserved:").unwrap_or(principal)
}

/// The name a plan's `senders` give an attested principal: the principal itself where an
/// entry names it whole, else its module (`reserved:<module>`).
pub(crate) fn plan_name<'a>(senders: &[PlanSender], principal: &'a str) -> &'a str {
    if senders.iter().any(|s| s.module == principal) {
        principal
    } else {
        module_of(principal)
    }
}

/// Whether `caller` may put content into the session for its sends: its owner, or a module
/// its plan names as a sender.
pub fn may_send(caller: &broca_wire::Caller, session: &Session) -> bool {
    caller.owns(&session.owners())
        || session.is_host(caller)
        || caller.principal.as_deref().is_some_and(|p| {
            let senders = senders(session);
            let name = plan_name(&senders, p);
            senders.iter().any(|s| s.module == name)
        })
}

/// Whether `caller` may withdraw the submission `submission_id` (`session.retract`): the
/// session's owner; or the attested principal its record names as its sender, for that one
/// submission (llm-runner/v1 `retract_own_send`). A submission recorded without a sender is
/// the owner's alone.
pub fn may_retract(caller: &broca_wire::Caller, session: &Session, submission_id: &str) -> bool {
    if caller.owns(&session.owners()) {
        return true;
    }
    let Some(principal) = caller.principal.as_deref() else {
        return false;
    };
    let queued = session
        .queued
        .iter()
        .find(|q| q.submission_id == submission_id)
        .and_then(|q| q.principal.as_deref());
    let waiting = session
        .pending_steers
        .iter()
        .find(|p| p.record.submission_id.as_deref() == Some(submission_id))
        .and_then(|p| p.record.principal.as_deref());
    // Withdrawn or started already: its sender is answered so (`not_pending`,
    // `already_started`), as the owner is.
    let withdrawn = session
        .retracted
        .values()
        .find(|(q, _)| q.submission_id == submission_id)
        .and_then(|(q, _)| q.principal.as_deref());
    let started = session
        .runs
        .iter()
        .find(|r| r.submission_id.as_deref() == Some(submission_id))
        .and_then(|r| r.principal.as_deref());
    queued.or(waiting).or(withdrawn).or(started) == Some(principal)
}

/// Whether `caller` may cancel the session's run (`run.cancel`; `now`: at `now`, not at a
/// step boundary): the session's owner; or, at `now` only, a sender its current plan grants
/// `interrupt` (llm-runner/v1 `run_cancel_by_interrupt`).
pub fn may_cancel(caller: &broca_wire::Caller, session: &Session, now: bool) -> bool {
    let owners = session.owners();
    if caller.owns(&owners) {
        return true;
    }
    let (Some(principal), Some(owner), true) = (caller.principal.as_deref(), owners.first(), now)
    else {
        return false;
    };
    let senders = senders(session);
    let name = plan_name(&senders, principal);
    admit_delivery(name, Some(module_of(owner)), &senders, Delivery::Interrupt).is_ok()
}
