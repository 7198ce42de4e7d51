//! What watches a session's actor from outside: every record it appends (a shard's hub,
//! metrics and spans; `broca run`'s outcome), the display lane's deltas, each model attempt's
//! hint for the bus, and its storage's health. Handed to the actor by whoever opens it
//! ([`crate::Opener::watch`]); an actor nobody watches has [`NoWatch`]. The watch is told, and
//! never reaches back into the actor: the session answers its own commands
//! ([`crate::SessionActor::answer`]).

use broca_wal::Record;

use crate::error::ActorError;

/// An appended record, as the watch is told of it.
#[derive(Debug, Clone, Copy)]
pub struct Appended<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// The log's end after it: it is durable once the log is durable up to here.
    pub end: u64,
    pub record: &'a Record,
}

/// What watches a session's actor. Every method has a default that does nothing.
pub trait Watch {
    /// A record was appended (before it is durable: [`Appended::end`] says when it will be).
    fn appended(&self, _appended: Appended<'_>) {}

    /// The runner's name for each model attempt's hint (llm-runner/v1 `step_events`), when
    /// the watch wants the hints: the actor makes one only then.
    fn step_runner(&self) -> Option<&str> {
        None
    }

    /// A model attempt's hint, to be published once the log is durable up to `end`.
    fn step_finished(
        &self,
        _end: u64,
        _hint: cortexkit_role_llm_runner::step_events::StepFinished,
    ) {
    }

    /// A delta of the display lane (lossy, never replayed).
    fn display(&self, _delta: &broca_core::DisplayDelta) {}

    /// A write reached the WAL: the file system takes writes (again).
    fn wrote(&self) {}

    /// A write of the session's WAL failed.
    fn failed(&self, _error: &ActorError) {}

    /// What keeps the session (its retention, its policy, its release) may have changed:
    /// told before the answer of a release or a send leaves, so a request that follows it
    /// finds the session kept as it now is.
    fn kept(&self, _state: &broca_core::Session) {}

    /// Whether the process is stopping: sends are refused `shutting_down` then.
    fn stopping(&self) -> bool {
        false
    }
}

/// Nobody watches the actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWatch;

impl Watch for NoWatch {}
