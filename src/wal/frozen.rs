//! What a run freezes when it is admitted: everything that shapes its rendered requests (the
//! catalog entry as it was, the stop conditions, the input cap, structured output). JSON in
//! the `run_started` record; fields that are optional are omitted when absent.

use serde::{Deserialize, Serialize};

use broca_protocol::{CachePolicy, Generation, ToolSpec};

/// Everything that shapes a run's rendered requests, frozen when the run is admitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrozenConfig {
    /// Catalog provider id (`anthropic`, `openai`, ...).
    pub provider: String,
    pub model: String,
    /// Which credential pays; never the secret itself.
    pub credential_id: String,
    /// The renderer version the run's requests were rendered with.
    pub renderer_version: u32,
    /// blake3 of the catalog entry resolved at admission.
    pub catalog_digest: String,
    /// The catalog entry itself (limits, prices): the run's charge basis, and what a resume
    /// checks for incompatible drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Shared by every request of the run.
    #[serde(default, skip_serializing_if = "broca_protocol::no_tools")]
    pub tools: std::sync::Arc<[ToolSpec]>,
    /// blake3 of the tool specs.
    pub tools_digest: String,
    #[serde(default)]
    pub generation: Generation,
    pub stop: StopConditions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<u64>,
    pub cache_policy: CachePolicy,
    /// The trailing directives the run's final reply is read for (`wake`), as the send
    /// asked (llm-runner/v1 `turn_directives`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directives: Vec<String>,
    /// The shape the run's output is asked for (llm-runner/v1 `structured_output`), frozen
    /// at admission: every request of the run is rendered from these bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<FrozenStructuredOutput>,
    /// The caller's routing decision (llm-runner/v1 `route_decision_id`), fixed for the run:
    /// broca takes no routing accounts, so it is kept and compared, never forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_decision_id: Option<String>,
    /// The run's built-in compaction (docs/compaction.md), when the send turned it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<broca_protocol::compaction::Compaction>,
    /// The session's retention in seconds as this send left it (llm-runner/v1 `retention`):
    /// the first send's, or a shorter one a later send asked; absent, kept forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u64>,
    /// The session's storage policy as this send named it (llm-runner/v1
    /// `session_retention`): the first send naming one freezes it (docs/retention.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
    /// The run's title, as its send gave it: the caller's free text, shown by `runs.list`,
    /// never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The session's fetch plan, on the run (or queued send) whose send admitted the session
    /// with it (llm-runner/v1 `plans`); the session keeps it for life (crate::planrec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Box<crate::planrec::FrozenPlan>>,
}

pub use broca_protocol::structured::FrozenStructuredOutput;

/// The catalog entry a run was admitted with, as the WAL keeps it: a copy of the catalog's
/// fields (the catalog file's own types refuse unknown fields; this one ignores fields a
/// later build adds, so an old build still reads a newer log). Serialized field for field as
/// the catalog's entry, so its digest is the same bytes' digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    pub provider: CatalogProvider,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<CatalogPrices>,
    /// What the catalog said the model can do (unknown when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<CatalogCapability>,
}

/// A frozen entry's capabilities: each unknown when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogCapability {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<bool>,
    /// The input modalities the model takes (`text`, `image`, `pdf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_modalities: Option<Vec<String>>,
    /// The media types the model takes, where narrower than its family renders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_mime_types: Option<Vec<String>>,
}

impl FrozenConfig {
    /// What the run's frozen catalog entry says of the media its model takes.
    pub fn input_facts(&self) -> broca_protocol::media::InputFacts {
        let c = self.catalog.as_ref().and_then(|c| c.capability.as_ref());
        broca_protocol::media::InputFacts {
            modalities: c.and_then(|c| c.input_modalities.clone()),
            mime_types: c.and_then(|c| c.input_mime_types.clone()),
        }
    }

    /// The wire family the run's model speaks (from its frozen entry; empty for runs
    /// admitted before entries were frozen).
    pub fn family(&self) -> &str {
        self.catalog
            .as_ref()
            .map_or("", |c| c.provider.family.as_str())
    }
}

/// A frozen entry's provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogProvider {
    pub id: String,
    pub family: String,
    pub base_url: String,
    pub credential_env: String,
}

/// A frozen entry's prices, per `unit` of tokens in `currency`; a price not listed is
/// unknown, never zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogPrices {
    pub currency: String,
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Long-context prices, by rising threshold (see the catalog's `PriceTier`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<CatalogPriceTier>,
}

/// Prices for requests whose total input is above `above_input_tokens`; a price not listed
/// is the base price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogPriceTier {
    pub above_input_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

impl CatalogEntry {
    /// blake3 of the entry's JSON (the digest frozen beside it).
    pub fn digest(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("catalog entries serialize");
        blake3::hash(&bytes).to_hex()[..32].to_string()
    }
}

/// When a run stops besides the model ending its turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopConditions {
    pub max_steps: u32,
    /// A budget of input plus output tokens over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    /// A cost budget in micro-units of the catalog's currency (needs prices in the catalog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_micros: Option<u64>,
    /// The session's input-token cap (llm-runner/v1 `budget.max_input_tokens`), as it stood
    /// when the run started: the cap and what the session's earlier steps had consumed. In a
    /// queued send, the cap it asked for (the rest is filled when it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_cap: Option<InputCap>,
}

/// A session's input-token cap and its consumed input when a run starts. Consumed input is
/// each completed model step's total input (uncached, cache reads and cache writes, at face
/// value) over every run of the session; output never counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputCap {
    /// The cap: lower-only over the session's sends.
    pub limit: u64,
    /// The input the session's completed steps consumed before the run (only those before
    /// the first step that did not report its input, when one did not).
    #[serde(default)]
    pub spent: u64,
    /// Whether an earlier step did not report its input: the sum cannot be measured, so a
    /// capped run takes no step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unmeasured: bool,
}
