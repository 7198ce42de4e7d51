//! broca-core: the run loop's domain logic, sans-IO: admission, the state machine, stream
//! folding, replay, what a run spent (usage totals, cost, budgets' measures), the control
//! lane's projection and usage facts. Nothing here touches a
//! file, a socket or a clock: time, the catalog and randomness come in from the caller.

pub mod admission;
pub mod entries;
#[cfg(test)]
mod input_cap_tests;
pub mod machine;
#[cfg(test)]
mod machine_tests;
pub mod project;
pub mod read;
pub mod replay;
pub mod resume;
pub mod role;
pub mod spend;
pub mod stream;
pub mod usage;
pub mod views;

pub use admission::{admit, Admitted, Refusal, SendRequest};
pub use machine::{
    Command, Event, Outcome, ResumeFrom, ResumePoint, RunMachine, Timeout, TimeoutKind,
};
pub use read::{read_session, Keep, ReadError, ReadSession};
pub use replay::{Misfit, ReplayError, RunState, RunView, Session};
