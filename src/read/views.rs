//! A run as the WAL tells it, turned into the management contract's replies (broca-wire):
//! core owns the views, wire the shapes users read.

use broca_wire::{Cost, ErrorReply, FinalMessage, RunResult, RunStatus, SendAnswer};

use broca_core::replay::{RunState, RunView};

/// The `run.result` reply for `run`.
pub fn run_result(run: &RunView) -> RunResult {
    let (reason, detail) = match run.state {
        RunState::Active => (None, None),
        // A paused run's detail is its pause reason code.
        RunState::Paused => (run.detail.clone(), None),
        RunState::Finished(kind) => (Some(kind.as_str().to_string()), run.detail.clone()),
    };
    RunResult {
        run_id: run.run_id.clone(),
        state: run.state.as_str(),
        reason,
        detail,
        error: run.error.as_ref().map(ErrorReply::from),
        final_message: run
            .final_text
            .clone()
            .filter(|t| !t.is_empty())
            .map(|text| FinalMessage { text }),
        usage: run.spend.usage(),
        unreported_steps: run.spend.unreported_steps(),
        unmeasured_steps: run.spend.unmeasured_steps(),
        cost: cost(run),
        indeterminate_tool_calls: run.indeterminate_tool_calls.clone(),
        quota: run.quota.clone(),
    }
}

/// The run's cost, when its frozen entry has prices and every step was measured and priced.
fn cost(run: &RunView) -> Option<Cost> {
    let prices = run.config.catalog.as_ref()?.prices.as_ref()?;
    Some(Cost {
        micros: run.spend.cost_micros()?,
        currency: prices.currency.clone(),
    })
}

/// The `session.send` answer for the run a send started or named.
pub fn send_answer(run: &RunView) -> SendAnswer {
    let r = run_result(run);
    let state = match run.state {
        RunState::Active => "active",
        RunState::Paused => "paused",
        RunState::Finished(_) => "finished",
    };
    SendAnswer {
        state,
        run_id: r.run_id,
        reason: r.reason,
    }
}

/// The `run.status` reply for `run`.
pub fn run_status(run: &RunView) -> RunStatus {
    RunStatus {
        run_id: run.run_id.clone(),
        state: run.state.as_str(),
        usage: run.spend.usage(),
        unreported_steps: run.spend.unreported_steps(),
        unmeasured_steps: run.spend.unmeasured_steps(),
        cost: cost(run),
        indeterminate_tool_calls: run.indeterminate_tool_calls.clone(),
        error: run.error.as_ref().map(ErrorReply::from),
        quota: run.quota.clone(),
    }
}

/// The members broca's answers carry beside the llm-runner/v1 role's (a runner's own members
/// ride beside the role's): the run's spend over every metered attempt in the canonical
/// measures (`metered_usage`, each measure summed as the role's `usage` sums it: over the
/// attempts that reported it, absent until one did; `metered_unreported_steps` counts the
/// attempts that reported nothing, `unmeasured_steps` those that left out input or output)
/// with its cost, the calls left with an unknown outcome, the provider's quota, and the
/// sentence saying why the run stopped (`stop_detail`).
fn broca_members(run: &RunView, v: &mut serde_json::Value) {
    let r = run_result(run);
    let obj = v.as_object_mut().expect("an answer is an object");
    let usage = serde_json::to_value(r.usage).expect("usage serializes");
    if usage.as_object().is_some_and(|u| !u.is_empty()) {
        obj.insert("metered_usage".into(), usage);
    }
    if r.unreported_steps > 0 {
        obj.insert("metered_unreported_steps".into(), r.unreported_steps.into());
    }
    if r.unmeasured_steps > 0 {
        obj.insert("unmeasured_steps".into(), r.unmeasured_steps.into());
    }
    if let Some(cost) = r.cost {
        obj.insert(
            "cost".into(),
            serde_json::to_value(cost).expect("a cost serializes"),
        );
    }
    if !r.indeterminate_tool_calls.is_empty() {
        obj.insert(
            "indeterminate_tool_calls".into(),
            r.indeterminate_tool_calls.into(),
        );
    }
    if let Some(q) = r.quota {
        obj.insert(
            "quota".into(),
            serde_json::to_value(q).expect("a quota serializes"),
        );
    }
    if let Some(d) = r.detail {
        obj.insert("stop_detail".into(), d.into());
    }
}

/// The `run.result` answer: the role's `RunResult`, with broca's own members beside it.
pub fn result_answer(run: &RunView) -> serde_json::Value {
    let mut v = serde_json::to_value(crate::role::run_result(run)).expect("a result serializes");
    broca_members(run, &mut v);
    v
}

/// The `run.status` answer: the role's `RunStatus` with the run's id, and broca's members.
pub fn status_answer(run: &RunView) -> serde_json::Value {
    let mut v = serde_json::to_value(crate::role::run_status(run)).expect("a status serializes");
    v["run_id"] = run.run_id.clone().into();
    broca_members(run, &mut v);
    // The status always lists them (empty when every call's outcome is known).
    if v.get("indeterminate_tool_calls").is_none() {
        v["indeterminate_tool_calls"] = serde_json::json!([]);
    }
    v
}

/// The answer to a re-send (or `session.send_status`) of an ordered send that ended
/// undelivered (llm-runner/v1 §9.7): its terminal state, with the slot a
/// `template_part_gone` names.
pub fn ended_answer(ended: &broca_wal::runrec::SendEnded) -> serde_json::Value {
    use broca_wal::runrec::SendEnded;
    let mut answer = serde_json::json!({ "state": ended.state() });
    if let SendEnded::TemplatePartGone { slot } = ended {
        answer["slot"] = slot.clone().into();
    }
    answer
}

/// The `session.send` answer for the steered send of `seq` (its `SendSteered` record): the
/// state of the run that carries it and that run's id, with how it was delivered once it was
/// (`step` with its message's id, or `turn` with the run it started); before that, the run
/// that accepted it and no receipt (a durably accepted steer is always delivered).
pub fn steer_answer(session: &broca_core::Session, seq: u64) -> Option<serde_json::Value> {
    use broca_core::replay::SteerDelivered;
    let accepted_by = session
        .runs
        .iter()
        .position(|r| r.steers.iter().any(|s| s.seq == seq))?;
    let delivered = session.runs[accepted_by]
        .steers
        .iter()
        .find(|s| s.seq == seq)
        .and_then(|s| s.key.as_ref())
        .and_then(|key| session.steer_sends.get(key))
        .and_then(|s| s.delivered);
    // An ordered send (llm-runner/v1 §9.7) answers `pending` with its submission until it
    // goes out.
    let waiting = session.pending_steers.iter().find(|p| p.seq == seq);
    if let (None, Some(id)) = (
        delivered,
        waiting.and_then(|p| p.record.submission_id.as_ref()),
    ) {
        return Some(serde_json::json!({"state": "pending", "submission_id": id}));
    }
    let (run, receipt) = match delivered {
        None => (&session.runs[accepted_by], None),
        Some(SteerDelivered::Step { run }) => (
            &session.runs[run],
            Some(serde_json::json!({"as": "step", "ref": seq.to_string()})),
        ),
        Some(SteerDelivered::Turn { run }) => {
            let run = &session.runs[run];
            (
                run,
                Some(serde_json::json!({"as": "turn", "ref": run.run_id})),
            )
        }
    };
    let mut answer = serde_json::json!({"state": send_answer(run).state, "run_id": run.run_id});
    if let Some(receipt) = receipt {
        answer["delivered"] = receipt;
    }
    Some(answer)
}

#[cfg(test)]
#[path = "views_tests.rs"]
mod tests;
