//! Mid-session changes (llm-runner/v1 §10.2 `session_change`): the actor's part. A refresh
//! is classified here before its plan is fetched (the host fetches it, as admission does)
//! and accepted here after, durable before its answer; a rung change and a flush likewise.
//! Owner-only, like `session.baseline`.

use broca_core::Refusal;
use broca_fetch_plan::change;
use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::planrec::FrozenPlan;
use broca_wal::Record;
use cortexkit_role_llm_runner::session_change::{RefreshPolicyRequest, RefreshRequest};
use serde_json::Value;

use crate::command::RefreshStep;
use crate::{ActorError, SessionActor};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    fn owner_only(&self, caller: &broca_wire::Caller) -> Result<(), ActorError> {
        if caller.owns(&self.state.owners()) {
            Ok(())
        } else {
            Err(ActorError::Refused(Refusal::ScopeOwnerMismatch))
        }
    }

    /// Appends a change record (a plan's, a host's start, an adoption), durable before the
    /// answer that follows; none for a repeat.
    pub(crate) async fn append_change(
        &mut self,
        record: Option<broca_wal::changerec::SessionChangeRecord>,
    ) -> Result<(), ActorError> {
        match record {
            Some(r) => self.append(Record::SessionChange(Box::new(r)), true).await,
            None => Ok(()),
        }
    }

    /// The tools digest the session's latest run offered (what a plan-less session offers).
    fn current_tools(&self) -> String {
        self.state
            .runs
            .last()
            .map(|r| r.config.tools_digest.clone())
            .unwrap_or_default()
    }

    /// `session.refresh`: without `plan`, a repeat's answer or [`RefreshStep::Fetch`]; with
    /// the fetched plan, accepted (its record durable) and answered.
    pub async fn refresh(
        &mut self,
        caller: &broca_wire::Caller,
        request: &RefreshRequest,
        identity: &str,
        plan: Option<Box<FrozenPlan>>,
    ) -> Result<RefreshStep, ActorError> {
        self.owner_only(caller)?;
        let changes = &self.state.change;
        let (generation, policy) = (request.generation, request.policy.as_str());
        let Some(plan) = plan else {
            return match change::order(changes, generation, identity, policy) {
                Ok(change::Refresh::Repeat(answer)) => Ok(RefreshStep::Answer(answer)),
                Ok(change::Refresh::Fetch) => Ok(RefreshStep::Fetch),
                Err(r) => Err(ActorError::Refused(r)),
            };
        };
        let (record, answer) = change::accept(
            changes,
            self.state.plan.as_deref(),
            &self.current_tools(),
            (generation, policy),
            *plan,
            self.state.open.is_some(),
            crate::now_unix_ms(),
        )
        .map_err(ActorError::Refused)?;
        self.append_change(record).await?;
        Ok(RefreshStep::Answer(answer))
    }

    /// `session.refresh_policy`.
    pub async fn refresh_policy(
        &mut self,
        caller: &broca_wire::Caller,
        request: &RefreshPolicyRequest,
    ) -> Result<Value, ActorError> {
        self.owner_only(caller)?;
        let (record, answer) = change::refresh_policy(
            &self.state.change,
            self.state.plan.as_deref(),
            &self.current_tools(),
            (request.generation, &request.policy, &request.send_id),
            crate::now_unix_ms(),
        )
        .map_err(ActorError::Refused)?;
        self.append_change(record).await?;
        Ok(answer)
    }

    /// `session.flush_prefix`.
    pub async fn flush_prefix(
        &mut self,
        caller: &broca_wire::Caller,
        send_id: &str,
    ) -> Result<Value, ActorError> {
        self.owner_only(caller)?;
        let (record, answer) = change::flush_prefix(
            &self.state.change,
            self.state.plan.as_deref(),
            send_id,
            crate::now_unix_ms(),
        );
        self.append_change(record).await?;
        Ok(answer)
    }
}
