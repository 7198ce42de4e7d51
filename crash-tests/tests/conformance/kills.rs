//! The role's kill points broca declares to the suite, and the crash hook's point each is.

use cortexkit_role_llm_runner::points;

/// The role's kill points broca reaches, each with the crash hook's point that is it.
/// `RetentionTombstoned` (`retention_tombstoned`) is not declared: in module mode a first send
/// must name a storage policy (`session_retention.required`), so the suite's only case that
/// kills there, a legacy `retention` send, is not applicable; tests/retention.rs kills there.
pub(crate) const POINTS: &[(&str, &str, &str)] = &[
    (
        points::ADMITTED,
        "admitted",
        "the run's RunStarted record (frozen config, the send and its send_id) is durable; nothing was asked of the model",
    ),
    (
        points::SEND_RECORDED,
        "admitted",
        "a send's message is the RunStarted record of its run, durable with its send_id before the reply",
    ),
    (
        points::STEP_RECORDED,
        "step",
        "a ModelStepFinished record is durable, before its calls' dispatch intent is appended",
    ),
    (
        points::DISPATCH_INTENT,
        "intent",
        "a ToolDispatchIntent record is durable, before any of its calls leaves",
    ),
    (
        points::TOOL_RESULT_RECORDED,
        "tool_result",
        "a ToolResult record is durable",
    ),
    (
        points::TERMINAL,
        "terminal",
        "a RunFinished (or RunPaused) record is durable",
    ),
    (
        points::USER_COMMAND_FORWARDED,
        "user_command_forwarded",
        "a person-only command's module answered it, before its reply is recorded",
    ),
    (
        points::RELEASE_PENDING,
        "release_pending",
        "a session's release is durable and its `pending` answer has left through the connection",
    ),
];

/// Each declared kill point and the boundary of broca's it is, for docs/conformance.md.
pub fn points() -> Vec<(String, String)> {
    POINTS
        .iter()
        .map(|(point, hook, note)| (point.to_string(), format!("`{hook}`: {note}")))
        .collect()
}
