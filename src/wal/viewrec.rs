//! A compaction provider's view the session accepted (cortexkit-role-compaction's
//! `session.apply_view`, W5.5): durable before `accepted` is answered, and the view a run
//! renders its requests through from its next step boundary on, after a restart too.

use serde::{Deserialize, Serialize};

/// A view accepted from the session's compaction provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewAccepted {
    /// The provider's module, as the route it came on attested it.
    pub provider: String,
    /// The view as handed over (`{version, checksum, edits}`), whole: each accepted view
    /// carries every edit of the one before (V2), so the latest is the session's view.
    pub view: serde_json::Value,
    pub at_unix_ms: u64,
}
