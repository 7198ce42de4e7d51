//! A run's structured output (a child of `machine`): the step that calls `submit_result`
//! ends the run with the value it submitted, its other calls never dispatched, and the
//! result every ended run admitted with `structured_output` carries on its RunFinished.

use broca_protocol::{Role, ToolCall};
use broca_wal::runrec::{result_reason, FinishKind, ResultBlock};
use cortexkit_role_llm_runner::structured_output::{modes, SkippedSibling, SUBMIT_RESULT_TOOL};

use super::RunMachine;
use broca_protocol::structured;

/// What the counted `submit_result` call's own recorded result says.
const SUBMITTED_TEXT: &str = "submitted: the run ends with this result";

/// What a call of the submitting step that was never dispatched says.
const SKIPPED_TEXT: &str = "not run: submit_result in the same step ended the run before this \
     call was dispatched";

impl RunMachine {
    /// Whether the step's calls end the run: the run is in `submit_tool` mode and one of them
    /// is `submit_result`.
    pub(super) fn submits(&self, calls: &[ToolCall]) -> bool {
        self.config
            .structured_output
            .as_ref()
            .is_some_and(|so| so.mode == modes::SUBMIT_TOOL)
            && calls.iter().any(|c| c.name == SUBMIT_RESULT_TOOL)
    }

    /// Ends the run completed after a submitting step: the first `submit_result` counts and
    /// gets the runner's own result; every other call of the step (a later `submit_result`
    /// too) is never dispatched and gets the `skipped_after_submit` result, all in the commit
    /// that ends the run. Nothing of the step was dispatched before: broca dispatches a
    /// step's calls only once the step is complete.
    pub(super) fn end_with_submit(&mut self, calls: &[ToolCall]) {
        let Some(so) = self.config.structured_output.clone() else {
            return;
        };
        let batch_id = format!("{}.{}", self.run_id, self.step);
        let counted = calls.iter().position(|c| c.name == SUBMIT_RESULT_TOOL);
        let mut skipped = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let result = if Some(i) == counted {
                ResultBlock {
                    call_id: call.id.clone(),
                    content: SUBMITTED_TEXT.into(),
                    is_error: false,
                    reason: None,
                    size: None,
                    parts: Vec::new(),
                }
            } else {
                skipped.push(SkippedSibling::new(&call.id, &call.name));
                ResultBlock {
                    call_id: call.id.clone(),
                    content: SKIPPED_TEXT.into(),
                    is_error: true,
                    reason: Some(result_reason::SKIPPED_AFTER_SUBMIT.into()),
                    size: None,
                    parts: Vec::new(),
                }
            };
            self.push_result(batch_id.clone(), result);
        }
        let arguments = counted.map_or("null", |i| calls[i].input.get());
        self.submitted = Some(structured::submitted_result(&so, arguments, skipped));
        self.seal(FinishKind::Completed, None, None, Vec::new());
    }

    /// The structured output of the run ending `reason`, when it was admitted with one: the
    /// submitted value, the final text validated (`final_text`, completed), or absent.
    pub(super) fn structured_output(&mut self, reason: FinishKind) -> Option<serde_json::Value> {
        let so = self.config.structured_output.as_ref()?;
        let result = match self.submitted.take() {
            Some(submitted) => submitted,
            None if reason == FinishKind::Completed && so.mode == modes::FINAL_TEXT => {
                let text = self
                    .transcript
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::Assistant)
                    .map(|m| m.text())
                    .unwrap_or_default();
                structured::final_text_result(so, &text)
            }
            None => structured::absent_result(so),
        };
        serde_json::to_value(result).ok()
    }
}
