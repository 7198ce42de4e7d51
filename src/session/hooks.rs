//! What a session actor tells the process's crash hooks (crash tests' kill points): every
//! record it appends, and every dispatched call that answered. The hooks are handed to the
//! actor by whoever opens it ([`crate::Opener::hooks`]); a process without them is
//! [`NoHooks`].

use broca_wal::Record;

/// When the process must stop for a record its hooks picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// Once the record is durable (a kill after the boundary).
    WhenDurable,
    /// At once, durable or not (a power cut right after the write).
    Now,
    /// After the action the record guards, durable or not (the hooks abort themselves then).
    AfterAction,
}

/// The crash hooks a session actor reports to.
pub trait Hooks {
    /// A record was appended: whether (and when) the process must stop for it.
    fn appended(&self, record: &Record) -> Option<Abort>;
    /// Stops the process for `record` (no destructor runs, as after a crash).
    fn abort(&self, record: &Record) -> !;
    /// A dispatched tool call answered.
    fn tool_answered(&self);
}

/// No crash hooks: nothing ever stops the process.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn appended(&self, _record: &Record) -> Option<Abort> {
        None
    }

    fn abort(&self, record: &Record) -> ! {
        unreachable!("NoHooks never asks to stop (record {:?})", record.kind())
    }

    fn tool_answered(&self) {}
}

/// A test's own stop, inside the process: the actor returns [`crate::ActorError::Crashed`]
/// right after this many appends (counted from the open, the lease record excluded).
#[derive(Debug, Clone, Copy, Default)]
pub struct CrashPlan {
    pub after_appends: Option<u64>,
    /// Whether that append is made durable before stopping (else it may be lost or torn).
    pub durable: bool,
}
