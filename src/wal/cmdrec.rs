//! Person-only commands relayed to their provider (llm-runner/v1 §9.10 `user_commands`):
//! the invocation is durable before it is forwarded, then its first reply, any progress and
//! its final result. None of it is a message: reads, history and model requests never see
//! these records.

use serde::{Deserialize, Serialize};

/// How every person-only command's call key begins: a tool module's late entry of such a key
/// is a command's progress or result, never a tool call's.
pub const CALL_KEY_PREFIX: &str = "broca-cmd:";

/// Whether `call_key` is a person-only command's.
pub fn is_command_key(call_key: &str) -> bool {
    call_key.starts_with(CALL_KEY_PREFIX)
}

/// A command's reply as the provider gave it (or broca's own `failed` / `outcome_unknown`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandReply {
    /// `done`, `accepted`, `failed`, `outcome_unknown`, or a state the provider names.
    pub state: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// One step of a relayed command, by its call key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum UserCommandRecord {
    /// Written before the command is forwarded: a command with this record and no reply
    /// may have run.
    Invoked {
        call_key: String,
        /// The caller's id of the invocation, with its principal: the relay's identity.
        invocation_id: String,
        owner: String,
        command: String,
        provider: String,
        at_unix_ms: u64,
    },
    /// The first reply (the provider's, or broca's `failed` when the command was never
    /// forwarded, or `outcome_unknown` when its reply was lost).
    Replied {
        call_key: String,
        reply: CommandReply,
        at_unix_ms: u64,
    },
    /// A non-terminal progress text of an accepted command (its late entry's event id).
    Progress {
        call_key: String,
        event_id: String,
        text: String,
        at_unix_ms: u64,
    },
    /// The terminal result of an accepted command.
    Settled {
        call_key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        event_id: Option<String>,
        reply: CommandReply,
        at_unix_ms: u64,
    },
}

impl UserCommandRecord {
    /// The command's call key.
    pub fn call_key(&self) -> &str {
        match self {
            UserCommandRecord::Invoked { call_key, .. }
            | UserCommandRecord::Replied { call_key, .. }
            | UserCommandRecord::Progress { call_key, .. }
            | UserCommandRecord::Settled { call_key, .. } => call_key,
        }
    }
}
