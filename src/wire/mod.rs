//! The management JSON contracts: the replies users and scripts read (`run.result` here; the
//! serve surface adds its requests and refusals). Field names follow ../CONTRACT.md; optional
//! fields are omitted when absent.

use serde::Serialize;

use crate::core::replay::{RunState, RunView};
use crate::protocol::{ClassifiedError, Usage};

/// An error as replies carry it: its class and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorReply {
    pub class: &'static str,
    pub message: String,
}

impl From<&ClassifiedError> for ErrorReply {
    fn from(e: &ClassifiedError) -> ErrorReply {
        ErrorReply {
            class: e.class.as_str(),
            message: e.message.clone(),
        }
    }
}

/// A final message's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinalMessage {
    pub text: String,
}

/// The `run.result` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunResult {
    pub run_id: String,
    /// active, paused, completed, max_steps, cancelled, interrupted, error, or a budget or
    /// context reason (budget_exhausted, budget_unmeasured, context_limit).
    pub state: &'static str,
    /// Why the run stopped, as a code: the finish reason, or the pause reason (e.g.
    /// `auth_required`). Absent while the run is active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The same in words, when there is more to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorReply>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_message: Option<FinalMessage>,
    /// Usage as reported; a measure never reported is absent.
    pub usage: Usage,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub indeterminate_tool_calls: Vec<String>,
}

impl RunResult {
    /// The reply for a run as the WAL tells it.
    pub fn of(run: &RunView) -> RunResult {
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
            usage: run.usage,
            indeterminate_tool_calls: run.indeterminate_tool_calls.clone(),
        }
    }

    /// Whether the run completed (the standalone runner's exit 0).
    pub fn completed(&self) -> bool {
        self.state == "completed"
    }

    /// One line for stderr saying how the run ended.
    pub fn summary(&self) -> String {
        let mut s = format!("run {} ended {}", self.run_id, self.state);
        if let Some(d) = self.detail.as_ref().or(self.reason.as_ref()) {
            if d != self.state {
                s.push_str(&format!(": {d}"));
            }
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(" ({} error: {})", e.class, e.message));
        }
        if !self.indeterminate_tool_calls.is_empty() {
            s.push_str(&format!(
                "; tool calls with unknown outcome: {}",
                self.indeterminate_tool_calls.join(", ")
            ));
        }
        s
    }
}
