//! The `session.send` request and why a send is refused (the refusal codes of the contract).

use serde::{Deserialize, Serialize};

use crate::Code;

/// A send's parameters (management `session.send`, or `broca run`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    pub prompt: String,
    /// `provider/model`; a steer or an interrupt may leave it out (empty here) to take the
    /// session's latest run's settings.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// A subset of the configured tools, by name; all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The session's input-token cap (llm-runner/v1 `budget.max_input_tokens`): lower-only,
    /// kept over every run of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<broca_protocol::Generation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_policy: Option<broca_protocol::CachePolicy>,
    /// The caller's own id for the message the send creates (llm-runner/v1
    /// `client_message_id`, 1 to 64 of `[A-Za-z0-9_-]`): kept beside the message, shown on
    /// its display row, never sent to the model; part of the send's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    /// The trailing directives the run's final reply is read for (llm-runner/v1
    /// `turn_directives`: `wake`), frozen with the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directives: Option<Vec<cortexkit_role_llm_runner::directives::DirectiveName>>,
    /// The shape the run's output is asked for (llm-runner/v1 `structured_output`: `{mode,
    /// schema, name?}`), as the caller sent it; checked by `session.send`'s parsing and by
    /// admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<serde_json::Value>,
    /// The delivery mode when it is not `queue`: `steer` (joins the running run at its next
    /// step boundary) or `interrupt` (cancels the running run, then starts); part of the send's
    /// identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// The send's ordered delivery (llm-runner/v1 `delivery_order`: a list in `delivery`, with
    /// `dedupe_key`, `expires_at_ms` and `template`); served only where the group is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<broca_protocol::delivery::SendOrder>,
    /// A `sender` member as a caller sent it: refused (`invalid_params {field: "sender"}`)
    /// once the caller is admitted, since a send's sender is its route's attested principal,
    /// never a request field. Not part of the send's identity.
    #[serde(default, skip_serializing)]
    pub sender: Option<serde_json::Value>,
    /// The caller's routing decision (llm-runner/v1 `route_decision_id`): fixed per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_decision_id: Option<String>,
    /// Committed uploads of this session, attached after the prompt in order (llm-runner/v1
    /// `attachments`); part of the send's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<cortexkit_role_llm_runner::attachments::ContentPart>>,
    /// The run's built-in compaction (`{mode: summarize|off, at_percent?, keep_percent?}`;
    /// docs/compaction.md): older turns summarized by the run's model as the context limit
    /// comes near, instead of the run ending at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<broca_protocol::compaction::Compaction>,
    /// The session's retention in seconds (llm-runner/v1 `retention`): the first send freezes
    /// it (absent: kept forever), a later one may only shorten it (docs/retention.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u64>,
    /// The session's storage policy (llm-runner/v1 `session_retention`: `{keep,
    /// archive_after_days, backup, request_dumps}`), as the caller sent it; checked by
    /// admission, frozen by the first send naming one (docs/retention.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<serde_json::Value>,
    /// The run's title: the caller's free text, kept with the run and shown by `runs.list`,
    /// never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The session's fetch plan (llm-runner/v1 `plans`), as the caller sent it: read and
    /// fetched at the session's first send, frozen for life; a later send may repeat it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<serde_json::Value>,
}

/// Why a send's `retention_policy` is refused: the member path it is about
/// (`invalid_params`), or a backup this runner cannot take (`backup_unsupported`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyRefusal {
    Field(String),
    Backup,
}

/// Why broca refuses `backup: true`.
pub const BACKUP_REASON: &str = "broca keeps a session's WAL, media and store projection on \
    this machine only and runs no backup service of its own";

/// A send's `retention_policy` decoded and checked (llm-runner/v1 `session_retention`): all
/// four members, nothing else, days within [`crate::role::POLICY_MAX_DAYS`], and no backup.
pub fn decode_policy(
    v: &serde_json::Value,
) -> Result<cortexkit_role_llm_runner::session_retention::RetentionPolicy, PolicyRefusal> {
    use cortexkit_role_llm_runner::session_retention::RetentionPolicy;
    let policy = RetentionPolicy::from_value(v).map_err(PolicyRefusal::Field)?;
    policy
        .check(crate::role::POLICY_MAX_DAYS)
        .map_err(PolicyRefusal::Field)?;
    if policy.backup {
        return Err(PolicyRefusal::Backup);
    }
    Ok(policy)
}

impl PolicyRefusal {
    /// What was wrong, for a refusal's message.
    pub fn message(&self) -> String {
        match self {
            PolicyRefusal::Field(path) => format!(
                "`{path}` is missing, malformed or out of range: a retention_policy is \
                 {{keep: \"none\" | {{days: 1..={}}} | \"forever\", archive_after_days: 0 \
                 (never) or fewer than keep's days, backup, request_dumps}}; backup is never \
                 true with keep \"none\"",
                crate::role::POLICY_MAX_DAYS
            ),
            PolicyRefusal::Backup => BACKUP_REASON.to_string(),
        }
    }
}

/// The delivery modes besides `queue`.
pub mod delivery {
    pub const STEER: &str = "steer";
    pub const INTERRUPT: &str = "interrupt";
}

impl SendRequest {
    /// The members a steer or an interrupt may leave out to take the frozen value, that this
    /// send names (in the order a refusal of a differing one names them).
    pub fn named_settings(&self) -> Vec<&'static str> {
        let named = [
            ("model", !self.model.is_empty()),
            ("system", self.system.is_some()),
            ("tools", self.tools.is_some()),
            ("max_steps", self.max_steps.is_some()),
            ("budget", self.budget.is_some()),
            ("max_input_tokens", self.max_input_tokens.is_some()),
            ("context_limit", self.context_limit.is_some()),
            ("generation", self.generation.is_some()),
            ("credential_id", self.credential_id.is_some()),
            ("cache_policy", self.cache_policy.is_some()),
            ("directives", self.directives.is_some()),
            ("structured_output", self.structured_output.is_some()),
            ("route_decision_id", self.route_decision_id.is_some()),
            ("compaction", self.compaction.is_some()),
        ];
        named
            .into_iter()
            .filter(|(_, n)| *n)
            .map(|(f, _)| f)
            .collect()
    }
}

/// A run's budget.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_micros: Option<u64>,
}

/// Why a send was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A parameter is missing, malformed or out of range.
    InvalidParams(String),
    /// `invalid_params` about one field of the request, named as the caller spelled it.
    InvalidField { field: &'static str, why: String },
    /// `invalid_params` about one member of the request whose name is made of its place
    /// (`plan.senders[1].succeeds`).
    InvalidMember { field: String, why: String },
    /// The send_id was used before with other inputs.
    SendIdReuse {
        run_id: String,
        /// The field that differs, when known.
        field: Option<&'static str>,
    },
    /// A run of this session is active.
    SessionBusy { run_id: String },
    /// Two configured tools share a name the send offers.
    ToolNameCollision(String),
    /// Two plan providers offer the same model-facing tool name (every provider named).
    PlanToolCollision {
        name: String,
        providers: Vec<String>,
    },
    /// The send's `plan` is not the one the session froze (`frozen` absent for a session
    /// whose first episode had none): both plans' identities, never their content.
    PlanDrift {
        frozen: Option<String>,
        sent: String,
    },
    /// A required plan item did not arrive (its provider, and why).
    FetchUnavailable { provider: String, why: String },
    /// A preset-less system-text item of a provider that serves no default text.
    SystemTextPresetRequired { provider: String },
    /// The fetched items disagree with the composition or each other: the differences.
    PlanStale { differences: Vec<serde_json::Value> },
    /// Two plan providers declare the same person-only command (every provider named).
    UserCommandCollision {
        name: String,
        providers: Vec<String>,
    },
    /// A person-only command the session did not freeze.
    UnknownUserCommand { command: String },
    /// A command call key the session does not hold.
    UnknownInvocation,
    /// The session's plan says no person drives it.
    NoPerson,
    /// This runner relays no person-only commands.
    UserCommandsUnsupported,
    /// A refresh at or below the accepted generation, not an identical repeat.
    GenerationStale { accepted: u64 },
    /// A rung the session does not support for a surface the change touches.
    RungUnsupported { surface: String, rung: String },
    /// A refresh_policy of a generation a later refresh superseded.
    PendingSuperseded { generation: u64, pending: u64 },
    /// A refresh_policy of a generation already applied.
    AlreadyApplied { generation: u64, applied_by: String },
    /// A change op's send_id used before with another body (the field that differs).
    ChangeSendIdReuse { field: &'static str },
    /// The daemon is shutting down.
    ShuttingDown,
    /// The session has an owner and the caller is not it.
    ScopeOwnerMismatch,
    /// The send_id's queued send was withdrawn (`session.retract`): it never starts.
    SendRetracted,
    /// A template send's `part_tag` slot names a part no request shows.
    TemplatePartGone { slot: String },
    /// `invalid_params {field: "plan.step_transform_items", item, subscription, problem}`: a
    /// planned subscription malformed in itself (step-transform-provider/v2 §4).
    InvalidSubscription {
        item: usize,
        subscription: usize,
        problem: String,
    },
    /// A `pre_user` hook under `on_unavailable: refuse` gave no usable answer (its provider,
    /// why).
    PreUserUnavailable { provider: String, why: String },
    /// The send's credential is missing or unusable (what, never the secret).
    AuthRequired(String),
    /// The credential's source (the vault) is out for now; the send may be retried.
    CredentialUnavailable(String),
    /// This build does not speak the provider's wire family.
    UnsupportedProvider(String),
    /// A budget needs a measure the model's catalog entry cannot price.
    BudgetUnpriced(String),
    /// A send's `content` names an upload this session does not hold (or another's).
    UnknownUpload(String),
    /// A send's `content` names an upload that was lost before its commit.
    UploadGone(String),
    /// A send's `content` names an upload still open.
    UploadNotCommitted(String),
    /// A send's media the model it runs on cannot take (the upload, its media type).
    MediaUnsupported { upload_id: String, why: String },
    /// A `retention` above the largest this runner keeps a session for.
    RetentionAboveMax { asked: u64, max_seconds: u64 },
    /// The session's first send named no `retention_policy`, and this runner requires one.
    RetentionRequired,
    /// The send's `retention_policy` differs from the session's frozen one (as the wire
    /// spells it).
    RetentionConflict { frozen: serde_json::Value },
    /// The session was released; it is deleted at `delete_after_ms` at the earliest.
    SessionReleased { delete_after_ms: u64 },
    /// A `retention_policy` asks for a backup this runner cannot take (the reason).
    BackupUnsupported(String),
}

impl Refusal {
    /// The refusal's code.
    pub fn code(&self) -> Code {
        match self {
            Refusal::InvalidParams(_)
            | Refusal::InvalidField { .. }
            | Refusal::InvalidMember { .. }
            | Refusal::RetentionAboveMax { .. } => Code::InvalidParams,
            Refusal::SendIdReuse { .. } => Code::SendIdReuse,
            Refusal::SessionBusy { .. } => Code::SessionBusy,
            Refusal::ToolNameCollision(_) | Refusal::PlanToolCollision { .. } => {
                Code::ToolNameCollision
            }
            Refusal::PlanDrift { .. } => Code::PlanDrift,
            Refusal::FetchUnavailable { .. } => Code::FetchUnavailable,
            Refusal::PlanStale { .. } => Code::PlanStale,
            Refusal::SystemTextPresetRequired { .. } => Code::SystemTextPresetRequired,
            Refusal::UserCommandCollision { .. } => Code::UserCommandCollision,
            Refusal::UnknownUserCommand { .. } => Code::UnknownUserCommand,
            Refusal::UnknownInvocation => Code::UnknownInvocation,
            Refusal::NoPerson => Code::NoPerson,
            Refusal::UserCommandsUnsupported => Code::UserCommandsUnsupported,
            Refusal::GenerationStale { .. } => Code::GenerationStale,
            Refusal::RungUnsupported { .. } => Code::RungUnsupported,
            Refusal::PendingSuperseded { .. } => Code::PendingSuperseded,
            Refusal::AlreadyApplied { .. } => Code::AlreadyApplied,
            Refusal::ChangeSendIdReuse { .. } => Code::SendIdReuse,
            Refusal::ShuttingDown => Code::ShuttingDown,
            Refusal::ScopeOwnerMismatch => Code::ScopeOwnerMismatch,
            Refusal::SendRetracted => Code::SendRetracted,
            Refusal::TemplatePartGone { .. } => Code::TemplatePartGone,
            Refusal::InvalidSubscription { .. } => Code::InvalidParams,
            Refusal::PreUserUnavailable { .. } => Code::PreUserUnavailable,
            Refusal::AuthRequired(_) => Code::AuthRequired,
            Refusal::CredentialUnavailable(_) => Code::CredentialUnavailable,
            Refusal::UnsupportedProvider(_) => Code::UnsupportedProvider,
            Refusal::BudgetUnpriced(_) => Code::BudgetUnpriced,
            Refusal::UnknownUpload(_) => Code::UnknownUpload,
            Refusal::UploadGone(_) => Code::UploadGone,
            Refusal::UploadNotCommitted(_) => Code::UploadNotCommitted,
            Refusal::MediaUnsupported { .. } => Code::MediaUnsupported,
            Refusal::RetentionRequired => Code::RetentionRequired,
            Refusal::RetentionConflict { .. } => Code::RetentionConflict,
            Refusal::SessionReleased { .. } => Code::SessionReleased,
            Refusal::BackupUnsupported(_) => Code::BackupUnsupported,
        }
    }

    /// The request field the refusal is about, when it names one.
    pub fn field(&self) -> Option<&str> {
        match self {
            Refusal::InvalidField { field, .. } => Some(field),
            Refusal::InvalidMember { field, .. } => Some(field),
            Refusal::RetentionAboveMax { .. } => Some("retention"),
            Refusal::SendIdReuse { field, .. } => *field,
            Refusal::ChangeSendIdReuse { field } => Some(field),
            Refusal::InvalidSubscription { .. } => Some(cortexkit_role_step_transform_provider::errors::runner_codes::PLAN_STEP_TRANSFORM_ITEMS),
            _ => None,
        }
    }
}

impl Refusal {
    /// What was refused and what to do, without the code (replies carry the code apart).
    pub fn message(&self) -> String {
        if let Some(m) = self.plan_message().or_else(|| self.session_message()) {
            return m;
        }
        match self {
            Refusal::InvalidParams(why)
            | Refusal::AuthRequired(why)
            | Refusal::CredentialUnavailable(why)
            | Refusal::UnsupportedProvider(why)
            | Refusal::BudgetUnpriced(why)
            | Refusal::InvalidField { why, .. }
            | Refusal::InvalidMember { why, .. } => why.clone(),
            Refusal::SendIdReuse { run_id, .. } => {
                format!("this send_id started run {run_id} with other inputs; use a new send_id")
            }
            Refusal::SessionBusy { run_id } => {
                format!("run {run_id} is active; wait for it or cancel it")
            }
            Refusal::ToolNameCollision(name) => format!("two tool servers offer `{name}`"),
            Refusal::ShuttingDown => "broca is stopping; retry later".to_string(),
            _ => unreachable!("a refusal of a plan or a session's state is worded above"),
        }
    }

    /// The wording of a refusal about a plan or its person-only commands.
    fn plan_message(&self) -> Option<String> {
        Some(match self {
            Refusal::PlanToolCollision { name, providers } => format!(
                "the plan's providers {} all offer a tool named `{}`",
                providers.join(", "),
                name.escape_debug()
            ),
            Refusal::PlanDrift {
                frozen: Some(_), ..
            } => "this session froze another fetch \
                plan at admission; a later send repeats it or leaves `plan` out"
                .to_string(),
            Refusal::PlanDrift { frozen: None, .. } => "this session was admitted without a \
                fetch plan; a later send cannot add one"
                .to_string(),
            Refusal::FetchUnavailable { provider, why } => format!(
                "plan item of `{}` did not arrive: {why}; nothing was written, retry",
                provider.escape_debug()
            ),
            Refusal::SystemTextPresetRequired { provider } => format!(
                "the plan's system_text item of `{}` names no preset, and the daemon's catalog \
                 does not list that module as serving a default text (system-text-default/v1); \
                 name the item's preset",
                provider.escape_debug()
            ),
            Refusal::PlanStale { differences } => format!(
                "the plan's fetched items disagree with it ({} difference(s)); plan again",
                differences.len()
            ),
            Refusal::UserCommandCollision { name, providers } => format!(
                "the plan's providers {} all declare a person-only command named `{}`",
                providers.join(", "),
                name.escape_debug()
            ),
            Refusal::UnknownUserCommand { command } => format!(
                "this session froze no person-only command `{}`",
                command.escape_debug()
            ),
            Refusal::UnknownInvocation => {
                "this session holds no command invocation with that call_key".to_string()
            }
            Refusal::NoPerson => {
                "this session's plan says no person drives it (`interactive: false`)".to_string()
            }
            Refusal::UserCommandsUnsupported => "this runner relays no person-only commands \
                (its config's `plans` is off)"
                .to_string(),
            _ => return self.change_message(),
        })
    }

    /// The wording of a refusal about a session's changes, its hooks or a template.
    fn change_message(&self) -> Option<String> {
        Some(match self {
            Refusal::GenerationStale { accepted } => format!(
                "this session accepted change generation {accepted}; a refresh names a higher \
                 one (or repeats an accepted one exactly)"
            ),
            Refusal::RungUnsupported { surface, rung } => format!(
                "this session applies a change to its {surface} only `immediately` (from the next \
                 run), not `{}`",
                rung.escape_debug()
            ),
            Refusal::PendingSuperseded {
                generation,
                pending,
            } => format!("generation {generation} was superseded; generation {pending} is pending"),
            Refusal::AlreadyApplied {
                generation,
                applied_by,
            } => format!("generation {generation} already applied ({applied_by})"),
            Refusal::ChangeSendIdReuse { field } => {
                format!("this send_id was used before with another `{field}`; use a new send_id")
            }
            Refusal::TemplatePartGone { slot } => format!(
                "the template's slot `{slot}` names a part this session's next request does not \
                 show; compose the send again"
            ),
            Refusal::InvalidSubscription {
                item,
                subscription,
                problem,
            } => format!(
                "`plan.step_transform_items[{item}].subscriptions[{subscription}]`: {problem}"
            ),
            Refusal::PreUserUnavailable { provider, why } => format!(
                "the pre_user hook of `{}` gave no usable answer ({why}); its subscription \
                 says refuse, so nothing was written",
                provider.escape_debug()
            ),
            _ => return None,
        })
    }

    /// The wording of a refusal about the session's uploads, retention or owner.
    fn session_message(&self) -> Option<String> {
        Some(match self {
            Refusal::SendRetracted => {
                "this send was retracted before it started; it never starts".to_string()
            }
            Refusal::ScopeOwnerMismatch => {
                "only the session's owner sends into it (the principal of its first send)"
                    .to_string()
            }
            Refusal::UnknownUpload(id) => format!(
                "`content` names upload `{}`, which this session does not hold",
                id.escape_debug()
            ),
            Refusal::UploadGone(id) => format!(
                "upload `{}` was lost before its commit (broca restarted); upload it again",
                id.escape_debug()
            ),
            Refusal::UploadNotCommitted(id) => format!(
                "upload `{}` is still open; commit it before sending it",
                id.escape_debug()
            ),
            Refusal::MediaUnsupported { upload_id, why } => {
                format!("upload `{}`: {why}", upload_id.escape_debug())
            }
            Refusal::RetentionAboveMax { asked, max_seconds } => format!(
                "retention {asked} s is above the longest this runner keeps a session, \
                 {max_seconds} s"
            ),
            Refusal::RetentionRequired => "this runner requires a `retention_policy` on a \
                session's first send ({keep, archive_after_days, backup, request_dumps})"
                .to_string(),
            Refusal::RetentionConflict { frozen } => format!(
                "this session's retention_policy is frozen as {frozen}; a send may repeat it \
                 or leave it out, not change it"
            ),
            Refusal::SessionReleased { delete_after_ms } => format!(
                "this session was released: it takes no more sends and is deleted at \
                 {delete_after_ms} (ms since the Unix epoch) at the earliest; a send after \
                 that starts it afresh"
            ),
            Refusal::BackupUnsupported(why) => format!("backup: true cannot be kept: {why}"),
            _ => return None,
        })
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code().as_str(), self.message())
    }
}
