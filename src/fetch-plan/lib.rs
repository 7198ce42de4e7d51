//! broca-fetch-plan: a send's fetch plan and what a session freezes of it (the brief's
//! admission manifest), sans-IO: the plan read and checked, its providers' `tool.catalog`
//! answers checked into the plan a session freezes, a run's tools and system text made from
//! it (`plan`), the plan's `pre_user` step transforms (`pre_user`), its person-only commands
//! as their records tell them (`commands`), and mid-session changes of it (`change`). Nothing
//! here reads a session's state whole: what a check needs of it is handed in.

pub mod change;
pub mod commands;
pub mod plan;
pub mod pre_user;

use broca_protocol::ToolSpec;

/// The digest a run's config keeps of its tool specs.
pub fn tools_digest(tools: &[ToolSpec]) -> String {
    let bytes = serde_json::to_vec(tools).expect("tool specs serialize");
    blake3::hash(&bytes).to_hex()[..32].to_string()
}

/// Why one provider's answer did not arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missed {
    /// No answer within admission's deadline.
    Timeout,
    /// The provider could not be reached (why).
    Unavailable(String),
    /// The provider refused the request (its code, its message).
    Refused { code: String, message: String },
}

impl Missed {
    pub(crate) fn why(&self) -> String {
        match self {
            Missed::Timeout => "no answer within admission's deadline".into(),
            Missed::Unavailable(why) => why.clone(),
            Missed::Refused { code, message } => format!("it refused: {code}: {message}"),
        }
    }

    pub(crate) fn absent(&self, provider: &str, kind: &str) -> broca_wal::planrec::AbsentPlanItem {
        let (reason, provider_code) = match self {
            Missed::Timeout => ("timeout", None),
            Missed::Unavailable(_) => ("unavailable", None),
            Missed::Refused { code, .. } => ("refused", Some(code.clone())),
        };
        broca_wal::planrec::AbsentPlanItem {
            provider: provider.to_string(),
            kind: kind.to_string(),
            reason: reason.to_string(),
            provider_code,
        }
    }
}
