//! The interface between a run's driver and a model: a client opens a stream of canonical
//! events for a request. The provider crate implements it over the network; tests and
//! benches implement it with scripted models.

use std::future::Future;

use crate::{ClassifiedError, Request, StreamEvent, Usage};

/// A failed model attempt, classified where it arose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error: ClassifiedError,
    pub usage: Option<Usage>,
}

/// Calls a model: opens a stream of canonical events for a request.
pub trait ModelClient: 'static {
    type Stream: ModelStream;
    /// Starts the call. An error here is a failed attempt before any output.
    fn open(&self, request: &Request) -> impl Future<Output = Result<Self::Stream, Failure>>;
}

/// One model call's canonical events.
pub trait ModelStream {
    /// The next event; `None` when the step ended normally; `Some(Err)` when the attempt
    /// failed (its partial output is dropped).
    fn next(&mut self) -> impl Future<Output = Option<Result<StreamEvent, Failure>>>;
}
