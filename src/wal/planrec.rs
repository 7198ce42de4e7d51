//! A session's fetch plan as admission froze it (llm-runner/v1 §10.1): carried by the
//! `RunStarted` (or `SendQueued`) of the send that admitted the session, in its config, and
//! held by the session for life. Later runs take its tools and system text; a later plan is
//! compared with it by identity.

use serde::{Deserialize, Serialize};

/// How the plan's system texts are joined into one, as the record names it: version 1 is
/// each arrived text in plan order, separated by one blank line.
pub const JOIN_VERSION: u32 = 1;

/// The fetch plan a session froze at admission, and what its fetch gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenPlan {
    /// The plan as sent, its RFC 8785 (JCS) text: the plan a `plan_drift` names.
    pub plan: String,
    /// SHA-256 of `plan` in 64 lowercase hex characters: the plan's identity.
    pub identity: String,
    /// SHA-256 of the plan's `composition` as JCS (tool-provider/v1's `composition_digest`);
    /// absent for a plan without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composition_digest: Option<String>,
    /// Every item that arrived: its provider, which of its items, and its digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<PlanItem>,
    /// Optional items that did not arrive, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent_items: Vec<AbsentPlanItem>,
    /// The joined system text of the items that arrived (none when no text did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_text: Option<String>,
    /// How `system_text` was joined ([`JOIN_VERSION`]).
    pub join_version: u32,
    /// The fetched tools, each routed to its provider, in plan order: a run of the session
    /// offers these (shared with every run's config, never copied per send). Not written:
    /// the record that carries the plan holds them once, as its config's `tools` (the run's
    /// own `submit_result` after them, when it asked for one); a replay takes them from there
    /// ([`FrozenPlan::tools_from`]).
    #[serde(default, skip_serializing)]
    pub tools: std::sync::Arc<[broca_protocol::ToolSpec]>,
    /// The digest a run's config keeps of `tools` (broca-core's `tools_digest`), taken once.
    #[serde(default)]
    pub tools_digest: String,
    /// The session-level capabilities the providers' answers declared (`late_results`,
    /// `host_params`), by provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<ProviderCapabilities>,
    /// The person-only commands the providers' answers declared (llm-runner/v1 §9.10), in
    /// plan order; none when the plan says `interactive: false`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_commands: Vec<FrozenCommand>,
    /// Whether a person may drive the session (the plan's `interactive`, true when absent).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub interactive: bool,
    /// The `session.refresh` generation that brought this plan (llm-runner/v1
    /// `session_change`); 0 for the plan the session was admitted with.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn yes() -> bool {
    true
}

fn is_yes(v: &bool) -> bool {
    *v
}

/// A person-only command a provider declared, as the session froze it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenCommand {
    /// The declaring provider (its module id).
    pub provider: String,
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument_hint: Option<String>,
}

/// One arrived plan item, as `session.baseline` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    pub provider: String,
    /// `tools` or `system_text` for a provider with both; absent for a provider with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// A tool item's catalog digest; a text item's `item_digest` (SHA-256 of its text).
    pub item_digest: String,
    /// A text item's `preflight_digest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight_digest: Option<String>,
}

/// An optional plan item that did not arrive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbsentPlanItem {
    pub provider: String,
    /// `system_text` (the only kind the role defines).
    pub kind: String,
    /// `timeout`, `unavailable` or `refused`.
    pub reason: String,
    /// The provider's refusal code, exactly when `reason` is `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_code: Option<String>,
}

/// The session-level capabilities one provider declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderCapabilities {
    pub provider: String,
    pub names: Vec<String>,
}

impl FrozenPlan {
    /// The plan's tools as the config of the record carrying it holds them: all of
    /// `config_tools`, but the run's own `submit_result` at their end when the run asked for
    /// structured output that way (`submit_tool`).
    pub fn tools_from(
        config_tools: &std::sync::Arc<[broca_protocol::ToolSpec]>,
        submit_tool: bool,
    ) -> std::sync::Arc<[broca_protocol::ToolSpec]> {
        match config_tools.split_last() {
            Some((_, plan)) if submit_tool => plan.to_vec().into(),
            _ => config_tools.clone(),
        }
    }
}
