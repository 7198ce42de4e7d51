//! The management JSON contracts: the replies users and scripts read (`run.result` here; the
//! serve surface adds its requests and refusals). Field names follow ../CONTRACT.md; optional
//! fields are omitted when absent.
//!
//! Where things are: the management core, sans-IO: every request parsed into a typed `Request`
//! (`request.rs`; `parse_on_route` puts a daemon route's session in), every error code with its
//! HTTP status and class in one table (`code.rs`, the role's codes from its crate), `RpcError`
//! (a code, a message, its detail), send refusals (`send.rs`), the subscription's lanes
//! (`lanes.rs`: `Cursor`, where it starts, its items, and one encoder per framing: SSE,
//! WebSocket, and the daemon's STREAM_DATA with its per-stream `seq` and the subscriber's
//! limits, `StreamEncoder`), the llm-runner/v1 answers (`role.rs`), the caller a front attests
//! (`Caller`)

mod code;
pub mod lanes;
pub mod request;
pub mod role;
mod send;

pub use code::Code;
pub use lanes::{Cursor, Delta, StreamEncoder, SubFrom, SubItem};
pub use request::{CancelAt, Method, Request, SessionName};
pub use send::{
    decode_policy, delivery, Budget, PolicyRefusal, Refusal, SendRequest, BACKUP_REASON,
};

use serde::Serialize;

use broca_protocol::{ClassifiedError, Usage};

/// Who sent a management request. On a module route the daemon attests the caller
/// (`route.bind`'s principal and scope); serve's HTTP surface takes the holder of the
/// management handle, the state directory's operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The daemon-attested principal (`reserved:<module>`), when the daemon attested one.
    pub principal: Option<String>,
    /// The owner of the route's scope (`reserved:<module>`), when it has a scope.
    pub scope_owner: Option<String>,
    /// The management handle's holder (serve's HTTP surface).
    pub operator: bool,
}

impl Caller {
    /// The holder of serve's management handle.
    pub fn operator() -> Caller {
        Caller {
            operator: true,
            ..Caller::default()
        }
    }

    /// Whether this caller is one of `owners` (a session with none recorded is not
    /// owner-protected; the operator passes).
    pub fn owns(&self, owners: &[&str]) -> bool {
        self.operator
            || owners.is_empty()
            || self
                .principal
                .as_deref()
                .is_some_and(|p| owners.contains(&p))
    }
}

/// An error as replies carry it: its class and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorReply {
    pub class: &'static str,
    pub message: String,
}

impl From<&ClassifiedError> for ErrorReply {
    fn from(e: &ClassifiedError) -> ErrorReply {
        ErrorReply {
            class: e.class.as_str(),
            message: e.message.clone(),
        }
    }
}

/// A final message's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FinalMessage {
    pub text: String,
}

/// The `run.result` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunResult {
    pub run_id: String,
    /// active, paused, completed, max_steps, cancelled, interrupted, error, or a budget or
    /// context reason (budget_exhausted, budget_unmeasured, context_limit).
    pub state: &'static str,
    /// Why the run stopped, as a code: the finish reason, or the pause reason (e.g.
    /// `auth_required`). Absent while the run is active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The same in words, when there is more to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorReply>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_message: Option<FinalMessage>,
    /// The run's totals in the canonical measures: each summed over the metered steps that
    /// reported it, absent until one did (a lower bound when some step left it out).
    pub usage: Usage,
    /// Metered steps that reported no measure at all.
    #[serde(skip_serializing_if = "is_zero")]
    pub unreported_steps: u32,
    /// Metered steps that did not report input or output.
    #[serde(skip_serializing_if = "is_zero")]
    pub unmeasured_steps: u32,
    /// The run's cost at its frozen catalog prices, when every step was measured and priced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub indeterminate_tool_calls: Vec<String>,
    /// The provider's quota as its latest answer said it (ChatGPT's usage windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<broca_protocol::Quota>,
}

/// A cost in micro-units of a currency (1 USD = 1,000,000 micro-USD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cost {
    pub micros: u64,
    pub currency: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RunResult {
    /// Whether the run completed (the standalone runner's exit 0).
    pub fn completed(&self) -> bool {
        self.state == "completed"
    }

    /// One line for stderr saying how the run ended.
    pub fn summary(&self) -> String {
        let mut s = format!("run {} ended {}", self.run_id, self.state);
        if let Some(d) = self.detail.as_ref().or(self.reason.as_ref()) {
            if d != self.state {
                s.push_str(&format!(": {d}"));
            }
        }
        if let Some(e) = &self.error {
            s.push_str(&format!(" ({} error: {})", e.class, e.message));
        }
        if !self.indeterminate_tool_calls.is_empty() {
            s.push_str(&format!(
                "; tool calls with unknown outcome: {}",
                self.indeterminate_tool_calls.join(", ")
            ));
        }
        s
    }
}

/// An error reply of the management surface: `{"error": {"code", "class", "message"}}`, its
/// HTTP status and class those of its [`Code`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
    /// The refusal's detail members beside `class` (the role's `detail`: the `field` an
    /// `invalid_params` names, ...).
    pub detail: serde_json::Map<String, serde_json::Value>,
}

impl RpcError {
    /// An error of `code`.
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            detail: serde_json::Map::new(),
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// Whether retrying can help.
    pub fn class(&self) -> broca_protocol::ErrorClass {
        self.code.class()
    }

    /// The refusal's `detail.field`: the request field it is about.
    pub fn with_field(self, field: impl Into<String>) -> RpcError {
        self.with_detail("field", serde_json::Value::String(field.into()))
    }

    /// One more member of the refusal's detail.
    pub fn with_detail(mut self, key: &str, value: serde_json::Value) -> RpcError {
        self.detail.insert(key.to_string(), value);
        self
    }

    /// The refusal's detail as the role carries it: `class`, `status` and the members added.
    pub fn detail_body(&self) -> serde_json::Value {
        debug_assert!(
            !self.detail.contains_key("class") && !self.detail.contains_key("status"),
            "a refusal's own detail does not shadow its class and status"
        );
        let mut d = self.detail.clone();
        d.insert("class".into(), self.class().as_str().into());
        d.insert("status".into(), self.status().into());
        serde_json::Value::Object(d)
    }

    /// The error for a refused send.
    pub fn refusal(r: &Refusal) -> RpcError {
        let mut e = RpcError::new(r.code(), r.message());
        if let Some(f) = r.field() {
            e = e.with_field(f);
        }
        if let Refusal::PlanDrift { frozen, sent } = r {
            let detail = cortexkit_role_llm_runner::errors::PlanDriftDetail::new(
                frozen.clone(),
                sent.as_str(),
            );
            if let Ok(serde_json::Value::Object(d)) = serde_json::to_value(detail) {
                e.detail.extend(d);
            }
        }
        for (key, value) in refusal_detail(r) {
            e = e.with_detail(key, value);
        }
        debug_assert_eq!(e.code, r.code(), "a refusal keeps its code");
        e
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        let mut error = serde_json::json!({
            "code": self.code.as_str(),
            "class": self.class().as_str(),
            "message": self.message,
        });
        if !self.detail.is_empty() {
            error["detail"] = serde_json::Value::Object(self.detail.clone());
        }
        serde_json::to_vec(&serde_json::json!({ "error": error })).expect("an error serializes")
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// The `session.send` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SendAnswer {
    /// `active` (the run runs), `finished` (a repeated send_id named a run that ended), or
    /// `paused`.
    pub state: &'static str,
    pub run_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The `run.status` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunStatus {
    pub run_id: String,
    pub state: &'static str,
    /// As in [`RunResult`].
    pub usage: Usage,
    #[serde(skip_serializing_if = "is_zero")]
    pub unreported_steps: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub unmeasured_steps: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    pub indeterminate_tool_calls: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorReply>,
    /// As in [`RunResult`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<broca_protocol::Quota>,
}

/// One message of a `session.read` page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadMessage<'a> {
    pub ordinal: u64,
    pub message: &'a broca_protocol::Message,
}

/// The `session.read` reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadPage<'a> {
    pub messages: Vec<ReadMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_from_ordinal: Option<u64>,
    /// The number of durable messages in the session.
    pub head: u64,
    /// The WAL's lineage (a change says the log was recreated); absent for a session
    /// with no WAL yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage_id: Option<String>,
}

/// `session.read` page sizes.
pub const READ_LIMIT_DEFAULT: usize = 200;
pub const READ_LIMIT_MAX: usize = 500;

/// The members a refusal's `detail` carries beside its field.
fn refusal_detail(r: &Refusal) -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::Value;
    let text = |s: &str| Value::from(s);
    match r {
        Refusal::RetentionAboveMax { max_seconds, .. } => {
            vec![("max_seconds", (*max_seconds).into())]
        }
        Refusal::RetentionConflict { frozen } => vec![("frozen", frozen.clone())],
        Refusal::SessionReleased { delete_after_ms } => {
            vec![("delete_after_ms", (*delete_after_ms).into())]
        }
        Refusal::BackupUnsupported(why) => vec![("reason", text(why))],
        Refusal::TemplatePartGone { slot } => vec![("slot", text(slot))],
        Refusal::PlanToolCollision { name, providers }
        | Refusal::UserCommandCollision { name, providers } => {
            vec![
                ("name", text(name)),
                ("providers", providers.clone().into()),
            ]
        }
        Refusal::InvalidSubscription {
            item,
            subscription,
            problem,
        } => vec![
            ("item", (*item).into()),
            ("subscription", (*subscription).into()),
            ("problem", text(problem)),
        ],
        Refusal::FetchUnavailable { provider, .. }
        | Refusal::PreUserUnavailable { provider, .. }
        | Refusal::SystemTextPresetRequired { provider } => vec![("provider", text(provider))],
        Refusal::PlanStale { differences } => vec![("differences", differences.clone().into())],
        Refusal::GenerationStale { accepted } => vec![("accepted", (*accepted).into())],
        Refusal::RungUnsupported { surface, rung } => {
            vec![("surface", text(surface)), ("rung", text(rung))]
        }
        Refusal::PendingSuperseded {
            generation,
            pending,
        } => vec![
            ("generation", (*generation).into()),
            ("pending", (*pending).into()),
        ],
        Refusal::AlreadyApplied {
            generation,
            applied_by,
        } => vec![
            ("generation", (*generation).into()),
            ("applied_by", text(applied_by)),
        ],
        Refusal::UnknownUserCommand { command } => vec![("command", text(command))],
        _ => Vec::new(),
    }
}
