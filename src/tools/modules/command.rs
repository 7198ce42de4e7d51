//! Person-only commands forwarded to their tool module (tool-provider/v1 §4.2): one
//! `user_command.invoke` on the session's own route, at most once (twice only when the
//! daemon says the first never reached the module), answered within
//! [`COMMAND_REPLY_DEADLINE`]; an accepted command's progress and result come as late
//! entries of its call key (a key of `broca_wal::cmdrec::CALL_KEY_PREFIX`), which every poll
//! of the module hands to the command's session to record before they are acked.

use std::time::Duration;

use broca_subc::toolprov::command::{self, Invoked};
use broca_subc::toolprov::late::LateEntry;

use super::{ModuleTools, NotSent};

/// How long a module has for a command's first reply (the role's 5 s, with room for the
/// daemon's hops); past it the request is cancelled and the command may have run.
pub const COMMAND_REPLY_DEADLINE: Duration = Duration::from_secs(10);

/// What became of a forwarded command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarded {
    /// The module's reply: its state, text and job.
    Reply {
        state: String,
        text: String,
        job: Option<String>,
    },
    /// Nothing reached the module, or it refused the request: the command did not run.
    NotRun(String),
    /// The module may have the request and its reply was lost: the command may have run.
    Lost(String),
}

pub use crate::late::CommandUpdate;

impl ModuleTools {
    /// Forwards `command` with the person's `input` to `module` on the route of session
    /// `(project_root, harness, session)` (under its scope of `scope_epoch`), keyed by
    /// `call_key`. Runs on a glommio executor.
    pub async fn user_command(
        &self,
        module: &str,
        session: (&str, &str, &str),
        scope_epoch: u64,
        call_key: &str,
        invocation: (&str, &str),
    ) -> Forwarded {
        let (project_root, harness, session) = session;
        let (command, input) = invocation;
        let body = command::invoke_body(command, input, call_key);
        let rkey = (
            module.to_string(),
            project_root.to_string(),
            harness.to_string(),
            session.to_string(),
            None,
        );
        let mut not_delivered = String::new();
        for _ in 0..2 {
            let route = match self
                .route(module, project_root, harness, session, Some(scope_epoch))
                .await
            {
                Ok(r) => r,
                Err(NotSent::Refused(why)) => return Forwarded::NotRun(why),
                Err(NotSent::Indeterminate(why)) => return Forwarded::Lost(why),
            };
            let frame = match self
                .send(&route, body.clone(), COMMAND_REPLY_DEADLINE, None)
                .await
            {
                Ok(f) => f,
                Err(NotSent::Refused(why)) => {
                    self.evict(&rkey);
                    return Forwarded::NotRun(why);
                }
                Err(NotSent::Indeterminate(why)) => {
                    self.evict(&rkey);
                    return Forwarded::Lost(why);
                }
            };
            match command::read_invoke(module, &frame) {
                Invoked::Reply(r) => {
                    return Forwarded::Reply {
                        state: r.state,
                        text: r.text,
                        job: r.job,
                    }
                }
                Invoked::Refused { code, message } => {
                    return Forwarded::NotRun(format!(
                        "tool module `{module}` refused the command ({code}): {message}"
                    ))
                }
                Invoked::Lost(why) => return Forwarded::Lost(why),
                Invoked::NotDelivered(code) => {
                    self.evict(&rkey);
                    not_delivered = code;
                }
            }
        }
        Forwarded::NotRun(format!(
            "tool module `{module}`'s route stayed dead ({not_delivered}); the command was never \
             delivered"
        ))
    }

    /// Reads `module`'s late results once, unless a poll is under way: each entry of a
    /// person-only command is handed to its session (the late-result sink), which records it
    /// for the command before the entry is acked. Runs on a glommio executor.
    pub async fn poll_commands(&self, module: &str) {
        if self.late.try_poll(module) {
            self.poll_late(module).await;
            self.late.polled(module);
        }
    }
}

/// A command's late entry as an update; a kind that is neither progress nor terminal is
/// none.
pub(super) fn update(e: &LateEntry) -> Option<CommandUpdate> {
    use broca_subc::toolprov::late::{settle, Settled};
    if e.kind == "progress" {
        return Some(CommandUpdate::Progress {
            event_id: e.event_id.clone(),
            text: e.text.clone().unwrap_or_default(),
        });
    }
    let reply = e
        .result
        .as_ref()
        .and_then(|r| {
            serde_json::from_value::<cortexkit_role_tool_provider::user_command::UserCommandReply>(
                r.clone(),
            )
            .ok()
        })
        .map(|r| (r.state, r.text, r.job));
    let why = match settle("", e) {
        Settled::NotStarted(reason) => format!("the module says the command never ran: {reason}"),
        Settled::Expired => "the module let the command's result expire".to_string(),
        Settled::Note(_) => return None,
        Settled::Answer(_) => "the module settled the command with a result that is not a \
            command reply"
            .to_string(),
    };
    Some(CommandUpdate::Result {
        event_id: e.event_id.clone(),
        reply,
        why,
    })
}
