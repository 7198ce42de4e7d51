//! A session's queued sends (a child of `session`): the next one started once no run is
//! active, a withdrawal before it starts (owner-only), and what a cancel did.

use broca_wal::Record;

use super::{ActorError, SessionActor};
use crate::{ModelClient, ToolRunner};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Starts the next queued send's run once no run is active (its RunStarted durable);
    /// answers whether one started.
    pub async fn start_queued(&mut self) -> Result<bool, ActorError> {
        let run_id = format!(
            "run_{}_{}",
            &self.writer.header().lineage_hex()[..12],
            self.writer.next_seq()
        );
        match broca_core::admission::start_queued(&self.state, run_id, crate::now_unix_ms()) {
            Some(started) => {
                self.append(Record::RunStarted(Box::new(started)), true)
                    .await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// `session.retract` from `caller`: owner-only.
    pub async fn retract_for(
        &mut self,
        caller: &broca_wire::Caller,
        submission_id: &str,
    ) -> Result<Retracted, ActorError> {
        if !caller.owns(&self.state.owners()) {
            return Err(ActorError::Refused(broca_core::Refusal::ScopeOwnerMismatch));
        }
        self.retract(submission_id).await
    }

    /// Withdraws the queued send `submission_id` before it starts.
    pub async fn retract(&mut self, submission_id: &str) -> Result<Retracted, ActorError> {
        if self
            .state
            .queued
            .iter()
            .any(|q| q.submission_id == submission_id)
        {
            let record = broca_wal::runrec::SendRetracted {
                submission_id: submission_id.to_string(),
                at_unix_ms: crate::now_unix_ms(),
            };
            self.append(Record::SendRetracted(record), true).await?;
            return Ok(Retracted::Retracted);
        }
        if self
            .state
            .runs
            .iter()
            .any(|r| r.submission_id.as_deref() == Some(submission_id))
        {
            return Ok(Retracted::AlreadyStarted);
        }
        Ok(Retracted::NotPending)
    }
}

/// What a `session.retract` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retracted {
    /// The queued send is durably withdrawn and never starts.
    Retracted,
    /// It already started a run.
    AlreadyStarted,
    /// No queued send has that id (nothing was written).
    NotPending,
}

/// What a `run.cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// The active run was told to stop.
    Ack,
    /// No such run is active: nothing was written.
    NotActive,
    /// The run is active, and the caller does not own the session.
    NotOwner,
}
