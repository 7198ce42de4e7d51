//! The adapter's way of seeding a session with earlier history: a Claude Code log taken in by
//! `session.import` over the owner's route (broca's own write path).

use cortexkit_role_harness::HarnessError;
use cortexkit_role_llm_runner_conformance::{LlmRunnerSubject, Reply, RunnerRoute};
use serde_json::{json, Value};

use crate::subject::{Module, Subject};

impl Subject {
    /// Takes `messages` into `session` as a Claude Code log would bring them
    /// (`session.import` over the owner's route, broca's own write path).
    pub(crate) async fn import(
        &self,
        handle: &Module,
        session: &str,
        label: &str,
        messages: Vec<Value>,
    ) -> Result<(), HarnessError> {
        let route = self
            .session_route(handle, session, &self.owner_stamp())
            .await?;
        let fail = |what: &str, e: String| HarnessError::new(format!("{what}: {e}"));
        let log = handle.root.join(format!("{session}-{label}.jsonl"));
        std::fs::write(&log, claude_log(session, label, messages))
            .map_err(|e| fail("the log", e.to_string()))?;
        let imported = route
            .request(
                "session.import",
                json!({"format": "claude-code", "path": log.to_string_lossy()}),
            )
            .await
            .map_err(|e| fail("session.import", e.message))?;
        match imported {
            Reply::Response(_) => Ok(()),
            refused => Err(HarnessError::new(format!(
                "session.import refused: {refused:?}"
            ))),
        }
    }
}

/// `messages` as the lines of a Claude Code log of `session` (its `label`-th).
pub(crate) fn claude_log(session: &str, label: &str, messages: Vec<Value>) -> String {
    messages
        .into_iter()
        .enumerate()
        .map(|(n, message)| {
            let kind = message["role"].as_str().unwrap_or("user").to_string();
            json!({"type": kind, "uuid": format!("{label}-{n}"),
                "sessionId": format!("{session}-{label}-log"),
                "timestamp": "2026-12-01T00:00:00.000Z", "cwd": "/", "message": message})
            .to_string()
                + "\n"
        })
        .collect()
}
