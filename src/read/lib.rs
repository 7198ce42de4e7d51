//! broca-read: what the llm-runner/v1 role's reads serve of a session, from its WAL read as a
//! reader (no lease, nothing written), sans-IO: the one read-then-replay of a WAL and the
//! readers' cache that applies only what was appended (`read`), the role's entries and answers
//! (`role`; `session.history` and display rows in `history`, `run.tool_calls` in
//! `tool_calls`, run views in `views`), media in reads by mode, with digests (`media`), the
//! control lane's projection with the role's typed events (`project`), the `step.finished.v1`
//! hint of a model attempt's record (`step_events`), and the archive's reasoning prune: a
//! log's bytes rewritten with its reasoning emptied in place, and the digests and rows reads
//! serve of the originals (`prune`).

pub mod history;
pub mod media;
pub mod project;
pub mod prune;
pub mod read;
pub mod role;
pub mod step_events;
pub mod tool_calls;
pub mod views;

pub use read::{read_session, Keep, ReadError, ReadSession};
#[cfg(test)]
mod prune_tests;
