//! The run loop's records: the payloads of the WAL kinds that describe runs. Each is JSON in
//! its frame; fields that are optional are omitted when absent (absent is not zero).

use serde::{Deserialize, Serialize};

use broca_protocol::{Block, ClassifiedError, FinishReason, ToolCall, Usage};

/// What a run freezes at its start, in `frozen`.
pub use crate::frozen::{
    CatalogCapability, CatalogEntry, CatalogPriceTier, CatalogPrices, CatalogProvider,
    FrozenConfig, FrozenStructuredOutput, InputCap, StopConditions,
};
/// A send's own records, in `sendrec`.
pub use crate::sendrec::{SendEnded, SendQueued, SendRetracted, SendSteered};
/// The session's own records (its release, a prune, its uploads), in `sessionrec`.
pub use crate::sessionrec::{
    PrunedMessage, PrunedPart, ReasoningPruned, SessionReleased, UploadBegun, UploadCommitted,
};

pub use broca_protocol::CachePolicy;

/// Why broca wrote a tool result itself (the `reason` of a [`ResultBlock`]); a result the
/// tool gave has none. The values are part of the WAL's payload format and of the contract.
pub mod result_reason {
    use cortexkit_role_llm_runner::errors::tool_result_reasons;

    /// The call may have run (delivered, then its answer lost): never run again.
    pub const OUTCOME_UNKNOWN: &str = tool_result_reasons::OUTCOME_UNKNOWN;
    /// The model asked for a tool the run was not offered: never sent.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// The arguments are not JSON or do not match the tool's input schema: never sent.
    pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
    /// The tool's server could not take the call (unreachable, not started): it never ran.
    pub const REFUSED_BEFORE_DELIVERY: &str = "refused_before_delivery";
    /// The run stopped before the call was dispatched: it never ran.
    pub const NOT_DISPATCHED: &str = "not_dispatched";
    /// Never dispatched: the model called `submit_result` in the same step, which ended the
    /// run (llm-runner/v1 `structured_output`).
    pub const SKIPPED_AFTER_SUBMIT: &str = tool_result_reasons::SKIPPED_AFTER_SUBMIT;
    /// A budget (the session's input cap, or the run's token or cost budget) stopped the run
    /// before the call was dispatched: it never ran.
    pub const BUDGET_EXHAUSTED: &str = tool_result_reasons::BUDGET_EXHAUSTED;
    /// The context limit stopped the run before the call was dispatched: it never ran.
    pub const CONTEXT_CEILING: &str = tool_result_reasons::CONTEXT_CEILING;
    /// The tool ran, but its output was over the model-visible limit (64 KiB) and was
    /// discarded whole, never cut short; the call is not run again.
    pub const TOOL_RESULT_TOO_LARGE: &str = tool_result_reasons::TOOL_RESULT_TOO_LARGE;
}

/// The text of the result that closes a tool call whose outcome is unknown (delivered, then
/// broca stopped or the answer was lost): it may or may not have run, and is not run again.
pub const OUTCOME_UNKNOWN_TEXT: &str = "outcome unknown: broca stopped while this tool call \
     was in flight; it may or may not have run, and it was not run again";

/// A tool result block, as frozen into a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultBlock {
    pub call_id: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Why broca wrote this result itself (`outcome_unknown`, `unknown_tool`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `tool_result_too_large`: how large the discarded output was, and the limit.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub size: Option<ResultSize>,
    /// A result in parts (text and media, in the tool's order), each medium in the session's
    /// content store before this record; `content` is its text for the model then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<ResultPart>,
}

/// A part of a tool's result in parts, as llm-runner/v1's stored shape has it:
/// `{"type": "text", "text"}` or `{"type": "media", "kind", "mime", "bytes", "sha256"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultPart {
    Text { text: String },
    Media(broca_protocol::media::Media),
}

/// The measured size of a tool's output that broca discarded, and the limit it passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultSize {
    pub bytes: u64,
    pub limit: u64,
}

/// A run was admitted. Opens an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStarted {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    /// blake3 of the send's canonical inputs: the same send_id with other inputs is refused.
    pub inputs_digest: String,
    pub prompt: String,
    pub config: FrozenConfig,
    /// Results for tool calls an earlier run left indeterminate: outcome unknown, never a fake
    /// success. They precede the prompt in the transcript.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resolved_calls: Vec<ResultBlock>,
    pub at_unix_ms: u64,
    /// The daemon-attested principal that sent it (module routes), and its route's scope
    /// owner: the first run's are the session's owners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_owner: Option<String>,
    /// The queued send (`SendQueued`) this run delivers, when it waited for its turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    /// The caller's own id for the prompt's message (llm-runner/v1 `client_message_id`): kept
    /// beside the message, never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    /// The id (`mid`) of the message whose calls `resolved_calls` answer (absent in logs
    /// written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_mid: Option<String>,
    /// The send's delivery mode when it was not `queue` (`steer` or `interrupt`): part of the
    /// send's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// The steered send (its `SendSteered` seq) this run delivers as its turn: a steer its run
    /// ended before rendering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer_seq: Option<u64>,
    /// The media the send attached (llm-runner/v1 `attachments`), after its prompt, each
    /// committed in the session's content store before this record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<broca_protocol::media::Media>,
    /// The send's ordered delivery (llm-runner/v1 `delivery_order`), when its `delivery` was a
    /// list: part of its identity (but its expiry), and the mode it went out in comes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<broca_protocol::delivery::SendOrder>,
    /// What the plan's `pre_user` hooks did to the prompt before it was written, in call
    /// order (step-transform-provider/v2; the attribution record): `{module, ops}` with the
    /// operations as answered, `{module, pass: true}`, or `{module, unavailable}` for a hook
    /// passed over. The prompt above is the text after them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_user: Vec<serde_json::Value>,
}

/// Older turns summarized by the run's model (docs/compaction.md): from this record on, the
/// model's requests carry `summary` in place of the conversation's first `replaced`
/// messages (the session's whole conversation, counted from its start). Durable before the
/// request that uses it; replay puts the same summary in, so a summary is never asked for
/// twice. The messages it stands in for stay in the log and in every read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextCompacted {
    pub run_id: String,
    /// The step whose request is the first to carry it (it comes before its StepStarted).
    pub step: u32,
    /// How many messages of the conversation, from its start, the summary stands in for
    /// (the one after them is an assistant message).
    pub replaced: u64,
    /// The summary's text: the first user message of the model's requests from now on.
    pub summary: String,
    /// What the summary's request cost, as its provider reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<broca_protocol::Usage>,
    /// The estimate (tokens) of the request that would have been sent without it.
    pub estimate_before: u64,
    pub at_unix_ms: u64,
}

/// A tool call's answer that came after its run sealed the call without an outcome (a
/// restart cut it while its module held it): a tool module's terminal `late_results` entry
/// (tool-provider/v1 §7), recorded once (by its `event_id`) and never sent again. The run's
/// own record of the call stays as it was; this says what the call came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultLate {
    /// The run that sealed the call, and the call (the model's id).
    pub run_id: String,
    pub call_id: String,
    pub call_key: String,
    /// The module that settled it, and its entry's deterministic id.
    pub module: String,
    pub event_id: String,
    /// `result`, `not_started` (it never ran) or `expired` (the module let it go).
    pub outcome: String,
    /// The answer's text (for `not_started`, the module's reason).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// When the module settled it, and when broca recorded it.
    pub settled_at_unix_ms: u64,
    pub at_unix_ms: u64,
}

/// A model step began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStarted {
    pub run_id: String,
    pub step: u32,
    /// When the step began (absent in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
    /// The steered sends (their `SendSteered` seqs, in the order accepted) whose prompts join
    /// the conversation at this step, before its request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steers: Vec<u64>,
    /// Of those, the sends with an ordered delivery: the mode each went out in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered: Vec<StepDelivered>,
}

/// How an ordered send a step renders went out (llm-runner/v1 §9.7 `delivered_as`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDelivered {
    /// Its `SendSteered` seq (one of the step's `steers`).
    pub seq: u64,
    /// `steer` or `tool_result`.
    pub mode: String,
    /// For `tool_result`: the call whose result it went out with (the step before's last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A model attempt failed; its partial output is never committed as a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelAttemptFinished {
    pub run_id: String,
    pub step: u32,
    pub attempt: u32,
    pub error: ClassifiedError,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Whether the provider had begun to answer: an attempt that had may have been billed,
    /// so it is metered even when it reported no usage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answered: bool,
    /// When the attempt ended (absent in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
}

/// A model step completed: the assistant's content, durable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelStepFinished {
    pub run_id: String,
    pub step: u32,
    pub attempt: u32,
    pub content: Vec<Block>,
    pub usage: Usage,
    pub finish_reason: FinishReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The provider's quota as its answer said it (ChatGPT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<broca_protocol::Quota>,
    /// When the step ended (absent in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
    /// The seq of the step's StepStarted record: the assistant message's id (`mid`), known
    /// before its first word streams. Absent in logs written before it was recorded (their
    /// messages are named by this record's own seq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seq: Option<u64>,
}

/// The tools of one step are about to be dispatched: durable before any of them leaves broca.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDispatchIntent {
    pub run_id: String,
    pub step: u32,
    pub batch_id: String,
    pub calls: Vec<ToolCall>,
    /// Each call's key (llm-runner/v1 `call_key`), in `calls`' order: minted here, the record
    /// that first holds the call, so it is the same after any restart and differs between
    /// sibling calls and between steps reusing a model id. Absent in older logs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_keys: Vec<String>,
    /// Each call's module (its frozen route's), in `calls`' order: `None` for a call broca
    /// refuses itself and never sends (an unknown tool, arguments its schema refuses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dispatched_to: Vec<Option<String>>,
    /// Each call's `schema_pin`, in `calls`' order: the tool-provider/v1 pin of the definition
    /// its frozen route names (absent for a call never sent, and for an MCP server's tool,
    /// which has no provider definition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schema_pins: Vec<Option<String>>,
    /// The step's StepStarted seq: the id of the message holding the calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seq: Option<u64>,
    /// When the calls were handed to dispatch (their start time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
}

impl ToolDispatchIntent {
    /// The key of the call at `index` (absent in logs written before keys were recorded).
    pub fn call_key(&self, index: usize) -> Option<&str> {
        self.call_keys.get(index).map(String::as_str)
    }

    /// The schema pin of the call at `index`, when it has one.
    pub fn schema_pin(&self, index: usize) -> Option<&str> {
        self.schema_pins.get(index).and_then(|p| p.as_deref())
    }
}

/// One tool call's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    pub run_id: String,
    pub batch_id: String,
    #[serde(flatten)]
    pub result: ResultBlock,
    /// The step's StepStarted seq: the id of the message holding the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seq: Option<u64>,
    /// The call's key and schema pin, as its dispatch intent recorded them (for a call sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_pin: Option<String>,
    /// When the result was recorded (the call's finish time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
}

/// A run stopped and waits for the caller (credentials needed). Terminal for the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPaused {
    pub run_id: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ClassifiedError>,
    pub usage: Usage,
    #[serde(flatten)]
    pub spend: SpendSummary,
    /// When the run paused (absent in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishKind {
    Completed,
    MaxSteps,
    BudgetExhausted,
    /// A budget needs a measure the provider did not report (or a price the catalog lacks).
    BudgetUnmeasured,
    ContextLimit,
    Cancelled,
    Interrupted,
    Error,
}

impl FinishKind {
    /// The wire name (the role's `run_finished` reason where the role has one).
    pub fn as_str(self) -> &'static str {
        use cortexkit_role_llm_runner::live::run_reasons;
        match self {
            FinishKind::Completed => run_reasons::COMPLETED,
            FinishKind::MaxSteps => run_reasons::MAX_STEPS,
            FinishKind::BudgetExhausted => run_reasons::BUDGET_EXHAUSTED,
            FinishKind::BudgetUnmeasured => "budget_unmeasured",
            FinishKind::ContextLimit => "context_limit",
            FinishKind::Cancelled => run_reasons::CANCELLED,
            FinishKind::Interrupted => run_reasons::INTERRUPTED,
            FinishKind::Error => run_reasons::ERROR,
        }
    }
}

/// A run ended. Exactly one per run (or one [`RunPaused`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFinished {
    pub run_id: String,
    pub reason: FinishKind,
    /// A sentence saying why, for reasons that need one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ClassifiedError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indeterminate_tool_calls: Vec<String>,
    pub usage: Usage,
    #[serde(flatten)]
    pub spend: SpendSummary,
    /// When the run ended (absent in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ms: Option<u64>,
    /// Why an interrupted run was sealed (`interrupt_cause`); absent in logs written before
    /// it was recorded, and for other ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// For a budget's stop: which budget, its limit, what was spent, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStop>,
    /// The run's structured output (llm-runner/v1 `StructuredOutputResult`), on a run
    /// admitted with `structured_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<serde_json::Value>,
}

/// The budget that stopped a run (`budget_exhausted` or `budget_unmeasured`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetStop {
    /// `max_input_tokens` (the session's input cap), `max_total_tokens` or
    /// `max_cost_micros` (the run's budgets).
    pub measure: String,
    pub limit: u64,
    /// What was measured as spent, in the budget's unit (for an unmeasured stop, what the
    /// measured steps before the unmeasured one spent).
    pub spent: u64,
    /// `limit_reached`, `usage_unreported` or `unpriced`.
    pub cause: String,
}

/// The measures and causes of a [`BudgetStop`].
pub mod budget_stop {
    use cortexkit_role_llm_runner::run::budget_exhausted_causes;

    pub const MAX_INPUT_TOKENS: &str = "max_input_tokens";
    pub const MAX_TOTAL_TOKENS: &str = "max_total_tokens";
    pub const MAX_COST_MICROS: &str = "max_cost_micros";
    pub const LIMIT_REACHED: &str = budget_exhausted_causes::LIMIT_REACHED;
    pub const USAGE_UNREPORTED: &str = budget_exhausted_causes::USAGE_UNREPORTED;
    pub const UNPRICED: &str = "unpriced";
}

/// Why an interrupted run was sealed (the llm-runner/v1 role's interrupt reasons, and
/// broca's own).
pub mod interrupt_cause {
    use cortexkit_role_llm_runner::run::interrupt_reasons;

    /// Sealed during a planned stop (`broca serve` or the module asked to stop).
    pub const RUNNER_SHUTDOWN: &str = interrupt_reasons::RUNNER_SHUTDOWN;
    /// Sealed at the next start after broca died under the run.
    pub const RUNNER_CRASH: &str = interrupt_reasons::RUNNER_CRASH;
    /// A tool call was delivered and its answer lost while broca stayed up.
    pub const TOOL_OUTCOME_UNKNOWN: &str = "tool_outcome_unknown";
}

/// Beside a terminal record's usage: how many metered steps left a measure unreported (the
/// totals of that measure are then absent), and the run's cost at its frozen prices. Derived
/// from the step records, and kept here for readers of the record alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpendSummary {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unmeasured_steps: u32,
    /// In micro-units of the prices' currency; absent when unmeasured or unpriced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A run without a terminal record was picked up again (after a crash or restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResumed {
    pub run_id: String,
    /// The last step with a durable record.
    pub from_step: u32,
    pub at_unix_ms: u64,
}

/// The caller asked to cancel the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequested {
    pub run_id: String,
    pub at_unix_ms: u64,
    /// `step_boundary` for a cancel that lets the current step and its tool batch finish
    /// (absent: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}
