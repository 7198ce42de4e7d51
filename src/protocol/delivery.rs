//! A send's ordered delivery (llm-runner/v1 §9.7 `delivery_order`), as broca keeps it with
//! the send: in a request's parameters and in the WAL's record of the send.

use serde::{Deserialize, Serialize};

/// A send's ordered delivery (llm-runner/v1 §9.7 `delivery_order`): the modes it may go out
/// in, first possible first, and the members that ride beside the list. The list, the dedupe
/// key and the template are part of the send's identity; the expiry is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendOrder {
    pub modes: Vec<cortexkit_role_llm_runner::delivery_order::Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<cortexkit_role_llm_runner::delivery_order::TemplateUse>,
}

impl SendOrder {
    /// Whether the list may start a run (only `idle_start` does).
    pub fn may_start_a_run(&self) -> bool {
        self.modes
            .contains(&cortexkit_role_llm_runner::delivery_order::Mode::IdleStart)
    }

    /// The send's delivery as its identity compares it: the list, the dedupe key and the
    /// template, never the expiry (a retry under the same `send_id` keeps its first deadline).
    pub fn identity(&self) -> String {
        let mut same = self.clone();
        same.expires_at_ms = None;
        serde_json::to_string(&same).expect("an order serializes")
    }

    /// The list's problem, if any: empty, or a mode twice.
    pub fn list_problem(&self) -> Option<&'static str> {
        let mut seen = std::collections::BTreeSet::new();
        if self.modes.is_empty() {
            Some("a delivery list names at least one mode")
        } else if !self.modes.iter().all(|m| seen.insert(*m)) {
            Some("a delivery list names each mode once")
        } else {
            None
        }
    }
}

/// A send's delivery as a repeated `send_id` compares it: its string mode when not `queue`,
/// else its list's [`SendOrder::identity`], else none (`queue`).
pub fn delivery_identity(delivery: Option<&str>, order: Option<&SendOrder>) -> Option<String> {
    delivery
        .map(str::to_string)
        .or_else(|| order.map(SendOrder::identity))
}
