//! What a session's run calls its tools through: [`ToolRunner`], its outcomes, and the
//! runners there are: the MCP servers' [`Router`], the daemon's tool modules
//! ([`crate::modules::ModuleTools`]), both behind a shard's [`Tools`], and [`NoTools`].

use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use broca_protocol::ToolCall;

use crate::mcp::CallError;
use crate::modules::ModuleTools;
use crate::Router;

/// What became of a dispatched tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    /// The tool answered.
    Done { content: String, is_error: bool },
    /// The tool answered in parts, in order: text, and images it returned (decoded). The
    /// session keeps each image in its content store before the result is recorded.
    Parts {
        parts: Vec<ToolPart>,
        is_error: bool,
    },
    /// The tool ran and answered more than the model may see (`bytes`, over the 64 KiB
    /// limit): the answer is discarded whole, and the call is not run again.
    TooLarge { bytes: u64 },
    /// Refused before delivery: nothing ran.
    Refused { reason: String },
    /// Delivered, then the answer was lost: it may or may not have run.
    Indeterminate,
}

/// A part of a tool's answer in parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPart {
    Text(String),
    Image { mime: String, data: Vec<u8> },
}

/// Whose call it is: the session and the run (a tool module's route is the session's), and
/// the call's key as its dispatch intent recorded it (a tool provider deduplicates on it).
#[derive(Debug, Clone)]
pub struct ToolOrigin {
    pub triple: Rc<broca_wal::SessionTriple>,
    pub run_id: String,
    pub call_key: String,
    /// The session's creation (its WAL header's Unix ms): the epoch of its scope, which a
    /// tool module's route is opened under (broca_subc::scope).
    pub scope_epoch: u64,
    /// The tool's reply deadline metadata as the run froze it (a tool module's `reply`).
    pub reply: Option<serde_json::Value>,
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

    /// Asks session `t`'s compaction provider `provider` an op (`body`: `{method, params}`),
    /// waiting `deadline` at most ([`ModuleTools::compaction_op`]). Only the daemon's modules
    /// are compaction providers: elsewhere, unreachable.
    fn compaction_op(
        &self,
        t: Rc<broca_wal::SessionTriple>,
        scope_epoch: u64,
        provider: String,
        body: Vec<u8>,
        deadline: std::time::Duration,
    ) -> impl Future<Output = Result<serde_json::Value, crate::modules::CompactionMiss>> {
        let _ = (t, scope_epoch, provider, body, deadline);
        async { Err(not_module_mode()) }
    }
}

/// Why a compaction provider cannot be asked outside module mode.
fn not_module_mode() -> crate::modules::CompactionMiss {
    crate::modules::CompactionMiss::Unreachable(
        "compaction providers are the daemon's modules, reached in module mode".into(),
    )
}

/// Tools from the configured MCP servers.
impl ToolRunner for Router {
    async fn call(&self, call: ToolCall, route: String, _origin: ToolOrigin) -> ToolOutcome {
        if route == broca_protocol::demo::WORD_COUNT_ROUTE {
            return demo_word_count(&call).await;
        }
        match Router::call(self, &call, &route).await {
            Ok(text) => match text.parts {
                Some(parts) => ToolOutcome::Parts {
                    parts,
                    is_error: text.is_error,
                },
                None => ToolOutcome::Done {
                    content: text.content,
                    is_error: text.is_error,
                },
            },
            Err(CallError::Refused(reason)) => ToolOutcome::Refused { reason },
            Err(CallError::Indeterminate(why)) => {
                tracing::warn!(tool = %call.name, call_id = %call.id, "tool call indeterminate: {why}");
                ToolOutcome::Indeterminate
            }
        }
    }
}

/// The demo model's built-in tool: counts the words of its input, taking its time (a window
/// to kill broca in the middle of a call).
async fn demo_word_count(call: &ToolCall) -> ToolOutcome {
    glommio::timer::sleep(std::time::Duration::from_millis(
        broca_protocol::demo::WORD_COUNT_MS,
    ))
    .await;
    let input: serde_json::Value =
        serde_json::from_str(call.input.get()).unwrap_or(serde_json::Value::Null);
    match broca_protocol::demo::count_words(&input) {
        Ok(content) => ToolOutcome::Done {
            content,
            is_error: false,
        },
        Err(not_text) => ToolOutcome::Done {
            content: not_text.to_string(),
            is_error: true,
        },
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

/// A shard's tools: the MCP servers' router and, in module mode, the tool modules.
pub struct Tools {
    pub mcp: Router,
    pub modules: Option<Arc<ModuleTools>>,
}

impl ToolRunner for Tools {
    async fn call(&self, call: ToolCall, route: String, origin: ToolOrigin) -> ToolOutcome {
        if !route.starts_with(broca_subc::toolprov::ROUTE_PREFIX) {
            return ToolRunner::call(&self.mcp, call, route, origin).await;
        }
        match &self.modules {
            Some(m) => m.call(&call, &route, &origin).await,
            None => ToolOutcome::Refused {
                reason: format!(
                    "tool `{}` is served by a tool module (`{route}`), reached only in module mode",
                    call.name
                ),
            },
        }
    }

    async fn compaction_op(
        &self,
        t: Rc<broca_wal::SessionTriple>,
        scope_epoch: u64,
        provider: String,
        body: Vec<u8>,
        deadline: std::time::Duration,
    ) -> Result<serde_json::Value, crate::modules::CompactionMiss> {
        match &self.modules {
            Some(m) => {
                m.compaction_op(&t, scope_epoch, &provider, body, deadline)
                    .await
            }
            None => Err(not_module_mode()),
        }
    }
}
