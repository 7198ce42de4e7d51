//! A session's mid-session changes (llm-runner/v1 §10.2 `session_change`), and who hosts
//! and owns it (a host's start, an adoption, §9.5): an accepted
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
    /// The session's host started it (a person's own app, a caller with no attested
    /// identity: `session.host_start`) with the installation's fetch plan applied before any
    /// run: the plan as its fetch froze it, its tools beside it. A session has one at most.
    HostStarted {
        plan: Box<FrozenPlan>,
        #[serde(default)]
        tools: Vec<broca_protocol::ToolSpec>,
        at_unix_ms: u64,
    },
    /// `session.adopt` (llm-runner/v1 §9.5): `principal`, and its route's scope owner, own
    /// the session from here on; the adoption's request (its `send_id`, the identity of its
    /// plan, its storage policy) and its answer's `last_ordinal`, for a repeat.
    Adopted {
        send_id: String,
        principal: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope_owner: Option<String>,
        /// The identity of the plan the request carried (the one applied).
        plan: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retention_policy: Option<cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_ordinal: Option<u64>,
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

impl SessionChangeRecord {
    /// When it was written, when it is the session's activity (llm-runner/v1 §9.14: a
    /// host's start and an adoption are; a plan change is not).
    pub fn activity_at(&self) -> Option<u64> {
        match self {
            SessionChangeRecord::HostStarted { at_unix_ms, .. }
            | SessionChangeRecord::Adopted { at_unix_ms, .. } => Some(*at_unix_ms),
            _ => None,
        }
    }
}
