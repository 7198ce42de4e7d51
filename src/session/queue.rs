//! A session's queued sends: the next one started once no run is active, and a withdrawal
//! before it starts (owner-only).

use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::Record;

use crate::actor::{ActorError, SessionActor};
use crate::command::Retracted;

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Starts the next waiting send's run once no run is active (its RunStarted durable): an
    /// interrupt, a steer its run left unrendered, or the next queued send; answers whether
    /// one started.
    pub async fn start_queued(&mut self) -> Result<bool, ActorError> {
        let run_id = self.next_id("run");
        let waiting = self.state.queued.len() + self.state.pending_steers.len();
        match broca_core::admission::start_queued(&self.state, run_id, crate::now_unix_ms()) {
            Some(started) => {
                assert!(waiting > 0, "a run starts only from a waiting send");
                self.append(Record::RunStarted(Box::new(started)), true)
                    .await?;
                // A steer rendered at the new run's first step waits on: only one send left.
                assert!(
                    self.state.queued.len() + self.state.pending_steers.len() < waiting,
                    "the started send stops waiting"
                );
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// `session.retract` from `caller`: the owner, or the submission's own sender.
    pub async fn retract_for(
        &mut self,
        caller: &broca_wire::Caller,
        submission_id: &str,
        running: Option<&mut broca_core::machine::RunMachine>,
    ) -> Result<Retracted, ActorError> {
        if !broca_core::admission::may_retract(caller, &self.state, submission_id) {
            return Err(ActorError::Refused(broca_core::Refusal::ScopeOwnerMismatch));
        }
        self.retract(submission_id, running).await
    }

    /// `session.release` from `caller` (llm-runner/v1 `session_retention`): only the
    /// principal that made the session's first send releases it, never its scope's owner
    /// (any caller, where that send was not attested). The `SessionReleased` record is
    /// durable before the answer; a repeat records nothing.
    pub async fn release_for(
        &mut self,
        caller: &broca_wire::Caller,
    ) -> Result<crate::command::Release, ActorError> {
        use crate::command::Release;
        if self.state.is_new() {
            return Ok(Release::Absent);
        }
        // Its adopter, on a session its host started (llm-runner/v1 `adopt`).
        let adopter = self.state.hosting.owner.as_ref().map(|(p, _)| p.as_str());
        let starter = adopter.or(self.state.runs.first().and_then(|r| r.principal.as_deref()));
        if starter.is_some_and(|p| caller.principal.as_deref() != Some(p)) {
            return Err(ActorError::Refused(broca_core::Refusal::ScopeOwnerMismatch));
        }
        if self.state.released.is_none() {
            let record = broca_wal::runrec::SessionReleased {
                at_unix_ms: crate::now_unix_ms(),
                principal: caller.principal.clone(),
            };
            self.append(Record::SessionReleased(record), true).await?;
        }
        let delete_after_ms = self
            .state
            .release_deadline()
            .expect("a released session has a deadline");
        Ok(Release::Pending { delete_after_ms })
    }

    /// Withdraws the queued send `submission_id` before it starts, or the ordered send of that
    /// submission before it goes out (`running`: the run whose boundaries it waits for, which
    /// lets go of it first; one it rendered already is answered as started).
    pub async fn retract(
        &mut self,
        submission_id: &str,
        running: Option<&mut broca_core::machine::RunMachine>,
    ) -> Result<Retracted, ActorError> {
        let waiting = self
            .state
            .pending_steers
            .iter()
            .any(|p| p.record.submission_id.as_deref() == Some(submission_id));
        if waiting && running.is_some_and(|m| !m.withdraw(submission_id)) {
            return Ok(Retracted::AlreadyStarted);
        }
        let queued = &self.state.queued;
        if waiting || queued.iter().any(|q| q.submission_id == submission_id) {
            let record = broca_wal::runrec::SendRetracted {
                submission_id: submission_id.to_string(),
                at_unix_ms: crate::now_unix_ms(),
                ended: None,
            };
            self.append(Record::SendRetracted(record), true).await?;
            return Ok(Retracted::Retracted);
        }
        let runs = &self.state.runs;
        if runs
            .iter()
            .any(|r| r.submission_id.as_deref() == Some(submission_id))
        {
            return Ok(Retracted::AlreadyStarted);
        }
        Ok(Retracted::NotPending)
    }
}
