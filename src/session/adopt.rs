//! A session its host starts, and its adoption (llm-runner/v1 §9.5 `adopt`): the actor's
//! part. Each record is durable before its answer; a refusal writes nothing.

use broca_core::adopt::{self, HostStart};
use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::planrec::FrozenPlan;
use cortexkit_role_llm_runner::adopt::AdoptRequest;
use serde_json::Value;

use crate::{ActorError, SessionActor};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// `session.host_start` (its plan's identity `identity`): without `plan`, a repeat's
    /// answer or [`HostStart::Fetch`]; with the fetched `plan`, recorded and answered.
    pub async fn host_start(
        &mut self,
        caller: &broca_wire::Caller,
        identity: &str,
        plan: Option<Box<FrozenPlan>>,
    ) -> Result<HostStart, ActorError> {
        let step = adopt::host_start(&self.state, caller, identity).map_err(ActorError::Refused)?;
        let (HostStart::Fetch, Some(plan)) = (&step, plan) else {
            return Ok(step);
        };
        let (record, answer) = adopt::host_started(*plan, crate::now_unix_ms());
        self.append_change(Some(record)).await?;
        Ok(HostStart::Answer(answer))
    }

    /// `session.adopt` (its plan's identity `identity`; `required`: a first adoption must
    /// name a storage policy).
    pub async fn adopt(
        &mut self,
        caller: &broca_wire::Caller,
        request: &AdoptRequest,
        identity: &str,
        required: bool,
    ) -> Result<Value, ActorError> {
        let (record, answer) = adopt::adopt(
            &self.state,
            caller,
            request,
            identity,
            required,
            crate::now_unix_ms(),
        )
        .map_err(ActorError::Refused)?;
        self.append_change(record).await?;
        Ok(answer)
    }
}
