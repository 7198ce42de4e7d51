//! Person-only commands relayed for a session's owner (llm-runner/v1 §9.10
//! `user_commands`): `session.user_command` and `session.user_command_status`. The session's
//! actor records the invocation durably and hands it back; it is forwarded here (the actor
//! is never held while the provider answers), its first reply recorded by the actor before
//! the answer. An accepted command's module is polled every [`PULL_EVERY`] for at most
//! [`PULL_FOR`]: each progress and result it reads is recorded in the session (the late sink,
//! `late.rs`) before it is acked, whichever poll reads it (shard 0's sweep too).

use std::time::{Duration, Instant};

use broca_core::Refusal;
use broca_fetch_plan::commands::{never_forwarded, outcome_unknown, ACCEPTED, FAILED};
use broca_session::{CommandStep, SessionCommand};
use broca_tools::modules::{Forwarded, COMMAND_REPLY_DEADLINE};
use broca_wal::cmdrec::{CommandReply, UserCommandRecord};
use broca_wal::SessionTriple;
use broca_wire::{Caller, RpcError};
use cortexkit_role_llm_runner::user_commands::UserCommandRequest;
use serde_json::Value;

use crate::replies::ask;
use crate::Host;

/// How often an accepted command's module is asked for its late entries (the role's 2–10 s).
pub const PULL_EVERY: Duration = Duration::from_secs(2);
/// How long an accepted command's result is waited for.
pub const PULL_FOR: Duration = Duration::from_secs(3600);
/// How often a retry of a command being forwarded asks again.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(100);

/// `session.user_command`.
pub(crate) async fn user_command(
    ctx: &std::sync::Arc<Host>,
    t: SessionTriple,
    request: Box<UserCommandRequest>,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(RpcError::refusal(&Refusal::UserCommandsUnsupported));
    }
    let until = Instant::now() + COMMAND_REPLY_DEADLINE * 3;
    loop {
        let (asked, caller) = (request.clone(), caller.clone());
        let step = ask(ctx, t.clone(), |reply| SessionCommand::UserCommand {
            request: asked,
            caller,
            reply,
        })
        .await??;
        let (call_key, provider, command, scope_epoch) = match step {
            CommandStep::Answer(answer) => return Ok(answer),
            CommandStep::InFlight if Instant::now() < until => {
                glommio::timer::sleep(IN_FLIGHT_POLL).await;
                continue;
            }
            CommandStep::InFlight => return Err(crate::replies::unavailable()),
            CommandStep::Forward {
                call_key,
                provider,
                command,
                scope_epoch,
            } => (call_key, provider, command, scope_epoch),
        };
        track(ctx, &call_key, Some(&t));
        let reply = forward(
            ctx,
            &t,
            (&provider, &command, &request.input),
            &call_key,
            scope_epoch,
        )
        .await;
        COMMANDS.add(state_label(&reply.state));
        let accepted = reply.state == ACCEPTED;
        let answer = ask(ctx, t.clone(), |reply_tx| SessionCommand::CommandReplied {
            call_key: call_key.clone(),
            answer: reply,
            reply: reply_tx,
        })
        .await??;
        if accepted {
            start_pull(ctx, t, provider, call_key);
        } else {
            track(ctx, &call_key, None);
        }
        return Ok(answer);
    }
}

/// Forwarded commands by the state of their first reply: `broca_user_commands_total`.
static COMMANDS: crate::tally::Tally = crate::tally::Tally::new();

/// A first reply's state as its label: the role's states, any other a provider names as
/// `other` (the label's values stay few).
fn state_label(state: &str) -> &'static str {
    use cortexkit_role_llm_runner::user_commands::OUTCOME_UNKNOWN;
    match state {
        "done" => "done",
        ACCEPTED => "accepted",
        FAILED => "failed",
        OUTCOME_UNKNOWN => "outcome_unknown",
        _ => "other",
    }
}

/// The commands by state, as `health.check`'s metrics carry them.
pub(crate) fn tally_json() -> serde_json::Value {
    COMMANDS.json()
}

/// The commands' family, in the Prometheus text format.
pub(crate) fn exposition() -> String {
    COMMANDS.render(
        "broca_user_commands_total",
        "Person-only commands forwarded to their provider, by the state of their first reply (done, accepted, failed, outcome_unknown, other).",
        "state",
    )
}

/// Forwards the recorded invocation and answers the reply to record: the module's, `failed`
/// when nothing reached it, `outcome_unknown` when its reply was lost.
async fn forward(
    ctx: &Host,
    t: &SessionTriple,
    (provider, command, input): (&str, &str, &str),
    call_key: &str,
    scope_epoch: u64,
) -> CommandReply {
    let Some(tools) = &ctx.module_tools else {
        return never_forwarded("this broca reaches no tool modules (module mode only)");
    };
    let session = (
        t.project_root.as_str(),
        t.harness.as_str(),
        t.session.as_str(),
    );
    let forwarded = tools
        .user_command(provider, session, scope_epoch, call_key, (command, input))
        .await;
    let reply = match forwarded {
        Forwarded::Reply { state, text, job } => CommandReply { state, text, job },
        Forwarded::NotRun(why) => {
            tracing::info!(session = %t.address(), command, provider, "user command not run: {why}");
            return never_forwarded(&why);
        }
        Forwarded::Lost(why) => {
            tracing::warn!(session = %t.address(), command, provider, "user command's reply lost: {why}");
            outcome_unknown()
        }
    };
    // A crash test's cut: the module has the command, its reply is not recorded yet.
    broca_crash_points::reached("user_command_forwarded");
    reply
}

/// `session.user_command_status`. A command still accepted that no puller of this process
/// waits for (a restart came between) is pulled again from here.
pub(crate) async fn status(
    ctx: &std::sync::Arc<Host>,
    t: SessionTriple,
    call_key: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if !ctx.opts.plans {
        return Err(RpcError::refusal(&Refusal::UserCommandsUnsupported));
    }
    let caller = caller.clone();
    let key = call_key.clone();
    let status = ask(ctx, t.clone(), |reply| SessionCommand::CommandStatus {
        call_key: key,
        caller,
        reply,
    })
    .await??;
    if let (Some(ACCEPTED), Some(provider)) =
        (status.value["state"].as_str(), status.provider.clone())
    {
        start_pull(ctx, t, provider, call_key);
    }
    Ok(status.value)
}

/// Notes (or forgets) the session of a command being forwarded or pulled, where the late sink
/// finds it.
fn track(ctx: &Host, call_key: &str, session: Option<&SessionTriple>) {
    if let Ok(mut m) = ctx.command_sessions.lock() {
        match session {
            Some(t) => m.insert(call_key.to_string(), t.clone()),
            None => m.remove(call_key),
        };
    }
}

/// Starts pulling an accepted command's late entries, unless this process pulls them already.
fn start_pull(ctx: &std::sync::Arc<Host>, t: SessionTriple, provider: String, call_key: String) {
    let fresh = ctx
        .command_pulls
        .lock()
        .is_ok_and(|mut p| p.insert(call_key.clone()));
    if !fresh || ctx.module_tools.is_none() {
        return;
    }
    track(ctx, &call_key, Some(&t));
    let host = std::sync::Arc::downgrade(ctx);
    glommio::spawn_local(async move {
        pull(host.clone(), t, provider, call_key.clone()).await;
        if let Some(ctx) = host.upgrade() {
            if let Ok(mut p) = ctx.command_pulls.lock() {
                p.remove(&call_key);
            }
            track(&ctx, &call_key, None);
        }
    })
    .detach();
}

/// Pulls an accepted command's late entries from its module until its result is recorded,
/// the session no longer takes them, or [`PULL_FOR`] passes (then the person is told, as
/// the command's last progress, that no result came in that time).
async fn pull(host: std::sync::Weak<Host>, t: SessionTriple, provider: String, call_key: String) {
    let until = Instant::now() + PULL_FOR;
    loop {
        glommio::timer::sleep(PULL_EVERY).await;
        let Some(ctx) = host.upgrade() else { return };
        let Some(tools) = ctx.module_tools.clone() else {
            return;
        };
        // Each entry read is recorded in the session before it is acked (the late sink).
        tools.poll_commands(&provider).await;
        let now = broca_session::now_unix_ms();
        let mut entries = Vec::new();
        let over = Instant::now() >= until;
        if over {
            entries.push(UserCommandRecord::Settled {
                call_key: call_key.clone(),
                event_id: None,
                reply: CommandReply {
                    state: FAILED.to_string(),
                    text: format!(
                        "No result arrived from `{provider}` within {} minutes; the command may \
                         still be running there.",
                        PULL_FOR.as_secs() / 60
                    ),
                    job: None,
                },
                at_unix_ms: now,
            });
        }
        let key = call_key.clone();
        let waits = match ask(&ctx, t.clone(), |reply| SessionCommand::CommandLate {
            call_key: key,
            entries,
            reply,
        })
        .await
        {
            Ok(Ok(waits)) => waits,
            Ok(Err(e)) => {
                tracing::warn!(session = %t.address(), %call_key, "user command's wait not recorded: {}", e.message);
                !over
            }
            Err(_) => !over,
        };
        if !waits || over || ctx.is_stopping() {
            return;
        }
    }
}
