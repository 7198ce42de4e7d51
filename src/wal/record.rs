//! The WAL's record kinds. Each record is a frame whose `kind` says how to read its JSON
//! payload. Kinds this build does not know are skipped and counted, never fatal, so a newer
//! writer's records do not stop an older reader.

use serde::{Deserialize, Serialize};

/// Kind codes. Codes are never reused for another meaning.
pub mod kind {
    /// [`super::LeaseAcquired`].
    pub const LEASE_ACQUIRED: u16 = 1;
}

/// A record of the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A writer took the lease: the epoch that fences older writers out.
    LeaseAcquired(LeaseAcquired),
    /// A kind this build does not know; its payload is kept as it is.
    Unknown { kind: u16, payload: Vec<u8> },
}

/// Written first by every writer that opens the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAcquired {
    /// The lease epoch: one more than any epoch the log held before.
    pub epoch: u32,
    /// The writer's process id.
    pub pid: u32,
    /// When the lease was taken.
    pub at_unix_ms: u64,
    /// A torn tail this writer cut logically when it opened the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<TailCut>,
}

/// Where a torn tail was cut, and how many bytes lay beyond the cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailCut {
    pub at_offset: u64,
    pub bytes: u64,
}

impl Record {
    /// The frame kind code.
    pub fn kind(&self) -> u16 {
        match self {
            Record::LeaseAcquired(_) => kind::LEASE_ACQUIRED,
            Record::Unknown { kind, .. } => *kind,
        }
    }

    /// The kind's name, as `broca wal dump` shows it.
    pub fn kind_name(code: u16) -> Option<&'static str> {
        match code {
            kind::LEASE_ACQUIRED => Some("lease_acquired"),
            _ => None,
        }
    }

    /// Writes the payload's JSON into `out` (cleared first).
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Record::LeaseAcquired(r) => serde_json::to_writer(&mut *out, r),
            Record::Unknown { payload, .. } => {
                out.extend_from_slice(payload);
                Ok(())
            }
        }
        .expect("records serialize to JSON");
    }

    /// Reads a payload of kind `code`. Unknown kinds come back as [`Record::Unknown`]; a known
    /// kind whose JSON does not parse is an error naming the kind.
    pub fn decode(code: u16, payload: &[u8]) -> Result<Record, String> {
        let bad = |e: serde_json::Error| {
            format!(
                "{} payload does not parse: {e}",
                Record::kind_name(code).unwrap_or("?")
            )
        };
        match code {
            kind::LEASE_ACQUIRED => Ok(Record::LeaseAcquired(
                serde_json::from_slice(payload).map_err(bad)?,
            )),
            _ => Ok(Record::Unknown {
                kind: code,
                payload: payload.to_vec(),
            }),
        }
    }
}
