//! What a completed model step leads to (a child of `machine`): the tool intent of its calls,
//! or a stop (a cancel, `max_steps`, a budget or the context limit) that gives each call its
//! not-run result in the commit that ends the run, so no call is left without one.

use std::sync::Arc;

use broca_protocol::{Block, ClassifiedError, ErrorClass, FinishReason, Message, Role, ToolCall};
use broca_wal::runrec::{
    result_reason, FinishKind, ModelStepFinished, ResultBlock, ToolDispatchIntent,
};
use broca_wal::Record;

use super::{LastStep, Phase, RunMachine};

impl RunMachine {
    /// The model stream ended normally: the step's record (or, for an answer no record can
    /// hold, a failed attempt), its message, then what follows it.
    pub(super) fn on_step_ended(&mut self) {
        if !matches!(self.phase, Phase::Streaming) {
            return;
        }
        if self.compacting.is_some() {
            return self.on_compaction_ended();
        }
        let step = std::mem::take(&mut self.acc).finish();
        let step_usage = step.usage;
        // An answer no record can hold fails its attempt, for good: recorded, it would stop
        // the session's log; retried, it would come back as large.
        if let Some(bytes) = step_over_record_limit(&step.content) {
            let error = ClassifiedError {
                class: ErrorClass::Permanent,
                message: format!(
                    "the model's answer is {bytes} bytes, larger than a WAL record may hold ({} \
                     bytes); it was not recorded",
                    broca_wal::frame::PAYLOAD_BYTES_MAX
                ),
                retry_after_ms: None,
            };
            self.on_attempt_failed(error, Some(step_usage));
            return;
        }
        let prices = self.prices().cloned();
        self.spend
            .add(self.step, self.attempt, Some(&step_usage), prices.as_ref());
        self.input.add(&step_usage);
        let record = ModelStepFinished {
            run_id: self.run_id.clone(),
            step: self.step,
            attempt: self.attempt,
            content: step.content.clone(),
            usage: step_usage,
            finish_reason: step.finish_reason.clone(),
            request_id: step.request_id,
            quota: step.quota,
            at_unix_ms: Some(self.now_ms),
            step_seq: self.step_seq,
        };
        self.push(Record::ModelStepFinished(Box::new(record)), false);
        let message = Message {
            role: Role::Assistant,
            content: step.content,
        };
        self.transcript.push(Arc::new(message));
        self.last_step = Some(LastStep {
            usage: step_usage,
            transcript_len: self.transcript.len(),
        });
        self.after_model_step(step.finish_reason);
    }

    /// Decides what follows a durable-or-pending model step: tools, or the end of the run.
    /// Also the resume path of a step whose record is durable. A step that asks for tools is
    /// followed by another request, so its tools run only if that request could be made: a
    /// budget spent or a context limit passed stops the run before they are dispatched.
    pub(super) fn after_model_step(&mut self, finish_reason: FinishReason) {
        // The step's calls that have no result yet: all of them live; after a crash, those a
        // stop had not yet given their not-run result (its results are deferred, and the run's
        // end was not durable).
        let calls: Vec<ToolCall> = crate::replay::unanswered_calls(&self.transcript);
        if self.cancel_requested {
            self.resolve_undispatched(&calls, FinishKind::Cancelled);
            return self.seal(FinishKind::Cancelled, None, None, Vec::new());
        }
        // A step calling `submit_result` ends the run completed, whatever else it asked for
        // and whatever limit it reached: its value is the run's output.
        if self.submits(&calls) {
            return self.end_with_submit(&calls);
        }
        // The step that brings the session's input to its cap ends the run, whatever it
        // asked for; its calls are never dispatched.
        if let Some(stop) = self.input_cap_stop() {
            self.resolve_undispatched(&calls, stop.kind);
            return self.seal_stop(stop);
        }
        let asked_tools = self
            .transcript
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .is_some_and(|m| m.tool_calls().next().is_some());
        if calls.is_empty() && asked_tools && self.step >= self.config.stop.max_steps {
            // Resumed after every call of the last step got its not-run result.
            let detail = format!("the run reached max_steps ({})", self.config.stop.max_steps);
            return self.seal(FinishKind::MaxSteps, Some(detail), None, Vec::new());
        }
        // A steer that came while the step streamed is answered by another step.
        if calls.is_empty() && self.steers_waiting() && self.step < self.config.stop.max_steps {
            return self.next_step_or_stop();
        }
        if calls.is_empty() {
            let detail = match finish_reason {
                FinishReason::MaxTokens => Some("the model hit its output token limit".into()),
                _ => None,
            };
            return self.seal(FinishKind::Completed, detail, None, Vec::new());
        }
        // The last step the run may take asked for tools: no model would read their results,
        // so they are never dispatched; each gets its not-run result in the commit that ends
        // the run.
        if self.step >= self.config.stop.max_steps {
            let detail = format!("the run reached max_steps ({})", self.config.stop.max_steps);
            self.resolve_undispatched(&calls, FinishKind::MaxSteps);
            return self.seal(FinishKind::MaxSteps, Some(detail), None, Vec::new());
        }
        if let Some(stop) = self.limit_before_request() {
            self.resolve_undispatched(&calls, stop.kind);
            return self.seal_stop(stop);
        }
        self.write_intent(calls);
    }

    pub(super) fn write_intent(&mut self, calls: Vec<ToolCall>) {
        let batch_id = format!("{}.{}", self.run_id, self.step);
        // Where each call goes: its frozen route's module, or nowhere for a call broca refuses
        // itself (decided the same way when the intent is durable).
        let sent: Vec<Option<&str>> = calls
            .iter()
            .map(|c| match self.refusal(c) {
                Some(_) => None,
                None => Some(self.route_of(&c.name)),
            })
            .collect();
        let dispatched_to = sent
            .iter()
            .map(|r| r.map(|r| broca_protocol::route::module(r).to_string()))
            .collect();
        let schema_pins = sent
            .iter()
            .map(|r| {
                r.and_then(broca_protocol::route::schema_pin)
                    .map(str::to_string)
            })
            .collect();
        let record = ToolDispatchIntent {
            run_id: self.run_id.clone(),
            step: self.step,
            batch_id: batch_id.clone(),
            calls: calls.clone(),
            call_keys: Vec::new(),
            dispatched_to,
            schema_pins,
            step_seq: self.step_seq,
            at_unix_ms: Some(self.now_ms),
        };
        self.push(Record::ToolDispatchIntent(record), true);
        self.phase = Phase::AwaitIntent { batch_id, calls };
    }

    /// Results for tool calls of the last step that will never be dispatched.
    /// `stop`: how the run ends (`Interrupted`: broca is shutting down).
    pub(super) fn resolve_undispatched(&mut self, calls: &[ToolCall], stop: FinishKind) {
        let why = match stop {
            FinishKind::Interrupted => "shutdown",
            other => other.as_str(),
        };
        let batch_id = format!("{}.{}", self.run_id, self.step);
        for call in calls {
            self.push_result(
                batch_id.clone(),
                ResultBlock {
                    call_id: call.id.clone(),
                    content: format!(
                        "not run: the run stopped ({why}) before this call was dispatched"
                    ),
                    is_error: true,
                    reason: Some(not_run_reason(stop).into()),
                    size: None,
                    parts: Vec::new(),
                },
            );
        }
    }
}

/// The reason a never-dispatched call's result carries: the role's state name for a budget's
/// or the context limit's stop, `not_dispatched` for the others.
fn not_run_reason(stop: FinishKind) -> &'static str {
    match stop {
        FinishKind::BudgetExhausted | FinishKind::BudgetUnmeasured => {
            result_reason::BUDGET_EXHAUSTED
        }
        FinishKind::ContextLimit => result_reason::CONTEXT_CEILING,
        FinishKind::Completed
        | FinishKind::MaxSteps
        | FinishKind::Cancelled
        | FinishKind::Interrupted
        | FinishKind::Error => result_reason::NOT_DISPATCHED,
    }
}

/// Appends a tool result block to the transcript: into the user message of results that
/// follows the assistant's tool calls, or a new one.
/// The size of a step's content when its record could not be appended (over the WAL's frame
/// limit, with room for the record's other fields); `None` for every answer that fits. Counted
/// cheaply first, encoded only when it comes near.
fn step_over_record_limit(content: &[Block]) -> Option<usize> {
    const ROOM: usize = 64 * 1024;
    let limit = broca_wal::frame::PAYLOAD_BYTES_MAX - ROOM;
    let rough: usize = content.iter().map(super::limits::block_bytes).sum();
    if rough < limit / 2 {
        return None;
    }
    let bytes = serde_json::to_vec(content).map_or(usize::MAX, |v| v.len());
    (bytes > limit).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use crate::machine::{Command, Event, RunMachine};
    use crate::machine_tests::{config, drain, kinds, Feed};
    use broca_protocol::{FinishReason, Message, StreamEvent};
    use broca_wal::Record;

    #[test]
    fn an_answer_no_record_can_hold_fails_its_run_instead_of_its_log() {
        let mut m = RunMachine::start(
            "r".into(),
            config(),
            vec![Message::user_text("go").into()],
            0,
        );
        drain(&mut m);
        m.feed(Event::Stream(StreamEvent::TextDelta(
            "x".repeat(broca_wal::frame::PAYLOAD_BYTES_MAX),
        )));
        m.feed(Event::Stream(StreamEvent::Finish {
            reason: FinishReason::EndTurn,
            request_id: None,
        }));
        m.feed(Event::StepEnded);
        let cmds = drain(&mut m);
        assert_eq!(
            kinds(&cmds),
            ["model_attempt_finished", "run_finished!"],
            "never a model_step_finished"
        );
        let Some(Command::Append {
            record: Record::ModelAttemptFinished(failed),
            ..
        }) = cmds.iter().find(|c| !matches!(c, Command::Display(_)))
        else {
            panic!("the failed attempt first")
        };
        assert!(
            failed
                .error
                .message
                .contains("larger than a WAL record may hold"),
            "{}",
            failed.error.message
        );
        m.feed(Event::Durable);
        assert_eq!(kinds(&drain(&mut m)), ["finish:error"]);
    }
}

impl RunMachine {
    /// Once every call of the step has its result: the next step (its results go out with
    /// it), or the run interrupted by a call whose outcome is unknown.
    pub(super) fn tools_maybe_done(&mut self) {
        let Phase::Tools {
            waiting,
            indeterminate,
            ..
        } = &mut self.phase
        else {
            return;
        };
        if !waiting.is_empty() {
            return;
        }
        if !indeterminate.is_empty() {
            let calls = std::mem::take(indeterminate);
            let detail = "a tool call's outcome is unknown (delivered, then lost)".to_string();
            self.interrupt_cause = Some(broca_wal::runrec::interrupt_cause::TOOL_OUTCOME_UNKNOWN);
            return self.seal(FinishKind::Interrupted, Some(detail), None, calls);
        }
        self.fresh_results = true;
        self.next_step_or_stop();
    }
}
