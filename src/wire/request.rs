//! The management requests: the envelope `{"method", "params"}`, the method names, and each
//! method's parameters, parsed strictly (an unknown parameter is refused by name). One parser
//! for every surface that takes these requests (serve's `/v1/rpc`, the fuzz targets).

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{Code, RpcError, SendRequest};
use cortexkit_role_llm_runner::read::ReadRequest;

/// The management methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    SessionSend,
    SessionRead,
    SessionHead,
    SessionRetract,
    SessionSendStatus,
    SendStatus,
    RunStatus,
    RunResult,
    RunCancel,
    SessionImport,
    RoleDescribe,
    SessionBaseline,
}

impl Method {
    /// Every method, in the order the docs list them.
    pub const ALL: [Method; 12] = [
        Method::SessionSend,
        Method::RunStatus,
        Method::RunResult,
        Method::RunCancel,
        Method::SessionRead,
        Method::SessionHead,
        Method::SessionRetract,
        Method::SessionSendStatus,
        Method::SendStatus,
        Method::SessionImport,
        Method::RoleDescribe,
        Method::SessionBaseline,
    ];

    /// The method's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::SessionSend => "session.send",
            Method::SessionRead => "session.read",
            Method::SessionHead => "session.head",
            Method::SessionRetract => "session.retract",
            Method::SessionSendStatus => "session.send_status",
            Method::SendStatus => "send.status",
            Method::RunStatus => "run.status",
            Method::RunResult => "run.result",
            Method::RunCancel => "run.cancel",
            Method::SessionImport => "session.import",
            Method::RoleDescribe => "role.describe",
            Method::SessionBaseline => "session.baseline",
        }
    }

    /// The method named `name`.
    pub fn parse(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

/// The session a request names: its triple, as given (the WAL's rules check it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionName {
    pub project_root: String,
    pub harness: String,
    pub session: String,
}

/// A parsed management request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Send {
        session: SessionName,
        send: Box<SendRequest>,
    },
    Status {
        session: SessionName,
        run_id: Option<String>,
    },
    Result {
        session: SessionName,
        run_id: String,
    },
    Cancel {
        session: SessionName,
        run_id: String,
    },
    /// llm-runner/v1's `session.read`, its request as the role defines it.
    Read {
        session: SessionName,
        read: Box<ReadRequest>,
    },
    /// llm-runner/v1's `session.head`.
    Head { session: SessionName },
    /// llm-runner/v1's `session.send_status` (also `send.status`): what a re-send of
    /// `send_id` would answer, without acting.
    SendStatus {
        session: SessionName,
        send_id: String,
    },
    /// llm-runner/v1's `session.retract`: withdraw a queued send.
    Retract {
        session: SessionName,
        submission_id: String,
    },
    /// What this build serves of the llm-runner/v1 role (names no session; a route's session,
    /// put in its params, is ignored).
    Describe,
    /// What the session froze (llm-runner/v1's `session.baseline`).
    Baseline { session: SessionName },
    /// Import a log (or every log under a folder): each part of the session not given
    /// comes from the log.
    Import {
        /// `claude-code` or `codex`.
        format: String,
        /// An absolute path, on the daemon's machine.
        path: String,
        project_root: Option<String>,
        harness: Option<String>,
        session: Option<String>,
    },
}

impl Request {
    pub fn method(&self) -> Method {
        match self {
            Request::Send { .. } => Method::SessionSend,
            Request::Status { .. } => Method::RunStatus,
            Request::Result { .. } => Method::RunResult,
            Request::Cancel { .. } => Method::RunCancel,
            Request::Read { .. } => Method::SessionRead,
            Request::Head { .. } => Method::SessionHead,
            Request::Retract { .. } => Method::SessionRetract,
            Request::SendStatus { .. } => Method::SessionSendStatus,
            Request::Import { .. } => Method::SessionImport,
            Request::Describe => Method::RoleDescribe,
            Request::Baseline { .. } => Method::SessionBaseline,
        }
    }

    /// The session the request names (an import may name none: its logs do).
    pub fn session(&self) -> Option<&SessionName> {
        match self {
            Request::Send { session, .. }
            | Request::Status { session, .. }
            | Request::Result { session, .. }
            | Request::Cancel { session, .. }
            | Request::Read { session, .. }
            | Request::Head { session }
            | Request::Retract { session, .. }
            | Request::SendStatus { session, .. }
            | Request::Baseline { session } => Some(session),
            Request::Import { .. } | Request::Describe => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    method: String,
    #[serde(default)]
    params: Option<Map<String, Value>>,
}

fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::new(Code::InvalidParams, why)
}

fn not_an_envelope(e: serde_json::Error) -> RpcError {
    RpcError::new(
        Code::InvalidRequest,
        format!("the body is not a request envelope {{\"method\", \"params\"}}: {e}"),
    )
}

/// Parses a request body: the envelope, the method, and its parameters.
pub fn parse(body: &[u8]) -> Result<Request, RpcError> {
    let env: Envelope = serde_json::from_slice(body).map_err(not_an_envelope)?;
    parse_envelope(env)
}

/// Parses a request that arrived on a route bound to `session` (module mode): the route
/// names the session, so params that name one are refused, and the route's goes in.
pub fn parse_on_route(body: &[u8], session: &SessionName) -> Result<Request, RpcError> {
    let mut v: Value = serde_json::from_slice(body).map_err(not_an_envelope)?;
    let Some(obj) = v.as_object_mut() else {
        return Err(RpcError::new(
            Code::InvalidRequest,
            "the body is not an object",
        ));
    };
    let Value::Object(params) = obj
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()))
    else {
        return Err(invalid("`params` is not an object").with_field("params"));
    };
    for key in ["project_root", "harness", "session"] {
        if params.contains_key(key) {
            return Err(invalid(format!(
                "`{key}`: a request on a route names no session (the route does)"
            ))
            .with_field(key));
        }
    }
    params.insert("project_root".into(), session.project_root.clone().into());
    params.insert("harness".into(), session.harness.clone().into());
    params.insert("session".into(), session.session.clone().into());
    let env: Envelope = serde_json::from_value(v).map_err(not_an_envelope)?;
    parse_envelope(env)
}

fn parse_envelope(env: Envelope) -> Result<Request, RpcError> {
    let method = Method::parse(&env.method).ok_or_else(|| unknown_method(&env.method))?;
    let mut params = env.params.unwrap_or_default();
    if method == Method::SessionImport {
        return import(params);
    }
    if method == Method::RoleDescribe {
        // The answer is the build's: a session in the params (a route puts its own there) is
        // not asked for, and nothing else is taken.
        for key in ["project_root", "harness", "session"] {
            params.remove(key);
        }
        no_more(&params, method)?;
        return Ok(Request::Describe);
    }
    let session = session_name(&mut params)?;
    let request = match method {
        Method::SessionSend => {
            role_send_members(&mut params)?;
            let send = strict(params, method)?;
            return Ok(Request::Send { session, send });
        }
        Method::RunStatus => Request::Status {
            run_id: take_str(&mut params, "run_id")?,
            session,
        },
        Method::RunResult => Request::Result {
            run_id: required_run_id(&mut params)?,
            session,
        },
        Method::RunCancel => {
            cancel_at(params.remove("at"))?;
            Request::Cancel {
                run_id: required_run_id(&mut params)?,
                session,
            }
        }
        // Parsed above (they name no session of their own).
        Method::SessionImport => return import(params),
        Method::RoleDescribe => Request::Describe,
        Method::SessionBaseline => Request::Baseline { session },
        Method::SessionRead => {
            let read = strict(params, method)?;
            return Ok(Request::Read { session, read });
        }
        Method::SessionHead => Request::Head { session },
        Method::SessionSendStatus | Method::SendStatus => Request::SendStatus {
            send_id: take_str(&mut params, "send_id")?
                .ok_or_else(|| invalid("`send_id` is required").with_field("send_id"))?,
            session,
        },
        Method::SessionRetract => Request::Retract {
            submission_id: take_str(&mut params, "submission_id")?.ok_or_else(|| {
                invalid("`submission_id` is required").with_field("submission_id")
            })?,
            session,
        },
    };
    no_more(&params, method)?;
    Ok(request)
}

/// The refusal of a method this build does not know, listing those it does.
fn unknown_method(name: &str) -> RpcError {
    let known: Vec<&str> = Method::ALL.iter().map(|m| m.as_str()).collect();
    RpcError::new(
        Code::UnknownMethod,
        format!(
            "unknown method `{}` (known: {})",
            name.escape_debug(),
            known.join(", ")
        ),
    )
}

/// A cancel's `at`: `now` (what an absent one means): broca stops a run at once.
fn cancel_at(at: Option<Value>) -> Result<(), RpcError> {
    match at {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(at)) if at == "now" => Ok(()),
        Some(other) => Err(invalid(format!(
            "`at` must be now (the only cancellation point broca serves), not {other}"
        ))
        .with_field("at")),
    }
}

/// The llm-runner/v1 members of a send that broca takes or refuses by the role's rules,
/// taken out of `params`: `delivery` (a string; `queue`, what an absent one means, is the
/// mode broca serves; `steer` and `interrupt` are refused `delivery_unsupported`, an unknown
/// mode or a list `invalid_params`), `stop_when.max_steps` (broca's `max_steps`),
/// `generation.max_output_tokens` (checked here, so a refusal names it) and `plan` (broca
/// admits no plans).
fn role_send_members(params: &mut Map<String, Value>) -> Result<(), RpcError> {
    delivery(params.remove("delivery"))?;
    if params.contains_key("max_input_tokens") {
        return Err(
            invalid("the session's input cap is sent as `budget.max_input_tokens`")
                .with_field("max_input_tokens"),
        );
    }
    // The role's `budget` is closed: of its members broca keeps the session's input cap.
    let input_cap = match params.remove("budget") {
        None => None,
        Some(budget) => role_budget(budget)?,
    };
    let run_budget = stop_when(params)?;
    if !run_budget.is_empty() {
        params.insert("budget".into(), Value::Object(run_budget));
    }
    if let Some(cap) = input_cap {
        params.insert("max_input_tokens".into(), cap.into());
    }
    generation(params.get("generation"))?;
    no_plan(params.get("plan"))
}

/// `delivery`: a string; `queue`, what an absent one means, is the mode broca serves.
fn delivery(given: Option<Value>) -> Result<(), RpcError> {
    match given {
        None | Some(Value::Null) => {}
        Some(Value::String(mode)) if mode == "queue" => {}
        Some(Value::String(mode)) if mode == "steer" || mode == "interrupt" => {
            return Err(RpcError::new(
                Code::DeliveryUnsupported,
                format!("this runner does not serve the `{mode}` delivery mode"),
            )
            .with_detail("delivery", Value::String(mode)));
        }
        Some(Value::Array(_)) => {
            return Err(invalid(
                "a list of delivery modes needs the delivery_order group, which this runner \
                 does not declare",
            )
            .with_field("delivery"))
        }
        Some(other) => {
            return Err(
                invalid(format!("`delivery` must be queue, not {other}")).with_field("delivery")
            )
        }
    }
    Ok(())
}

/// `stop_when`: `max_steps` (broca's `max_steps`, moved into `params`), and the run's token
/// and cost budgets, answered as broca's `budget`.
fn stop_when(params: &mut Map<String, Value>) -> Result<Map<String, Value>, RpcError> {
    // `stop_when.max_steps` is the role's spelling of broca's `max_steps`; the run's token
    // and cost budgets are broca's own stop conditions beside it.
    let mut run_budget = Map::new();
    match params.remove("stop_when") {
        None => {}
        Some(Value::Object(mut stop)) => {
            let steps = stop.remove("max_steps");
            for name in ["max_total_tokens", "max_cost_micros"] {
                match stop.remove(name) {
                    None => {}
                    Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {
                        run_budget.insert(name.into(), Value::Number(n));
                    }
                    Some(other) => {
                        return Err(invalid(format!(
                            "`stop_when.{name}` must be a positive integer, not {other}"
                        ))
                        .with_field(format!("stop_when.{name}")))
                    }
                }
            }
            if let Some(other) = stop.keys().next() {
                return Err(invalid(format!(
                    "`stop_when.{other}` is not a stop condition broca takes"
                ))
                .with_field(format!("stop_when.{other}")));
            }
            match steps {
                None => {}
                Some(Value::Number(n))
                    if n.as_u64().is_some_and(|n| n > 0 && n <= u32::MAX as u64) =>
                {
                    if params.contains_key("max_steps") {
                        return Err(invalid(
                            "`max_steps` and `stop_when.max_steps` name the same limit: send one",
                        )
                        .with_field("stop_when.max_steps"));
                    }
                    params.insert("max_steps".into(), Value::Number(n));
                }
                Some(other) => {
                    return Err(invalid(format!(
                        "`stop_when.max_steps` must be a positive integer, not {other}"
                    ))
                    .with_field("stop_when.max_steps"))
                }
            }
        }
        Some(other) => {
            return Err(
                invalid(format!("`stop_when` must be an object, not {other}"))
                    .with_field("stop_when"),
            )
        }
    }
    Ok(run_budget)
}

/// `generation.max_output_tokens`, checked here so that a refusal names it.
fn generation(given: Option<&Value>) -> Result<(), RpcError> {
    match given {
        None => {}
        Some(Value::Object(g)) => match g.get("max_output_tokens") {
            None => {}
            Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => {}
            Some(other) => {
                return Err(invalid(format!(
                    "`generation.max_output_tokens` must be a positive integer, not {other}"
                ))
                .with_field("generation.max_output_tokens"))
            }
        },
        Some(other) => {
            return Err(
                invalid(format!("`generation` must be an object, not {other}"))
                    .with_field("generation"),
            )
        }
    }
    Ok(())
}

/// A `plan`: broca admits none.
fn no_plan(given: Option<&Value>) -> Result<(), RpcError> {
    if let Some(plan) = given {
        let output_refs = plan
            .get("tool_items")
            .and_then(Value::as_array)
            .is_some_and(|items| items.iter().any(|i| i.get("output_refs").is_some()));
        let field = if output_refs {
            "plan.tool_items[].output_refs"
        } else {
            "plan"
        };
        return Err(invalid(format!(
            "this runner admits no fetch plan (`{field}`); a send names its tools in `tools`"
        ))
        .with_field(field));
    }
    Ok(())
}

/// The role's `budget` of a send: a closed object whose members are `nudges`,
/// `finalize_at_tool_calls`, `finalize_text` and `max_input_tokens` (each `nudges[]` element
/// `at_tool_calls` and `text`); an unknown member is refused by its full path. broca keeps
/// the session's input cap (a u64 of at least 1, answered here); it nudges and finalizes
/// nothing, so those members are refused by name rather than ignored. broca's own run
/// budgets moved to `stop_when`, and a refusal says so.
fn role_budget(budget: Value) -> Result<Option<u64>, RpcError> {
    let Value::Object(budget) = budget else {
        return Err(
            invalid(format!("`budget` must be an object, not {budget}")).with_field("budget")
        );
    };
    const MEMBERS: [&str; 4] = [
        "nudges",
        "finalize_at_tool_calls",
        "finalize_text",
        "max_input_tokens",
    ];
    for key in budget.keys() {
        if !MEMBERS.contains(&key.as_str()) {
            let why = match key.as_str() {
                "max_total_tokens" | "max_cost_micros" => {
                    format!("a run's `{key}` is a stop condition: send it as `stop_when.{key}`")
                }
                _ => format!(
                    "`budget.{}` is not a budget member (known: {})",
                    key.escape_debug(),
                    MEMBERS.join(", ")
                ),
            };
            return Err(invalid(why).with_field(format!("budget.{key}")));
        }
    }
    if let Some(nudges) = budget.get("nudges") {
        let Value::Array(list) = nudges else {
            return Err(invalid("`budget.nudges` must be a list").with_field("budget.nudges"));
        };
        for (i, nudge) in list.iter().enumerate() {
            let Value::Object(nudge) = nudge else {
                return Err(invalid(format!("`budget.nudges[{i}]` must be an object"))
                    .with_field(format!("budget.nudges[{i}]")));
            };
            if let Some(k) = nudge
                .keys()
                .find(|k| !["at_tool_calls", "text"].contains(&k.as_str()))
            {
                return Err(invalid(format!(
                    "`budget.nudges[{i}].{}` is not a nudge member (known: at_tool_calls, text)",
                    k.escape_debug()
                ))
                .with_field(format!("budget.nudges[{i}].{k}")));
            }
        }
    }
    for member in ["nudges", "finalize_at_tool_calls", "finalize_text"] {
        if budget.contains_key(member) {
            return Err(invalid(format!(
                "this runner does not serve `budget.{member}`; a send's budget here is its \
                 `max_input_tokens`"
            ))
            .with_field(format!("budget.{member}")));
        }
    }
    match budget.get("max_input_tokens") {
        None => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => Ok(n.as_u64()),
        Some(other) => Err(invalid(format!(
            "`budget.max_input_tokens` must be an integer of at least 1, not {other}"
        ))
        .with_field("budget.max_input_tokens")),
    }
}

/// Refuses a parameter the method does not take, by name.
fn no_more(params: &Map<String, Value>, method: Method) -> Result<(), RpcError> {
    match params.keys().next() {
        Some(k) => Err(invalid(format!(
            "unknown parameter `{}` for {}",
            k.escape_debug(),
            method.as_str()
        ))
        .with_field(k.as_str())),
        None => Ok(()),
    }
}

/// A role request decoded strictly from `params`; a refusal names the field at fault (an
/// unknown one, or the first whose value the request type refuses).
fn strict<T: serde::de::DeserializeOwned>(
    params: Map<String, Value>,
    method: Method,
) -> Result<Box<T>, RpcError> {
    match serde_json::from_value::<T>(Value::Object(params.clone())) {
        Ok(t) => Ok(Box::new(t)),
        Err(e) => {
            let field = params
                .iter()
                .find(|(k, v)| {
                    let alone: Map<String, Value> =
                        std::iter::once(((*k).clone(), (*v).clone())).collect();
                    serde_json::from_value::<T>(Value::Object(alone))
                        .err()
                        .is_some_and(|e| !e.to_string().starts_with("missing field"))
                })
                .map(|(k, _)| k.clone());
            let e = invalid(format!("{}: {e}", method.as_str()));
            Err(match field {
                Some(f) => e.with_field(f),
                None => e,
            })
        }
    }
}

/// session.import's parameters: `format`, an absolute `path`, and any of the session's
/// parts.
fn import(mut params: Map<String, Value>) -> Result<Request, RpcError> {
    let format = take_str(&mut params, "format")?.ok_or_else(|| invalid("`format` is required"))?;
    if !matches!(format.as_str(), "claude-code" | "codex") {
        return Err(invalid(format!(
            "`format` must be claude-code or codex, not `{}`",
            format.escape_debug()
        )));
    }
    let path = take_str(&mut params, "path")?.ok_or_else(|| invalid("`path` is required"))?;
    if !path.starts_with('/') {
        return Err(invalid(
            "`path` must be absolute (the daemon's working directory is not yours)",
        ));
    }
    let request = Request::Import {
        format,
        path,
        project_root: take_str(&mut params, "project_root")?,
        harness: take_str(&mut params, "harness")?,
        session: take_str(&mut params, "session")?,
    };
    no_more(&params, Method::SessionImport)?;
    Ok(request)
}

fn take_str(params: &mut Map<String, Value>, key: &str) -> Result<Option<String>, RpcError> {
    match params.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(format!("`{key}` must be a string, not {other}"))),
    }
}

fn required_run_id(params: &mut Map<String, Value>) -> Result<String, RpcError> {
    take_str(params, "run_id")?.ok_or_else(|| invalid("`run_id` is required"))
}

fn session_name(params: &mut Map<String, Value>) -> Result<SessionName, RpcError> {
    let mut part =
        |key: &str| take_str(params, key)?.ok_or_else(|| invalid(format!("`{key}` is required")));
    Ok(SessionName {
        project_root: part("project_root")?,
        harness: part("harness")?,
        session: part("session")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_parses_its_params_strictly() {
        let triple = r#""project_root":"/p","harness":"h","session":"s""#;
        let ok = |body: String| parse(body.as_bytes()).unwrap();
        let r = ok(format!(
            r#"{{"method":"session.read","params":{{{triple},"limit":5}}}}"#
        ));
        assert_eq!(
            r,
            Request::Read {
                session: SessionName {
                    project_root: "/p".into(),
                    harness: "h".into(),
                    session: "s".into()
                },
                read: Box::new(ReadRequest::tail().with_limit(5)),
            }
        );
        assert_eq!(
            ok(format!(
                r#"{{"method":"run.status","params":{{{triple}}}}}"#
            ))
            .method(),
            Method::RunStatus
        );
        for (body, code) in [
            (
                format!(r#"{{"method":"run.result","params":{{{triple}}}}}"#),
                "invalid_params",
            ),
            (
                format!(r#"{{"method":"run.status","params":{{{triple},"x":1}}}}"#),
                "invalid_params",
            ),
            (
                format!(r#"{{"method":"nope","params":{{{triple}}}}}"#),
                "unknown_method",
            ),
            (r#"{"method":"run.status"}"#.to_string(), "invalid_params"),
            ("[]".to_string(), "invalid_request"),
            (
                format!(r#"{{"method":"session.read","params":{{{triple},"from_ordnal":1}}}}"#),
                "invalid_params",
            ),
            (
                format!(
                    r#"{{"method":"session.send","params":{{{triple},"prompt":"p","model":"a/m","delivery":"steer"}}}}"#
                ),
                "delivery_unsupported",
            ),
        ] {
            assert_eq!(
                parse(body.as_bytes()).unwrap_err().code.as_str(),
                code,
                "{body}"
            );
        }
        // A refusal names the field at fault: an unknown one, or one of the wrong type.
        let field = |body: String| parse(body.as_bytes()).unwrap_err().detail["field"].clone();
        assert_eq!(
            field(format!(
                r#"{{"method":"session.read","params":{{{triple},"from_ordnal":1}}}}"#
            )),
            "from_ordnal"
        );
        assert_eq!(
            field(format!(
                r#"{{"method":"session.read","params":{{{triple},"limit":"x"}}}}"#
            )),
            "limit"
        );
        assert_eq!(
            field(format!(
                r#"{{"method":"session.send","params":{{{triple},"prompt":"p","model":"a/m","delivery":["queue"]}}}}"#
            )),
            "delivery"
        );
        for m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(m));
        }
    }

    #[test]
    fn a_send_budget_is_the_role_closed_object_and_run_budgets_are_stop_conditions() {
        let send = |extra: &str| {
            let body = format!(
                r#"{{"method":"session.send","params":{{"project_root":"/p","harness":"h","session":"s","prompt":"p","model":"a/m",{extra}}}}}"#
            );
            parse(body.as_bytes())
        };
        let Ok(Request::Send { send: taken, .. }) = send(
            r#""budget":{"max_input_tokens":6},"stop_when":{"max_steps":3,"max_total_tokens":9}"#,
        ) else {
            panic!()
        };
        assert_eq!(taken.max_input_tokens, Some(6));
        assert_eq!(taken.max_steps, Some(3));
        assert_eq!(taken.budget.and_then(|b| b.max_total_tokens), Some(9));
        for (extra, field) in [
            (r#""budget":[]"#, "budget"),
            (
                r#""budget":{"max_input_tokens":0}"#,
                "budget.max_input_tokens",
            ),
            (
                r#""budget":{"max_input_tokens":-1}"#,
                "budget.max_input_tokens",
            ),
            (
                r#""budget":{"max_input_tokens":1.5}"#,
                "budget.max_input_tokens",
            ),
            (
                r#""budget":{"max_input_tokens":null}"#,
                "budget.max_input_tokens",
            ),
            (
                r#""budget":{"max_input_tokens":18446744073709551616}"#,
                "budget.max_input_tokens",
            ),
            (r#""budget":{"foo":1}"#, "budget.foo"),
            (
                r#""budget":{"nudges":[{"at_tool_calls":1,"text":"hint","foo":1}]}"#,
                "budget.nudges[0].foo",
            ),
            (r#""budget":{"finalize_text":"x"}"#, "budget.finalize_text"),
            (
                r#""budget":{"max_total_tokens":5}"#,
                "budget.max_total_tokens",
            ),
            (r#""max_input_tokens":5"#, "max_input_tokens"),
            (
                r#""stop_when":{"max_cost_micros":0}"#,
                "stop_when.max_cost_micros",
            ),
        ] {
            let e = send(extra).unwrap_err();
            assert_eq!(
                (e.code.as_str(), e.detail["field"].as_str()),
                ("invalid_params", Some(field)),
                "{extra}"
            );
        }
    }
}
