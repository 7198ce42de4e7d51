//! The run loop's domain logic, sans-IO: admission, the state machine, stream folding and
//! replay. Nothing here touches a file, a socket or a clock it was not handed.

pub mod admission;
pub mod machine;
#[cfg(test)]
mod machine_tests;
pub mod project;
pub mod replay;
pub mod stream;
pub mod usage;
pub mod views;

pub use admission::{admit, Admitted, Refusal, SendRequest};
pub use machine::{Command, Event, Outcome, ResumePoint, RunMachine};
pub use replay::{RunState, RunView, Session};
