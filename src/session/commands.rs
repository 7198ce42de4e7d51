//! Person-only commands relayed for the session's owner (llm-runner/v1 §9.10): the actor's
//! part. An invocation is recorded durably before the host forwards it; its first reply is
//! recorded before it is answered; a retry is answered from the records. The forward itself
//! is the host's (it must not hold the actor while the provider answers).

use broca_core::Refusal;
use broca_fetch_plan::commands::{self, Relay};
use broca_protocol::model::ModelClient;
use broca_tools::late::LateRecorded;
use broca_tools::modules::CommandUpdate;
use broca_tools::ToolRunner;
use broca_wal::cmdrec::{CommandReply, UserCommandRecord};
use broca_wal::Record;
use cortexkit_role_llm_runner::user_commands::UserCommandRequest;
use serde_json::Value;

use crate::command::{CommandStep, StatusAnswer};
use crate::{ActorError, SessionActor};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// `session.user_command` of `caller`: a retry's stored reply; a retry of an invocation
    /// recorded and never answered (no forward of this process is under way) recorded
    /// `outcome_unknown` and answered so; a new one recorded durably and handed back to be
    /// forwarded.
    pub async fn user_command(
        &mut self,
        caller: &broca_wire::Caller,
        request: &UserCommandRequest,
    ) -> Result<CommandStep, ActorError> {
        if !caller.owns(&self.state.owners()) {
            return Err(ActorError::Refused(Refusal::ScopeOwnerMismatch));
        }
        let owner = caller.principal.as_deref().unwrap_or("");
        let now = crate::now_unix_ms();
        let relay = commands::relay(
            &self.triple,
            self.state.plan.as_deref(),
            &self.state.commands,
            owner,
            request,
            now,
        )
        .map_err(ActorError::Refused)?;
        match relay {
            Relay::Stored { call_key, reply } => {
                Ok(CommandStep::Answer(commands::answer(&call_key, &reply)))
            }
            Relay::Unanswered { call_key } if self.forwarding.contains(&call_key) => {
                Ok(CommandStep::InFlight)
            }
            Relay::Unanswered { call_key } => {
                let answer = self
                    .command_replied(&call_key, commands::outcome_unknown())
                    .await?;
                Ok(CommandStep::Answer(answer))
            }
            Relay::New {
                call_key,
                provider,
                record,
            } => {
                self.append(Record::UserCommand(Box::new(record)), true)
                    .await?;
                self.forwarding.insert(call_key.clone());
                Ok(CommandStep::Forward {
                    call_key,
                    provider,
                    command: request.command.clone(),
                    scope_epoch: self.writer.header().created_unix_ms,
                })
            }
        }
    }

    /// Records the first reply of `call_key` durably (a reply stored already stands), and
    /// answers the invocation with the stored one.
    pub async fn command_replied(
        &mut self,
        call_key: &str,
        reply: CommandReply,
    ) -> Result<Value, ActorError> {
        self.forwarding.remove(call_key);
        let stored = self
            .state
            .commands
            .get(call_key, u64::MAX)
            .map(|i| i.first.clone());
        let first = match stored {
            None => return Err(ActorError::Refused(Refusal::UnknownInvocation)),
            Some(Some(first)) => first,
            Some(None) => {
                let record = UserCommandRecord::Replied {
                    call_key: call_key.to_string(),
                    reply: reply.clone(),
                    at_unix_ms: crate::now_unix_ms(),
                };
                self.append(Record::UserCommand(Box::new(record)), true)
                    .await?;
                reply
            }
        };
        Ok(commands::answer(call_key, &first))
    }

    /// `session.user_command_status` of `caller`.
    pub fn command_status(
        &self,
        caller: &broca_wire::Caller,
        call_key: &str,
    ) -> Result<StatusAnswer, ActorError> {
        if !caller.owns(&self.state.owners()) {
            return Err(ActorError::Refused(Refusal::ScopeOwnerMismatch));
        }
        let owner = caller.principal.as_deref().unwrap_or("");
        match self.state.commands.get(call_key, crate::now_unix_ms()) {
            Some(i) if i.owner == owner || caller.operator => Ok(StatusAnswer {
                value: i.status(),
                provider: i.awaits_result().then(|| i.provider.clone()),
            }),
            _ => Err(ActorError::Refused(Refusal::UnknownInvocation)),
        }
    }

    /// Records the late entries of an accepted command not recorded yet (each once, by its
    /// event id; nothing after its result); answers whether it still waits for its result.
    pub async fn command_late(
        &mut self,
        call_key: &str,
        entries: Vec<UserCommandRecord>,
    ) -> Result<bool, ActorError> {
        for entry in entries {
            let Some(i) = self.state.commands.get(call_key, u64::MAX) else {
                return Ok(false);
            };
            if !i.awaits_result() {
                break;
            }
            let event_id = match &entry {
                UserCommandRecord::Progress { event_id, .. } => Some(event_id.as_str()),
                UserCommandRecord::Settled { event_id, .. } => event_id.as_deref(),
                _ => continue,
            };
            if entry.call_key() != call_key
                || event_id.is_some_and(|e| self.state.commands.has_entry(call_key, e))
            {
                continue;
            }
            self.append(Record::UserCommand(Box::new(entry)), true)
                .await?;
        }
        Ok(self
            .state
            .commands
            .get(call_key, u64::MAX)
            .is_some_and(|i| i.awaits_result()))
    }

    /// A late entry of a command, as a poll of its module read it (the command's puller or
    /// shard 0's sweep): recorded for the command while it awaits its result, durably before
    /// the entry is acked; read again later when it came before the first reply was recorded.
    pub(crate) async fn command_entry(
        &mut self,
        call_key: &str,
        update: CommandUpdate,
    ) -> Result<LateRecorded, ActorError> {
        let event_id = match &update {
            CommandUpdate::Progress { event_id, .. } | CommandUpdate::Result { event_id, .. } => {
                event_id.clone()
            }
        };
        let Some(i) = self.state.commands.get(call_key, u64::MAX) else {
            return Ok(LateRecorded::NotAwaited);
        };
        if i.first.is_none() && self.forwarding.contains(call_key) {
            // Read before the first reply is recorded: read again once it is.
            return Ok(LateRecorded::NotYet);
        }
        if self.state.commands.has_entry(call_key, &event_id) {
            return Ok(LateRecorded::AlreadyRecorded);
        }
        if !i.awaits_result() {
            return Ok(LateRecorded::NotAwaited);
        }
        let record = update_record(call_key, update, crate::now_unix_ms());
        self.command_late(call_key, vec![record]).await?;
        Ok(LateRecorded::Recorded)
    }
}

/// A command's late update as the record that keeps it.
fn update_record(call_key: &str, update: CommandUpdate, now: u64) -> UserCommandRecord {
    match update {
        CommandUpdate::Progress { event_id, text } => UserCommandRecord::Progress {
            call_key: call_key.to_string(),
            event_id,
            text,
            at_unix_ms: now,
        },
        CommandUpdate::Result {
            event_id,
            reply,
            why,
        } => UserCommandRecord::Settled {
            call_key: call_key.to_string(),
            event_id: Some(event_id),
            reply: match reply {
                Some((state, text, job)) => CommandReply { state, text, job },
                None => CommandReply {
                    state: commands::FAILED.to_string(),
                    text: why,
                    job: None,
                },
            },
            at_unix_ms: now,
        },
    }
}
