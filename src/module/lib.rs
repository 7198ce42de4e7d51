//! Session actors: one per session triple, holding the WAL's writer lease, processing its
//! commands in order and driving the run loop's state machine with real I/O (the WAL, the
//! model client, the tools).

pub mod catalog_service;
pub mod crash;
pub mod scripted;
pub mod serve;
pub mod session;
pub mod standalone;
pub mod subc_tools;

use std::future::Future;

pub use broca_protocol::model::{Failure, ModelClient, ModelStream};
use broca_protocol::ToolCall;

/// The clock of the actors and the daemon: milliseconds since the Unix epoch (the run loop
/// is handed this time; it reads none itself).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What became of a dispatched tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool answered.
    Done { content: String, is_error: bool },
    /// The tool ran and answered more than the model may see (`bytes`, over the 64 KiB
    /// limit): the answer is discarded whole, and the call is not run again.
    TooLarge { bytes: u64 },
    /// Refused before delivery: nothing ran.
    Refused { reason: String },
    /// Delivered, then the answer was lost: it may or may not have run.
    Indeterminate,
}

/// Whose call it is: the session and the run (a tool module's route is the session's, and
/// its call key is derived from both).
#[derive(Debug, Clone)]
pub struct ToolOrigin {
    pub triple: std::rc::Rc<broca_wal::SessionTriple>,
    pub run_id: String,
}

/// Runs tool calls.
pub trait ToolRunner: 'static {
    /// Runs one call, sent to the module `route` names (the route frozen with the tool's
    /// spec at admission).
    fn call(
        &self,
        call: ToolCall,
        route: String,
        origin: ToolOrigin,
    ) -> impl Future<Output = ToolOutcome>;
}

/// Tools from the configured MCP servers.
impl ToolRunner for broca_tools::Router {
    async fn call(&self, call: ToolCall, route: String, _origin: ToolOrigin) -> ToolOutcome {
        use broca_tools::mcp::CallError;
        match broca_tools::Router::call(self, &call, &route).await {
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
    async fn call(&self, call: ToolCall, _route: String, _origin: ToolOrigin) -> ToolOutcome {
        ToolOutcome::Refused {
            reason: format!("no tool `{}` is configured", call.name),
        }
    }
}

/// The model of a process that calls none (`broca import`): a call fails, permanently.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoModel;

/// [`NoModel`]'s stream (never opened).
pub struct NoStream;

impl ModelStream for NoStream {
    async fn next(&mut self) -> Option<Result<broca_protocol::StreamEvent, Failure>> {
        None
    }
}

impl ModelClient for NoModel {
    type Stream = NoStream;

    fn check(&self) -> &dyn broca_protocol::model::ProviderCheck {
        &broca_protocol::model::AnyProvider
    }

    async fn open(&self, _request: &broca_protocol::Request) -> Result<NoStream, Failure> {
        Err(Failure {
            error: broca_protocol::ClassifiedError {
                class: broca_protocol::ErrorClass::Permanent,
                message: "this process calls no model".into(),
                retry_after_ms: None,
            },
            usage: None,
        })
    }
}

/// Writes a line to stdout, ignoring failures: a closed or broken stdout must never take a
/// daemon down (`println!` panics on a broken pipe).
#[macro_export]
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Writes to stdout without a newline, ignoring failures (see [`outln!`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// Writes a line to stderr, ignoring failures: a closed stderr must never panic broca
/// (`eprintln!` does, on a broken pipe).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
