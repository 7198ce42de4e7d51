//! Tools offered by the daemon's tool_provider modules (the `tool-provider/v1` role), sans-IO:
//! the bodies broca sends on a tool route and how it reads the answers. The role's own crate
//! (`cortexkit-role-tool-provider`) checks `role.describe`, decodes `tool.catalog` and
//! encodes each call's schema pin; subc-protocol's `ToolCallRequest` is the call.
//!
//! A tool's route, frozen with its spec at admission, is `subc:<module id>@<schema pin>`:
//! the module that serves it and the pin (`tp1:<tool>:<schema digest>:<semantics>`) every
//! call of the run carries, so a provider that changed the tool's schema or behaviour since
//! refuses the call rather than running it against arguments built for another schema.

use cortexkit_role_tool_provider::call::SchemaPin;
use cortexkit_role_tool_provider::catalog::{
    check_flat_schema, check_reply, schema_digest, CatalogAnswer,
};
use cortexkit_role_tool_provider::describe::check_describe;
use serde_json::{json, Value};
use subc_control::{ClientControlRequest, ClientControlResponse, ConsumerIdentity};
use subc_protocol::error_codes::{self, is_established_route_dead, is_retryable_route_open};
use subc_protocol::tool_call::ToolCallRequest;
use subc_protocol::{BindIdentity, ErrorBody, FrameType, RouteTarget};

use broca_protocol::ToolSpec;

use crate::frames::FrameIn;
use crate::LinkError;

/// The route prefix of tools that tool_provider modules serve.
pub const ROUTE_PREFIX: &str = broca_protocol::route::SUBC_PREFIX;

/// The `route.open` body for a route to tool provider `module_id` for one session, under the
/// session's scope when there is one (crate::scope).
pub fn route_open(
    module_id: &str,
    harness: &str,
    session: &str,
    consumer: Option<(&str, &str)>,
    scope: Option<subc_protocol::scope::ScopeSelector>,
) -> Vec<u8> {
    route_open_as(module_id, harness, session, consumer, scope, None)
}

/// [`route_open`] declaring the provider role it speaks (`role_versions`, one `(role,
/// version)`): a compaction provider's route is `("compaction-provider", "v2")`.
pub fn route_open_as(
    module_id: &str,
    harness: &str,
    session: &str,
    consumer: Option<(&str, &str)>,
    scope: Option<subc_protocol::scope::ScopeSelector>,
    role: Option<(&str, &str)>,
) -> Vec<u8> {
    let open = ClientControlRequest::RouteOpen {
        target: RouteTarget::ToolProvider {
            module_id: module_id.into(),
        },
        identity: BindIdentity::new(harness.to_string(), session.to_string()),
        consumer_identity: consumer.map(|(module_id, nonce)| ConsumerIdentity {
            module_id: module_id.into(),
            launch_nonce: nonce.into(),
        }),
        // broca decodes `tool-result/v1` bodies of the tools whose catalog entry opts in, and
        // keeps a call alive while its provider's keepalives come (tool-provider/v1 §4.4).
        // A held first reply's answer comes later, in `late_results` (toolprov::late).
        consumer_capabilities: Some(vec![
            cortexkit_role_tool_provider::TOOL_RESULT_V1_CAPABILITY.to_string(),
            cortexkit_role_tool_provider::HELD_REPLY_V1.to_string(),
            cortexkit_role_tool_provider::CALL_KEEPALIVE_CAPABILITY.to_string(),
        ]),
        role_versions: role.map(|(r, v)| [(r.to_string(), v.to_string())].into()),
        admission_facts: None,
        scope,
    };
    serde_json::to_vec(&open).expect("a route.open serializes")
}

/// The daemon's `catalog.list` request for `module_id` (channel 0): its manifest's
/// capabilities, which say whether it sends call keepalives.
pub fn catalog_list_request(module_id: &str) -> Vec<u8> {
    let list = ClientControlRequest::CatalogList {
        module_id: Some(module_id.to_string()),
    };
    serde_json::to_vec(&list).expect("a catalog.list serializes")
}

/// Whether the daemon's `catalog.list` answer says `module_id` provides
/// `call-keepalive/v1` (its manifest's `capabilities.provides`); false for any other answer.
pub fn provides_keepalive(module_id: &str, frame: &FrameIn) -> bool {
    provides(
        module_id,
        frame,
        cortexkit_role_tool_provider::CALL_KEEPALIVE_CAPABILITY,
    )
}

/// Whether the daemon's `catalog.list` answer says `module_id` provides `capability` (its
/// manifest's `capabilities.provides`); false for any other answer.
pub fn provides(module_id: &str, frame: &FrameIn, capability: &str) -> bool {
    if frame.header.ty != FrameType::Response {
        return false;
    }
    let Ok(ClientControlResponse::CatalogList { modules, .. }) =
        serde_json::from_slice(&frame.body)
    else {
        return false;
    };
    modules
        .iter()
        .filter(|m| m.module_id == module_id)
        .filter_map(|m| m.capabilities.as_ref())
        .any(|c| c.provides.iter().any(|p| p == capability))
}

/// How a `route.open` went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    Route {
        channel: u16,
        epoch: u32,
    },
    /// Refused with a code the daemon marks retryable.
    Retry(String),
    /// Refused for good (or answered with something that is not an answer).
    Refused(String),
}

/// Reads the daemon's answer to a `route.open`.
pub fn read_open(frame: &FrameIn) -> Opened {
    match frame.header.ty {
        FrameType::Response => match serde_json::from_slice(&frame.body) {
            Ok(ClientControlResponse::RouteOpen {
                route_channel,
                route_epoch,
            }) => Opened::Route {
                channel: route_channel,
                epoch: route_epoch,
            },
            _ => Opened::Refused("the daemon's route.open answer does not parse".into()),
        },
        FrameType::Error => {
            let e = error_body(&frame.body);
            if is_retryable_route_open(&e.code) {
                Opened::Retry(e.code)
            } else {
                Opened::Refused(format!("{}: {}", e.code, e.message))
            }
        }
        other => Opened::Refused(format!("a {other:?} frame answered route.open")),
    }
}

fn error_body(body: &[u8]) -> ErrorBody {
    serde_json::from_slice(body).unwrap_or_else(|_| ErrorBody {
        code: "unreadable_error".into(),
        message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        detail: None,
    })
}

/// A role op's request (`{name, arguments}`, as a call is).
pub fn op_request(op: &str, arguments: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "name": op, "arguments": arguments })).expect("JSON serializes")
}

/// The `role.describe` request.
pub fn describe_request() -> Vec<u8> {
    op_request(cortexkit_role_tool_provider::ops::ROLE_DESCRIBE, json!({}))
}

/// The `tool.catalog` request: the provider's default catalog.
pub fn catalog_request() -> Vec<u8> {
    op_request(
        cortexkit_role_tool_provider::ops::TOOL_CATALOG,
        json!({ "params": {} }),
    )
}

/// The body of a RESPONSE, or the refusal an ERROR carries, as an error line.
fn answer(what: &str, frame: &FrameIn) -> Result<Value, LinkError> {
    match frame.header.ty {
        FrameType::Response => serde_json::from_slice(&frame.body)
            .map_err(|e| LinkError::Protocol(format!("its {what} answer is not JSON: {e}"))),
        FrameType::Error => {
            let e = error_body(&frame.body);
            Err(LinkError::Refused(format!(
                "it refused {what}: {}: {}",
                e.code, e.message
            )))
        }
        other => Err(LinkError::Protocol(format!(
            "a {other:?} frame answered {what}"
        ))),
    }
}

/// Checks a `role.describe` answer: a `tool-provider/v1` major serving the required ops.
pub fn read_describe(frame: &FrameIn) -> Result<(), LinkError> {
    let v = answer(cortexkit_role_tool_provider::ops::ROLE_DESCRIBE, frame)?;
    check_describe(&v).map(|_| ()).map_err(|problems| {
        LinkError::Protocol(format!("its role.describe does not hold: {problems:?}"))
    })
}

/// The tools of a `tool.catalog` answer as broca offers them, each routed to `module_id`
/// with its schema pin. A tool whose schema is not a flat object schema, or whose name or
/// pin does not encode, is left out with a note.
pub fn read_catalog(module_id: &str, frame: &FrameIn) -> Result<Catalog, LinkError> {
    let v = answer(cortexkit_role_tool_provider::ops::TOOL_CATALOG, frame)?;
    let catalog: CatalogAnswer = serde_json::from_value(v).map_err(|e| {
        LinkError::Protocol(format!("its tool.catalog answer does not decode: {e}"))
    })?;
    catalog_of(module_id, catalog).map_err(|e| LinkError::Protocol(e.to_string()))
}

/// Why a plan item's `tool.catalog` answer did not arrive (llm-runner/v1 §10.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanMiss {
    /// No answer within admission's deadline.
    Timeout,
    /// The module could not be reached, or its answer does not hold (why).
    Unavailable(String),
    /// The module refused the request: its code and message.
    Refused { code: String, message: String },
}

/// A plan item's `tool.catalog` request (`{name, arguments}` with the role's request).
pub fn plan_catalog_request(
    request: &cortexkit_role_tool_provider::catalog::CatalogRequest,
) -> Vec<u8> {
    op_request(
        cortexkit_role_tool_provider::ops::TOOL_CATALOG,
        serde_json::to_value(request).expect("a catalog request serializes"),
    )
}

/// A plan item's `tool.catalog` answer: the answer as it came, and its tools as broca
/// routes them ([`catalog_of`]); a refusal keeps the module's code.
pub fn read_plan_catalog(
    module_id: &str,
    frame: &FrameIn,
) -> Result<(CatalogAnswer, Catalog), PlanMiss> {
    match frame.header.ty {
        FrameType::Response => {}
        FrameType::Error => {
            let e = error_body(&frame.body);
            return Err(PlanMiss::Refused {
                code: e.code,
                message: e.message,
            });
        }
        other => {
            return Err(PlanMiss::Unavailable(format!(
                "a {other:?} frame answered tool.catalog"
            )))
        }
    }
    let answer: CatalogAnswer = serde_json::from_slice(&frame.body).map_err(|e| {
        PlanMiss::Unavailable(format!("its tool.catalog answer does not decode: {e}"))
    })?;
    // Its person-only commands well formed, and `user_command.invoke` never a tool.
    cortexkit_role_tool_provider::user_command::check_catalog(&answer).map_err(|e| {
        let field = cortexkit_role_tool_provider::errors::invalid_request_field(&e)
            .unwrap_or("user_commands");
        PlanMiss::Unavailable(format!(
            "invalid_answer: its tool.catalog answer's `{field}`: {}",
            e.message
        ))
    })?;
    // A text comes with the names of the tools it was composed for (tool-provider/v1).
    if answer
        .system_text
        .as_ref()
        .is_some_and(|t| t.text.is_some() && t.tool_names.is_none())
    {
        return Err(PlanMiss::Unavailable(
            "invalid_answer: its system_text carries a text without `tool_names`".into(),
        ));
    }
    let catalog =
        catalog_of(module_id, answer.clone()).map_err(|e| PlanMiss::Unavailable(e.to_string()))?;
    Ok((answer, catalog))
}

/// A `tool.catalog` answer that breaks the role's rules for a tool's reply deadline: the
/// whole answer is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidCatalog {
    pub tool: String,
    pub member: String,
    pub reason: String,
}

impl std::fmt::Display for InvalidCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid_answer: its tool.catalog answer's `{}` {}: {}",
            self.tool, self.member, self.reason
        )
    }
}

impl std::error::Error for InvalidCatalog {}

/// The tools of a decoded `tool.catalog` answer as broca offers them (see [`read_catalog`]).
pub fn catalog_of(module_id: &str, catalog: CatalogAnswer) -> Result<Catalog, InvalidCatalog> {
    let mut specs = Vec::with_capacity(catalog.tools.len());
    let mut notes = Vec::new();
    let mut result_v1 = std::collections::HashSet::new();
    let late_results =
        catalog.declares(cortexkit_role_tool_provider::catalog::session_capabilities::LATE_RESULTS);
    for tool in catalog.tools {
        // A reply deadline that breaks the role's rules makes the whole answer invalid.
        check_reply(&tool).map_err(|p| InvalidCatalog {
            tool: p.tool.to_string(),
            member: p.member.to_string(),
            reason: p.reason.to_string(),
        })?;
        let reply = tool
            .reply
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok());
        if tool
            .result_format
            .as_ref()
            .is_some_and(|f| f.as_str() == cortexkit_role_tool_provider::TOOL_RESULT_V1_CAPABILITY)
        {
            result_v1.insert(tool.name.clone());
        }
        if let Err(p) = check_flat_schema(&tool.input_schema) {
            notes.push(format!(
                "tool `{}` left out: its schema is not flat ({p:?})",
                tool.name
            ));
            continue;
        }
        let pin = schema_digest(&tool.input_schema)
            .map_err(|e| format!("{e:?}"))
            .and_then(|digest| {
                SchemaPin::new(tool.name.clone(), digest, tool.semantics)
                    .encode()
                    .map_err(|e| format!("{e:?}"))
            });
        let pin = match pin {
            Ok(p) => p,
            Err(e) => {
                notes.push(format!(
                    "tool `{}` left out: no schema pin ({e})",
                    tool.name
                ));
                continue;
            }
        };
        specs.push(ToolSpec {
            name: tool.name,
            description: tool.description.unwrap_or_default(),
            input_schema: tool.input_schema,
            route: format!("{ROUTE_PREFIX}{module_id}@{pin}"),
            reply,
        });
    }
    Ok(Catalog {
        specs,
        notes,
        result_v1,
        late_results,
    })
}

/// How long a call is waited for (tool-provider/v1 §3 rule 1, by the role crate's
/// `reply_deadline_ms`): the tool's frozen `reply` metadata applied to the call's
/// arguments, never below `fallback` (the module's `call_timeout_ms`); `fallback` for a tool
/// without one.
pub fn reply_deadline(
    reply: Option<&serde_json::Value>,
    arguments: &serde_json::Value,
    fallback: std::time::Duration,
) -> std::time::Duration {
    reply_deadline_with_keepalive(reply, arguments, fallback, false)
}

/// How long a call of a module that sends keepalives may go without any (tool-provider/v1
/// §4.4: three missed 30 s intervals).
pub const KEEPALIVE_SILENCE_MS: u64 = cortexkit_role_tool_provider::KEEPALIVE_SILENCE_MS;

/// [`reply_deadline`] for a module that may send keepalives (tool-provider/v1 §4.4): when
/// it does, a tool without `reply` is waited for up to the role's ceiling (24 h), its
/// keepalives' silence window ending it sooner.
pub fn reply_deadline_with_keepalive(
    reply: Option<&serde_json::Value>,
    arguments: &serde_json::Value,
    fallback: std::time::Duration,
    keepalive: bool,
) -> std::time::Duration {
    let reply: Option<cortexkit_role_tool_provider::catalog::Reply> =
        reply.and_then(|r| serde_json::from_value(r.clone()).ok());
    let fallback_ms = u64::try_from(fallback.as_millis()).unwrap_or(u64::MAX);
    std::time::Duration::from_millis(
        cortexkit_role_tool_provider::catalog::reply_deadline_ms_with_keepalive(
            reply.as_ref(),
            arguments,
            fallback_ms,
            keepalive,
        ),
    )
}

/// A module's tools as broca offers them, the notes of those left out, and the names of the
/// tools whose answers come as `tool-result/v1` bodies (their catalog entry opts in; broca's
/// routes declare the format).
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub specs: Vec<ToolSpec>,
    pub notes: Vec<String>,
    pub result_v1: std::collections::HashSet<String>,
    /// The module settles calls later and serves `late_results` (a session capability).
    pub late_results: bool,
}

/// A part of a `tool-result/v1` answer, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Image { mime: String, data: Vec<u8> },
}

/// What is wrong with a `tool-result/v1` body.
#[derive(Debug)]
pub(crate) enum BadResultV1 {
    /// It does not decode as one.
    Decode(serde_json::Error),
    /// The role's `validate` refuses it (its words).
    Invalid(String),
    /// An image's data is not base64.
    Image(base64::DecodeError),
}

impl std::fmt::Display for BadResultV1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadResultV1::Decode(e) => write!(f, "{e}"),
            BadResultV1::Invalid(why) => f.write_str(why),
            BadResultV1::Image(e) => write!(f, "an image's data: {e}"),
        }
    }
}

/// A `tool-result/v1` body read: checked as the role's `validate` checks it, each image
/// decoded, a part of a type broca does not know kept as a one-line note. `Err` says what is
/// wrong with it.
pub(crate) fn read_result_v1(body: &[u8]) -> Result<ResultV1, BadResultV1> {
    use base64::Engine;
    use cortexkit_role_tool_provider::result::{model_visible_bytes, validate, ContentPart};
    let result: cortexkit_role_tool_provider::result::ToolResult =
        serde_json::from_slice(body).map_err(BadResultV1::Decode)?;
    validate(&result).map_err(|p| BadResultV1::Invalid(p.to_string()))?;
    let mut parts = Vec::with_capacity(result.content.len());
    for p in &result.content {
        parts.push(match p {
            ContentPart::Text { text } => Part::Text(text.clone()),
            ContentPart::Image(image) => Part::Image {
                mime: image.mime_type.clone(),
                data: base64::engine::general_purpose::STANDARD
                    .decode(image.data.as_bytes())
                    .map_err(BadResultV1::Image)?,
            },
            ContentPart::Unknown(v) => Part::Text(format!(
                "[unsupported content: a part of type {}]",
                v.get("type").and_then(Value::as_str).unwrap_or("?")
            )),
            _ => Part::Text("[unsupported content]".into()),
        });
    }
    Ok(ResultV1 {
        parts,
        is_error: result.is_error == Some(true),
        bytes: model_visible_bytes(&result),
        held: result.held().map(|h| h.reason.clone()),
    })
}

/// A `tool-result/v1` body, read.
pub(crate) struct ResultV1 {
    pub parts: Vec<Part>,
    pub is_error: bool,
    /// Its model-visible size, as the role measures it.
    pub bytes: usize,
    /// A held first reply's reason: the call's answer comes later (`late_results`).
    pub held: Option<String>,
}

/// A module tool's route read back: the module and the schema pin.
pub fn parse_route(route: &str) -> Option<(&str, &str)> {
    let rest = route.strip_prefix(ROUTE_PREFIX)?;
    let (module, pin) = rest.split_once('@')?;
    (!module.is_empty()).then_some((module, pin))
}

/// A call's REQUEST body. `arguments` were checked against the frozen schema.
pub fn call_body(
    name: &str,
    arguments: Value,
    call_id: &str,
    call_key: String,
    schema_pin: &str,
) -> Vec<u8> {
    let request = ToolCallRequest {
        name: name.to_string(),
        arguments,
        tool_call_id: Some(call_id.to_string()),
        progress_token: None,
        call_key: Some(call_key),
        schema_pin: Some(schema_pin.to_string()),
        preset: None,
        origin: None,
        output_refs: None,
    };
    serde_json::to_vec(&request).expect("a tool call serializes")
}

/// What a call's terminal frame says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The provider answered (an error result when it refused the call itself).
    Answer { text: String, is_error: bool },
    /// The provider answered a `tool-result/v1` body in parts (text and images).
    Parts { parts: Vec<Part>, is_error: bool },
    /// A held first reply (`held-reply/v1`): interim content, not the answer, which comes
    /// later as the call's `late_results` entry.
    Held { parts: Vec<Part>, reason: String },
    /// The provider answered with more than the model-visible limit (64 KiB, measured as
    /// tool-provider/v1 measures a legacy result): the answer is discarded whole.
    TooLarge { bytes: u64 },
    /// The route was dead and the daemon says the module never received the request: it may
    /// be sent again on a fresh route.
    NotDelivered(String),
    /// The daemon ended the request after it was delivered: it may or may not have run.
    Indeterminate(String),
}

/// Codes the daemon answers on a delivered request (a timeout, an oversized reply, the
/// module gone): the module had the request, so the call's outcome is unknown.
const DAEMON_AFTER_DELIVERY: &[&str] = &[
    error_codes::MODULE_TIMEOUT,
    error_codes::FRAME_TOO_LARGE,
    error_codes::MODULE_REMOVED,
    error_codes::UNKNOWN_MODULE,
    error_codes::TARGET_UNAVAILABLE,
];

/// Reads a call's terminal frame; `result_v1` when the tool's answers are `tool-result/v1`
/// bodies (its catalog entry opts in, and broca's route declared the format).
pub fn read_reply(module_id: &str, frame: &FrameIn, result_v1: bool) -> Reply {
    match frame.header.ty {
        FrameType::Response if result_v1 => v1_reply(module_id, &frame.body),
        FrameType::Response => legacy_reply(module_id, &frame.body),
        FrameType::Error => {
            let e = error_body(&frame.body);
            if is_established_route_dead(frame.header.flags, &e.code)
                || e.code == error_codes::MODULE_RELOADING
            {
                Reply::NotDelivered(e.code)
            } else if frame.header.flags.is_daemon_origin()
                || DAEMON_AFTER_DELIVERY.contains(&e.code.as_str())
            {
                Reply::Indeterminate(format!(
                    "the daemon ended the call to `{module_id}` after delivering it: {}: {}",
                    e.code, e.message
                ))
            } else {
                Reply::Answer {
                    text: format!(
                        "tool module `{module_id}` refused the call ({}): {}",
                        e.code, e.message
                    ),
                    is_error: true,
                }
            }
        }
        FrameType::StreamEnd => Reply::Answer {
            text: format!(
                "tool module `{module_id}` streamed its answer, which broca does not read"
            ),
            is_error: true,
        },
        other => Reply::Indeterminate(format!("a {other:?} frame ended the call")),
    }
}

/// A `tool-result/v1` answer: its parts, a held first reply, or one over the model-visible
/// limit. One that cannot be read ran even so: an error result says so.
fn v1_reply(module_id: &str, body: &[u8]) -> Reply {
    use cortexkit_role_tool_provider::result::MAX_MODEL_VISIBLE_BYTES;
    match read_result_v1(body) {
        Ok(r) if r.bytes > MAX_MODEL_VISIBLE_BYTES => Reply::TooLarge {
            bytes: r.bytes as u64,
        },
        Ok(ResultV1 {
            parts,
            held: Some(reason),
            ..
        }) => Reply::Held { parts, reason },
        Ok(r) => Reply::Parts {
            parts: r.parts,
            is_error: r.is_error,
        },
        Err(why) => Reply::Answer {
            text: format!(
                "tool module `{module_id}` answered a tool-result/v1 body that does not \
                 hold: {why}"
            ),
            is_error: true,
        },
    }
}

/// A legacy answer: a string is the model's text, anything else its JSON; one over the
/// model-visible limit is refused; one that is not JSON leaves the outcome unknown.
fn legacy_reply(module_id: &str, body: &[u8]) -> Reply {
    use cortexkit_role_tool_provider::result::{
        legacy_model_visible_bytes, MAX_MODEL_VISIBLE_BYTES,
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if legacy_model_visible_bytes(&v) > MAX_MODEL_VISIBLE_BYTES => Reply::TooLarge {
            bytes: legacy_model_visible_bytes(&v) as u64,
        },
        Ok(Value::String(text)) => Reply::Answer {
            text,
            is_error: false,
        },
        Ok(_) => Reply::Answer {
            text: String::from_utf8_lossy(body).into_owned(),
            is_error: false,
        },
        Err(_) => Reply::Indeterminate(format!(
            "tool module `{module_id}` answered a body that is not JSON"
        )),
    }
}

pub mod command;
pub mod late;

#[cfg(test)]
mod tests;
