//! The suite's `archive_prunes_reasoning` hooks on broca: a fixture of two assistant messages
//! with signed reasoning beside text a prune keeps, each taken in from another harness's log
//! (`session.import`, so every entry of the session carries reasoning; the originals and their
//! pruned form are written here, not asked of broca), and the prune itself through the debug
//! build's `broca.debug.archive_now` (the archive's own pack, the session's actor closed
//! first when it is at rest).

use cortexkit_role_harness::HarnessError;
use cortexkit_role_llm_runner_conformance::ArchivePruningPart;
use serde_json::json;

use crate::subject::{Subject, HARNESS};

/// How many messages of the fixture carry reasoning.
const MESSAGES: usize = 2;

pub async fn fixture(
    subject: &Subject,
    session: &str,
    with_compaction_provider: bool,
) -> Result<Vec<ArchivePruningPart>, HarnessError> {
    if with_compaction_provider {
        // The person's app starts the session on a plan naming a compaction provider (broca's
        // `session.host_start`, on a route the daemon attests as `direct`); the messages are
        // taken in after, as for any fixture.
        let plan = json!({ "compaction_item": crate::numbers::compaction_item() });
        subject
            .live
            .on_session_as(
                "direct",
                HARNESS,
                session,
                "session.host_start",
                json!({ "plan": plan }),
            )
            .await?;
    }
    let root = subject
        .live
        .root()
        .ok_or_else(|| HarnessError::new("no live module"))?;
    let mut oracle = Vec::new();
    for n in 0..MESSAGES {
        let (text, signature) = (
            format!("{session}: a thought {n}"),
            format!("{session}-signature-{n}"),
        );
        let message = json!({"role": "assistant", "model": "m", "content": [
            {"type": "thinking", "thinking": text, "signature": signature},
            {"type": "text", "text": format!("{session}: an answer {n}")}]});
        let label = format!("prune-{n}");
        let log = root.join(format!("{session}-{label}.jsonl"));
        std::fs::write(
            &log,
            crate::import::claude_log(session, &label, vec![message]),
        )
        .map_err(|e| HarnessError::new(format!("the log: {e}")))?;
        subject
            .live
            .on_session(
                HARNESS,
                session,
                "session.import",
                json!({"format": "claude-code", "path": log.to_string_lossy()}),
            )
            .await?;
        oracle.push(ArchivePruningPart {
            kind: "reasoning".into(),
            original: json!({"thinking": {"text": text, "signature": signature}}),
            served: json!({"thinking": {"text": ""}}),
        });
    }
    // The scripted model's turns start after them.
    subject.model.seeded(session, MESSAGES);
    Ok(oracle)
}

pub async fn prune(subject: &Subject, session: &str) -> Result<(), HarnessError> {
    subject
        .live
        .on_session(HARNESS, session, "broca.debug.archive_now", json!({}))
        .await
        .map(|_| ())
}
