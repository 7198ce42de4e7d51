//! A session's mid-session changes (llm-runner/v1 §10.2 `session_change`): an accepted
//! `session.refresh` with its fetched plan, a pending change's new rung, a
//! `session.flush_prefix`. A change applies when a run starts on it: that run's
//! `run_started` carries the refreshed plan (`config.plan`, with its `generation`).

use serde::{Deserialize, Serialize};

use crate::planrec::FrozenPlan;

/// One step of a session's changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum SessionChangeRecord {
    /// A `session.refresh` accepted: its plan as its fetch froze it (the plan's tools
    /// written beside it, in `tools`), its rung, and the answer it was given.
    Refreshed {
        generation: u64,
        policy: String,
        plan: Box<FrozenPlan>,
        #[serde(default)]
        tools: Vec<broca_protocol::ToolSpec>,
        run_in_progress: bool,
        applies_from_next_run: bool,
        at_unix_ms: u64,
    },
    /// `session.refresh_policy`: the pending change's new rung.
    PolicyChanged {
        generation: u64,
        policy: String,
        send_id: String,
        at_unix_ms: u64,
    },
    /// `session.flush_prefix`: the pending change (if any) applies at the next run.
    Flushed {
        send_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pending_generation: Option<u64>,
        at_unix_ms: u64,
    },
}
