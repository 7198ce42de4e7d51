//! Person-only commands relayed for a session's owner (llm-runner/v1 §9.10 `user_commands`),
//! sans-IO: the commands a session froze with its plan, each invocation as the WAL tells it
//! (`user_command` records, broca_wal::cmdrec), what a `session.user_command` comes to
//! before anything is written ([`relay`]), and the status answer.
//!
//! An invocation is durable before it is forwarded. One forwarded whose reply was not stored
//! (a crash, a lost connection, no answer in time) ends `outcome_unknown`: the command may
//! have run, and it is never forwarded again. One never forwarded ends `failed`. Nothing of
//! a command, its reply or its progress is a message: reads, history and the model's
//! requests never carry them.

use std::collections::{BTreeMap, HashMap};

use broca_wal::cmdrec::{CommandReply, UserCommandRecord};
use broca_wal::planrec::FrozenPlan;
use broca_wal::SessionTriple;
use broca_wire::Refusal;
use cortexkit_role_llm_runner::user_commands::{UserCommandRequest, OUTCOME_UNKNOWN};
use serde_json::{json, Value};

/// A reply's state for a command that never reached its provider.
pub const FAILED: &str = "failed";
/// A first reply whose result comes later (late results).
pub const ACCEPTED: &str = "accepted";
/// The text of a command whose reply was lost after it was forwarded.
pub const OUTCOME_UNKNOWN_TEXT: &str = "The command was sent to its provider, but its reply \
    was lost: it may have run. Check before running it again.";
/// Progress texts a status answers at most (the latest ones), and their bytes at most.
pub const PROGRESS_KEPT: usize = 20;
pub const PROGRESS_BYTES: usize = 64 * 1024;
/// How long an invocation's state is kept after its terminal result.
pub const RETAINED_MS: u64 = 24 * 3600 * 1000;

/// One relayed command, as the WAL tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub command: String,
    pub provider: String,
    pub owner: String,
    pub invocation_id: String,
    /// Its first reply, once stored.
    pub first: Option<CommandReply>,
    /// Progress of an accepted command: each text with its late entry's event id.
    pub progress: Vec<(String, String)>,
    /// The terminal result of an accepted command.
    pub result: Option<CommandReply>,
    /// When it reached a terminal state (its first reply, unless that was `accepted`).
    pub ended_at_ms: Option<u64>,
}

impl Invocation {
    /// The reply a status answers: the result, else the first reply.
    fn latest(&self) -> Option<&CommandReply> {
        self.result.as_ref().or(self.first.as_ref())
    }

    /// Whether an accepted command still waits for its result.
    pub fn awaits_result(&self) -> bool {
        self.result.is_none() && self.first.as_ref().is_some_and(|r| r.state == ACCEPTED)
    }

    /// The `session.user_command_status` answer: the latest state, the first reply's or the
    /// result's text, the latest progress in order (at most [`PROGRESS_KEPT`] texts and
    /// [`PROGRESS_BYTES`] bytes).
    pub fn status(&self) -> Value {
        let Some(latest) = self.latest() else {
            return json!({"state": ACCEPTED, "text": "", "progress": []});
        };
        let mut kept: Vec<&str> = Vec::new();
        let mut bytes = 0;
        for (_, text) in self.progress.iter().rev().take(PROGRESS_KEPT) {
            if bytes + text.len() > PROGRESS_BYTES {
                break;
            }
            bytes += text.len();
            kept.push(text);
        }
        kept.reverse();
        let mut status = json!({"state": latest.state, "text": latest.text, "progress": kept});
        if let Some(job) = &latest.job {
            status["job"] = json!(job);
        }
        status
    }
}

/// The `session.user_command` answer: the call key and the first stored reply.
pub fn answer(call_key: &str, reply: &CommandReply) -> Value {
    let mut r = json!({"state": reply.state, "text": reply.text});
    if let Some(job) = &reply.job {
        r["job"] = json!(job);
    }
    json!({"call_key": call_key, "reply": r})
}

/// The reply broca stores for a command forwarded whose reply was lost.
pub fn outcome_unknown() -> CommandReply {
    CommandReply {
        state: OUTCOME_UNKNOWN.to_string(),
        text: OUTCOME_UNKNOWN_TEXT.to_string(),
        job: None,
    }
}

/// The reply broca stores for a command that never reached its provider.
pub fn never_forwarded(why: &str) -> CommandReply {
    CommandReply {
        state: FAILED.to_string(),
        text: format!("The command did not reach its provider, so it did not run: {why}"),
        job: None,
    }
}

/// A session's relayed commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserCommands {
    by_key: BTreeMap<String, Invocation>,
    /// `(owner, invocation_id)` → call key: the relay's identity.
    by_invocation: HashMap<(String, String), String>,
}

impl UserCommands {
    /// Applies one record (a record about an invocation the WAL never began is ignored).
    pub fn apply(&mut self, r: &UserCommandRecord) {
        match r {
            UserCommandRecord::Invoked {
                call_key,
                invocation_id,
                owner,
                command,
                provider,
                ..
            } => {
                self.by_invocation
                    .insert((owner.clone(), invocation_id.clone()), call_key.clone());
                self.by_key
                    .entry(call_key.clone())
                    .or_insert_with(|| Invocation {
                        command: command.clone(),
                        provider: provider.clone(),
                        owner: owner.clone(),
                        invocation_id: invocation_id.clone(),
                        first: None,
                        progress: Vec::new(),
                        result: None,
                        ended_at_ms: None,
                    });
            }
            UserCommandRecord::Replied {
                call_key,
                reply,
                at_unix_ms,
            } => {
                if let Some(i) = self.by_key.get_mut(call_key) {
                    if i.first.is_none() {
                        if reply.state != ACCEPTED {
                            i.ended_at_ms = Some(*at_unix_ms);
                        }
                        i.first = Some(reply.clone());
                    }
                }
            }
            UserCommandRecord::Progress {
                call_key,
                event_id,
                text,
                ..
            } => {
                if let Some(i) = self.by_key.get_mut(call_key) {
                    if i.result.is_none() && !i.progress.iter().any(|(e, _)| e == event_id) {
                        i.progress.push((event_id.clone(), text.clone()));
                    }
                }
            }
            UserCommandRecord::Settled {
                call_key,
                reply,
                at_unix_ms,
                ..
            } => {
                if let Some(i) = self.by_key.get_mut(call_key) {
                    if i.result.is_none() {
                        i.result = Some(reply.clone());
                        i.ended_at_ms = Some(*at_unix_ms);
                    }
                }
            }
        }
    }

    /// The invocation of `call_key`, unless its state is past retention at `now_ms`.
    pub fn get(&self, call_key: &str, now_ms: u64) -> Option<&Invocation> {
        self.by_key.get(call_key).filter(|i| {
            i.ended_at_ms
                .is_none_or(|t| now_ms.saturating_sub(t) < RETAINED_MS)
        })
    }

    /// The accepted commands still waiting for their result: call key and provider.
    pub fn awaiting(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_key
            .iter()
            .filter(|(_, i)| i.awaits_result())
            .map(|(k, i)| (k.as_str(), i.provider.as_str()))
    }

    /// Whether a late entry of `event_id` is recorded for `call_key` already.
    pub fn has_entry(&self, call_key: &str, event_id: &str) -> bool {
        self.by_key
            .get(call_key)
            .is_some_and(|i| i.progress.iter().any(|(e, _)| e == event_id) || i.result.is_some())
    }
}

/// The call key of `owner`'s invocation `invocation_id` in the session: the same for every
/// retry of it, never another session's or another owner's.
pub fn call_key(triple: &SessionTriple, owner: &str, invocation_id: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [
        "broca-user-command-v1",
        triple.project_root.as_str(),
        triple.harness.as_str(),
        triple.session.as_str(),
        owner,
        invocation_id,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!(
        "{}{}",
        broca_wal::cmdrec::CALL_KEY_PREFIX,
        &h.finalize().to_hex()[..32]
    )
}

/// What a `session.user_command` comes to, before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relay {
    /// A retry of an invocation whose first reply is stored: that reply, as it was.
    Stored {
        call_key: String,
        reply: CommandReply,
    },
    /// A retry of an invocation recorded and never answered: unless it is being forwarded
    /// now, it may have run and is answered `outcome_unknown`.
    Unanswered { call_key: String },
    /// A new invocation: recorded, then forwarded to `provider`.
    New {
        call_key: String,
        provider: String,
        record: UserCommandRecord,
    },
}

/// What `owner`'s `request` comes to in a session that froze `plan` and relayed `commands`:
/// a retry is answered from the session whatever changed since; a new invocation needs a
/// plan whose person drives it (`no_person`) and a command it froze
/// (`unknown_user_command`).
pub fn relay(
    triple: &SessionTriple,
    plan: Option<&FrozenPlan>,
    commands: &UserCommands,
    owner: &str,
    request: &UserCommandRequest,
    now_ms: u64,
) -> Result<Relay, Refusal> {
    let key = (owner.to_string(), request.invocation_id.clone());
    if let Some(call_key) = commands.by_invocation.get(&key) {
        let call_key = call_key.clone();
        return Ok(
            match commands.by_key.get(&call_key).and_then(|i| i.first.clone()) {
                Some(reply) => Relay::Stored { call_key, reply },
                None => Relay::Unanswered { call_key },
            },
        );
    }
    if plan.is_some_and(|p| !p.interactive) {
        return Err(Refusal::NoPerson);
    }
    let Some(frozen) =
        plan.and_then(|p| p.user_commands.iter().find(|c| c.name == request.command))
    else {
        return Err(Refusal::UnknownUserCommand {
            command: request.command.clone(),
        });
    };
    let call_key = call_key(triple, owner, &request.invocation_id);
    let record = UserCommandRecord::Invoked {
        call_key: call_key.clone(),
        invocation_id: request.invocation_id.clone(),
        owner: owner.to_string(),
        command: frozen.name.clone(),
        provider: frozen.provider.clone(),
        at_unix_ms: now_ms,
    };
    Ok(Relay::New {
        call_key,
        provider: frozen.provider.clone(),
        record,
    })
}
