//! A send's records besides the run it starts (`run_started`): one queued behind the active
//! run, one steered into it, and one withdrawn or ended undelivered (docs/wal-format.md).

use serde::{Deserialize, Serialize};

use crate::frozen::FrozenConfig;

/// A send that came while a run was active: admitted, frozen as a RunStarted would freeze
/// it, and waiting for the active run to end (the llm-runner/v1 role's `queue` delivery). Its
/// run's RunStarted names the submission; a retraction withdraws it first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SendQueued {
    pub submission_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    pub inputs_digest: String,
    pub prompt: String,
    pub config: FrozenConfig,
    pub at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_owner: Option<String>,
    /// As in [`RunStarted`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    /// `interrupt` for an interrupting send: the active run is cancelled once this record is
    /// durable, and this send starts next, before any other queued one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// As in [`RunStarted`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<broca_protocol::media::Media>,
    /// The send's ordered delivery (llm-runner/v1 `delivery_order`), when its `delivery` was a
    /// list: part of its identity (but its expiry), and the mode it went out in comes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<broca_protocol::delivery::SendOrder>,
    /// As in [`crate::runrec::RunStarted`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_user: Vec<serde_json::Value>,
}

/// A send steered into the active run `run_id` (llm-runner/v1 `delivery: steer`): admitted
/// under that run's frozen settings and durable before its reply; its prompt joins the
/// conversation at the run's next step boundary (the StepStarted naming this record's seq),
/// never between a call and its result. A run that ends before rendering it leaves it to start
/// the next turn (a RunStarted naming this seq).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendSteered {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_id: Option<String>,
    pub inputs_digest: String,
    pub prompt: String,
    pub at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    /// The media the send attached (llm-runner/v1 `attachments`), after its prompt, each
    /// committed in the session's content store before this record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<broca_protocol::media::Media>,
    /// The session's retention in seconds as this steer left it, when the steer named one
    /// (llm-runner/v1 `retention`: a later send may shorten it, a steer too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<u64>,
    /// The storage policy the steer named (llm-runner/v1 `session_retention`), as in
    /// [`FrozenConfig::retention_policy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
    /// The send's ordered delivery (llm-runner/v1 `delivery_order`), when its `delivery` was a
    /// list: part of its identity (but its expiry), and the mode it went out in comes of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<broca_protocol::delivery::SendOrder>,
    /// An ordered send's submission (it answers `pending` with it until it goes out, and it
    /// is retracted or ended by it); a send that waited queued keeps the one it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    /// As in [`crate::runrec::RunStarted`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_user: Vec<serde_json::Value>,
}

/// A queued send withdrawn before it started (`session.retract`), or, for a send with an
/// ordered delivery, ended undelivered for the reason `ended` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendRetracted {
    pub submission_id: String,
    pub at_unix_ms: u64,
    /// Why an ordered send ended undelivered (absent: its sender retracted it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<SendEnded>,
}

/// Why a send with an ordered delivery ended undelivered (llm-runner/v1 §9.7): each a
/// terminal send state, which a re-send of its `send_id` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SendEnded {
    /// A later send of the same sender with the same `dedupe_key` replaced it.
    Superseded { by: String },
    /// Its `expires_at_ms` passed first.
    Expired,
    /// The part its template's `part_tag` slot named left the request first.
    TemplatePartGone { slot: String },
}

impl SendEnded {
    /// The terminal send state (`send::states`).
    pub fn state(&self) -> &'static str {
        use cortexkit_role_llm_runner::send::states;
        match self {
            SendEnded::Superseded { .. } => states::SUPERSEDED,
            SendEnded::Expired => states::EXPIRED,
            SendEnded::TemplatePartGone { .. } => states::TEMPLATE_PART_GONE,
        }
    }
}
