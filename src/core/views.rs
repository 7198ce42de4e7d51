//! A run as the WAL tells it, turned into the management contract's replies (broca-wire):
//! core owns the views, wire the shapes users read.

use broca_wire::{Cost, ErrorReply, FinalMessage, RunResult, RunStatus, SendAnswer};

use crate::replay::{RunState, RunView};

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
        unmeasured_steps: run.spend.unmeasured_steps(),
        cost: cost(run),
        indeterminate_tool_calls: run.indeterminate_tool_calls.clone(),
        error: run.error.as_ref().map(ErrorReply::from),
        quota: run.quota.clone(),
    }
}
