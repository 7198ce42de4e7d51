//! Session actors: one per session triple, holding the WAL's writer lease, processing its
//! commands in order and driving the run loop's state machine with real I/O (the WAL, the
//! model client, the tools).

pub mod crash;
pub mod scripted;
pub mod serve;
pub mod session;
pub mod standalone;

use std::future::Future;

use crate::protocol::{ClassifiedError, Request, StreamEvent, ToolCall, Usage};

/// A failed model attempt, classified where it arose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: ClassifiedError,
    pub usage: Option<Usage>,
}

/// Calls a model: opens a stream of canonical events for a request.
pub trait ModelClient: 'static {
    type Stream: ModelStream;
    /// Starts the call. An error here is a failed attempt before any output.
    fn open(&self, request: &Request) -> impl Future<Output = Result<Self::Stream, Failure>>;
}

/// One model call's canonical events.
pub trait ModelStream {
    /// The next event; `None` when the step ended normally; `Some(Err)` when the attempt
    /// failed (its partial output is dropped).
    fn next(&mut self) -> impl Future<Output = Option<Result<StreamEvent, Failure>>>;
}

/// What became of a dispatched tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool answered.
    Done { content: String, is_error: bool },
    /// Refused before delivery: nothing ran.
    Refused { reason: String },
    /// Delivered, then the answer was lost: it may or may not have run.
    Indeterminate,
}

/// Runs tool calls.
pub trait ToolRunner: 'static {
    /// Runs one call, sent to the module `route` names (the route frozen with the tool's
    /// spec at admission).
    fn call(&self, call: ToolCall, route: String) -> impl Future<Output = ToolOutcome>;
}

/// Tools from the configured MCP servers.
impl ToolRunner for crate::tools::Router {
    async fn call(&self, call: ToolCall, route: String) -> ToolOutcome {
        use crate::tools::mcp::CallError;
        match crate::tools::Router::call(self, &call, &route).await {
            Ok(text) => ToolOutcome::Done {
                content: text.content,
                is_error: text.is_error,
            },
            Err(CallError::Refused(reason)) => ToolOutcome::Refused { reason },
            Err(CallError::Indeterminate(why)) => {
                tracing::warn!(tool = %call.name, call_id = %call.id, "tool call indeterminate: {why}");
                ToolOutcome::Indeterminate
            }
        }
    }
}

/// The runner of a session with no tools configured: the run loop refuses every call as an
/// unknown tool before dispatch, so this is never called; if it were, nothing runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTools;

impl ToolRunner for NoTools {
    async fn call(&self, call: ToolCall, _route: String) -> ToolOutcome {
        ToolOutcome::Refused {
            reason: format!("no tool `{}` is configured", call.name),
        }
    }
}
