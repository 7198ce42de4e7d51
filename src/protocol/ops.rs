//! The names of broca's own management methods, each spelled here once; the llm-runner/v1
//! role's methods are the role crate's constants (`cortexkit_role_llm_runner::ops`).

/// Imports a foreign transcript into a new session.
pub const SESSION_IMPORT: &str = "session.import";
/// A session the host starts with a plan already applied, without a prompt.
pub const SESSION_HOST_START: &str = "session.host_start";
/// The sessions of a store, paged.
pub const SESSIONS_LIST: &str = "sessions.list";
/// A session's runs, paged.
pub const RUNS_LIST: &str = "runs.list";
/// Moves a debug build's clock forward (debug builds only).
pub const DEBUG_ADVANCE_CLOCK: &str = "broca.debug.advance_clock";
/// Packs the archive now (debug builds only).
pub const DEBUG_ARCHIVE_NOW: &str = "broca.debug.archive_now";
