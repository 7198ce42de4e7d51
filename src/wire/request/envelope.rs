//! A `{method, params}` envelope parsed into its typed [`Request`], method by method, in
//! groups: what names no session of its own, a session's runs, its plan and owners, and the
//! rest. A child of `request`, over its helpers.

use serde_json::{Map, Value};

use super::*;

pub(super) fn parse_envelope(env: Envelope) -> Result<Request, RpcError> {
    let method = Method::parse(&env.method).ok_or_else(|| unknown_method(&env.method))?;
    let mut params = env.params.unwrap_or_default();
    if let Some(request) = sessionless(method, &mut params)? {
        return Ok(request);
    }
    let session = session_name(&mut params)?;
    match method {
        Method::RunStatus
        | Method::RunResult
        | Method::RunCancel
        | Method::RunToolCalls
        | Method::RunsList => run_request(method, session, params),
        Method::SessionUserCommand
        | Method::SessionRefresh
        | Method::SessionRefreshPolicy
        | Method::SessionAdopt
        | Method::SessionHostStart
        | Method::SessionFlushPrefix => plan_request(method, session, params),
        _ => session_request(method, session, params),
    }
}

/// A method that names no session of its own (an import names its own; the build's
/// description; the debug clock; the sessions' list, which filters them): its request, or
/// `None` for a method that names a session.
fn sessionless(
    method: Method,
    params: &mut Map<String, Value>,
) -> Result<Option<Request>, RpcError> {
    let no_session = |params: &mut Map<String, Value>| {
        for key in ["project_root", "harness", "session"] {
            params.remove(key);
        }
    };
    let request = match method {
        Method::SessionImport => return import(std::mem::take(params)).map(Some),
        // The answer is the build's: a session in the params (a route puts its own there) is
        // not asked for, and nothing else is taken.
        Method::RoleDescribe => {
            no_session(params);
            Request::Describe
        }
        Method::DebugAdvanceClock => {
            no_session(params);
            let ms = params
                .remove("ms")
                .and_then(|v| v.as_u64())
                .ok_or_else(|| {
                    invalid("`ms` (a count of milliseconds) is required").with_field("ms")
                })?;
            Request::AdvanceClock { ms }
        }
        // Filters, not a session: a route (which names one) cannot list the others.
        Method::SessionsList => {
            if params.contains_key("session") {
                return Err(invalid(
                    "sessions.list names no session: it lists them (filters: project_root, \
                     harness, state, since_ms), and is not served on a session's route",
                )
                .with_field("session"));
            }
            let list: Box<lists::SessionsList> = strict(std::mem::take(params), method)?;
            list.check()
                .map_err(|(field, why)| invalid(why).with_field(field))?;
            return Ok(Some(Request::SessionsList { list }));
        }
        _ => return Ok(None),
    };
    no_more(params, method)?;
    Ok(Some(request))
}

/// A method of a session's runs: `run.status`, `run.result`, `run.cancel`,
/// `run.tool_calls`, `runs.list`.
fn run_request(
    method: Method,
    session: SessionName,
    mut params: Map<String, Value>,
) -> Result<Request, RpcError> {
    let request = match method {
        Method::RunStatus => Request::Status {
            run_id: take_str(&mut params, "run_id")?,
            session,
        },
        Method::RunResult => Request::Result {
            run_id: required_run_id(&mut params)?,
            wait_ms: wait_ms(&mut params)?,
            session,
        },
        Method::RunCancel => {
            let at = cancel_at(params.remove("at"))?;
            Request::Cancel {
                run_id: required_run_id(&mut params)?,
                session,
                at,
            }
        }
        Method::RunToolCalls => {
            let calls: Box<ToolCallsRequest> = strict(params, method)?;
            if let Err(field) = calls.check() {
                return Err(invalid("`limit` must be at least 1").with_field(field));
            }
            return Ok(Request::ToolCalls { session, calls });
        }
        _ => {
            assert_eq!(method, Method::RunsList, "a run method is one of these");
            let list: Box<lists::RunsList> = strict(params, method)?;
            list.check()
                .map_err(|(field, why)| invalid(why).with_field(field))?;
            return Ok(Request::RunsList { session, list });
        }
    };
    no_more(&params, method)?;
    Ok(request)
}

/// A method of a session's plan and owners: a person-only command, a refresh and its policy,
/// an adoption, a host's start, a flushed prefix.
fn plan_request(
    method: Method,
    session: SessionName,
    params: Map<String, Value>,
) -> Result<Request, RpcError> {
    use cortexkit_role_llm_runner::session_change::{
        FlushPrefixRequest, RefreshPolicyRequest, RefreshRequest,
    };
    /// `session.host_start`'s params.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct HostStart {
        plan: Map<String, Value>,
    }
    let no_rung = |f| invalid("`policy` names no rung of the role").with_field(f);
    Ok(match method {
        Method::SessionUserCommand => user_command(session, strict(params, method)?)?,
        Method::SessionRefresh => {
            let refresh: Box<RefreshRequest> = strict(params, method)?;
            refresh.check_policy().map_err(no_rung)?;
            Request::Refresh { session, refresh }
        }
        Method::SessionRefreshPolicy => {
            let policy: Box<RefreshPolicyRequest> = strict(params, method)?;
            policy.check_policy().map_err(no_rung)?;
            Request::RefreshPolicy { session, policy }
        }
        Method::SessionAdopt => Request::Adopt {
            session,
            adopt: strict(params, method)?,
        },
        Method::SessionHostStart => {
            let start: Box<HostStart> = strict(params, method)?;
            Request::HostStart {
                session,
                plan: start.plan,
            }
        }
        _ => {
            assert_eq!(
                method,
                Method::SessionFlushPrefix,
                "a plan method is one of these"
            );
            let flush: Box<FlushPrefixRequest> = strict(params, method)?;
            Request::FlushPrefix {
                session,
                send_id: flush.send_id,
            }
        }
    })
}

/// `session.user_command`, its input within its bound and its invocation named.
fn user_command(
    session: SessionName,
    command: Box<cortexkit_role_llm_runner::user_commands::UserCommandRequest>,
) -> Result<Request, RpcError> {
    if command.input.len() > USER_COMMAND_INPUT_MAX {
        return Err(invalid(format!(
            "`input` is {} bytes; a command's input is at most {USER_COMMAND_INPUT_MAX}",
            command.input.len()
        ))
        .with_field("input"));
    }
    if command.invocation_id.is_empty() {
        return Err(invalid("`invocation_id` is empty").with_field("invocation_id"));
    }
    Ok(Request::UserCommand { session, command })
}

/// The other methods of a session: a send, its reads and uploads, its release, a send's
/// status, a retraction.
fn session_request(
    method: Method,
    session: SessionName,
    mut params: Map<String, Value>,
) -> Result<Request, RpcError> {
    let required = |params: &mut Map<String, Value>, key: &'static str| {
        take_str(params, key)?
            .ok_or_else(|| invalid(format!("`{key}` is required")).with_field(key))
    };
    let request = match method {
        Method::SessionSend => {
            role_send_members(&mut params)?;
            let send = strict(params, method)?;
            return Ok(Request::Send { session, send });
        }
        Method::SessionHistory => {
            let history = strict(params, method)?;
            return Ok(Request::History { session, history });
        }
        Method::UploadBegin
        | Method::UploadAppend
        | Method::UploadStatus
        | Method::UploadCommit => {
            let op = uploads::upload(method, params);
            return Ok(Request::Upload { session, op });
        }
        Method::MediaRead => {
            let read = uploads::media_read(params)?;
            return Ok(Request::MediaRead { session, read });
        }
        Method::SessionRead => {
            let read = strict(params, method)?;
            return Ok(Request::Read { session, read });
        }
        Method::SessionBaseline => Request::Baseline { session },
        Method::SessionHead => Request::Head { session },
        Method::DebugArchiveNow => Request::ArchiveNow { session },
        Method::SessionRelease => Request::Release { session },
        Method::SessionUserCommandStatus => Request::UserCommandStatus {
            call_key: required(&mut params, "call_key")?,
            session,
        },
        Method::SessionSendStatus | Method::SendStatus => Request::SendStatus {
            send_id: required(&mut params, "send_id")?,
            session,
        },
        Method::SessionRetract => Request::Retract {
            submission_id: required(&mut params, "submission_id")?,
            named_sender: params.remove("sender").is_some(),
            session,
        },
        other => unreachable!("{} is parsed by its group", other.as_str()),
    };
    no_more(&params, method)?;
    Ok(request)
}
