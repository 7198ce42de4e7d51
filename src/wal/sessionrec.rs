//! The session's own records, beside its runs': its release, a prune of its reasoning, its
//! uploads. JSON in their frames; fields that are optional are omitted when absent.

use serde::{Deserialize, Serialize};

/// The session's owner released it (llm-runner/v1 `session.release`): it takes no more
/// sends, and is deleted once no run of it is left and its floor has passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionReleased {
    /// When the release was recorded.
    pub at_unix_ms: u64,
    /// Who released it (the daemon-attested principal), when one was attested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// The archive pruned reasoning from the session at rest (llm-runner/v1
/// `archive_prunes_reasoning`): the records before it were rewritten with the parts it names
/// emptied in place, and it keeps what reads still serve of the originals. It is the last
/// record of the rewritten log, in the same container as the pruned records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningPruned {
    /// 1 for the session's first prune, one more for each later one.
    pub generation: u64,
    /// The highest ordinal any prune of the session touched.
    pub through_ordinal: u64,
    /// When this prune was made.
    pub at_unix_ms: u64,
    /// The messages this prune changed, each with the parts it emptied.
    pub messages: Vec<PrunedMessage>,
}

/// A message a prune changed: its write-time digest and the parts emptied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedMessage {
    pub mid: String,
    /// The digest of the message as it was written (before any prune).
    pub digest: String,
    pub parts: Vec<PrunedPart>,
}

/// One part a prune emptied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedPart {
    /// Its index in the message's content.
    pub index: u32,
    /// The prune's kind (`reasoning`).
    pub kind: String,
    /// The digest of the part as it was written.
    pub sha256: String,
    /// The length of the part's canonical (RFC 8785) bytes as it was written.
    pub bytes: u64,
}

/// An upload into the session's content store began (llm-runner/v1
/// `session.upload_begin`): its id and what the uploader declared. Its bytes are not durable
/// until an [`UploadCommitted`] names it; an upload never committed is lost at restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadBegun {
    pub upload_id: String,
    pub mime: String,
    pub bytes: u64,
    pub sha256: String,
    /// The process that took the bytes (its start time): an upload begun by another is gone.
    pub boot: u64,
    pub at_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// An upload's bytes are in the session's content store under their SHA-256, checked against
/// what its begin declared and synced, before this record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadCommitted {
    pub upload_id: String,
    pub at_unix_ms: u64,
}
