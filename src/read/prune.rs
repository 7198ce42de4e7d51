//! Reasoning pruned from a session at rest (llm-runner/v1 `archive_prunes_reasoning`,
//! docs/retention.md): the archive hands a session's log bytes to [`prune_log`] as it packs
//! them, and seals what comes back. The log is rewritten with every model step's reasoning
//! emptied in place (`{"thinking": {"text": ""}}`: the block keeps its index and its type,
//! its text is emptied and its signature removed), and one [`ReasoningPruned`] record closes
//! it, keeping what reads still serve of the originals: each message's write-time digest,
//! each emptied part's digest and canonical length. Every other record keeps its bytes;
//! seqs, the lineage and the epochs are unchanged, so ordinals, mids and history versions
//! are too. Sans-IO: bytes in, bytes out.

use std::collections::HashMap;

use broca_protocol::Block;
use broca_wal::runrec::{PrunedMessage, PrunedPart, ReasoningPruned};
use broca_wal::{frame, Record, Verdict};
use cortexkit_role_llm_runner::archive_prunes_reasoning::{kinds, ReasoningPruned as PruneState};
use cortexkit_role_llm_runner::content_digest::content_digest;

use broca_core::replay::Session;

/// The kinds broca prunes: a reasoning block's text and signature. broca's other blocks carry
/// no signature, so `signature` has nothing to act on; `opaque_reasoning` (the signature
/// alone) is not offered.
pub const KINDS: &[&str] = &[kinds::REASONING];

pub use broca_core::replay::prunes::Prunes;

/// Whether a stored block carries what a `reasoning` prune removes.
pub fn carries_reasoning(b: &Block) -> bool {
    matches!(b, Block::Thinking { text, signature } if !text.is_empty() || signature.is_some())
}

/// A block as a `reasoning` prune leaves it.
fn emptied(b: &Block) -> Block {
    match b {
        Block::Thinking { .. } => Block::Thinking {
            text: String::new(),
            signature: None,
        },
        other => other.clone(),
    }
}

/// What [`prune_log`] made.
#[derive(Debug)]
pub struct PrunedLog {
    /// The rewritten log: its header, every record, then the prune's record.
    pub bytes: Vec<u8>,
    /// The parts emptied.
    pub parts: usize,
    /// The session's prune state after it.
    pub state: PruneState,
}

/// Why a log cannot be pruned (it is then packed as it is).
#[derive(Debug)]
pub enum PruneError {
    /// The log's frames do not read.
    Unreadable(String),
    /// The log is damaged past a torn tail.
    Damaged(String),
    /// The record at `offset` does not decode.
    Undecodable { offset: u64, why: String },
    /// The record `seq` does not fit its session.
    Misfit {
        seq: u64,
        reason: broca_core::replay::Misfit,
    },
    /// A pruned part has no canonical form.
    Canonical(String),
    /// The prune's own record would pass a record's limit.
    TooLarge,
}

impl std::fmt::Display for PruneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PruneError::Unreadable(why) => write!(f, "the log does not read: {why}"),
            PruneError::Damaged(reason) => write!(f, "the log is damaged: {reason}"),
            PruneError::Undecodable { offset, why } => {
                write!(f, "the record at offset {offset} does not decode: {why}")
            }
            PruneError::Misfit { seq, reason } => {
                write!(f, "the log does not replay: record {seq}: {reason}")
            }
            PruneError::Canonical(why) => write!(f, "a pruned part has no canonical form: {why}"),
            PruneError::TooLarge => {
                f.write_str("the prune's record would be over a record's limit")
            }
        }
    }
}

impl std::error::Error for PruneError {}

/// Prunes the reasoning of the log `bytes` (a session at rest: the archive checked that no
/// run is open), made at `at_unix_ms`. `Ok(None)` when nothing is left to prune (the log is
/// then packed as it is); `Err` names why the log cannot be pruned (it is then packed as it
/// is too).
pub fn prune_log(bytes: &[u8], at_unix_ms: u64) -> Result<Option<PrunedLog>, PruneError> {
    let scan = broca_wal::scan(bytes).map_err(|e| PruneError::Unreadable(e.to_string()))?;
    if let Verdict::Corrupt { reason } = &scan.verdict {
        return Err(PruneError::Damaged(reason.to_string()));
    }
    let bytes = &bytes[..scan.end as usize];
    let decoded = scan
        .decode(bytes)
        .map_err(|(offset, why)| PruneError::Undecodable {
            offset,
            why: why.to_string(),
        })?;
    // One pass: each record applied as replay applies it; a record carrying reasoning is
    // applied as written (its message's entry then holds the original), then pruned.
    let mut pruner = Pruner::new();
    for (seq, record) in decoded.records {
        pruner.apply(seq, record)?;
    }
    // A session whose plan names a compaction provider is never pruned: its provider holds
    // copies of what it read, and the compaction contract defines no acceptance of a re-read
    // that differs (llm-runner/v1 0.8, `archive_prunes_reasoning`).
    let session = &pruner.session;
    if pruner.messages.is_empty() || broca_ck::provided::provider_of(session).is_some() {
        return Ok(None);
    }
    let prior = session.prunes.state;
    let state = PruneState::new(
        prior.map_or(1, |p| p.generation + 1),
        prior.map_or(pruner.through, |p| p.through_ordinal.max(pruner.through)),
        at_unix_ms,
    );
    assert!(state.generation > 0, "a prune's generation counts from 1");
    let parts = pruner.messages.iter().map(|m| m.parts.len()).sum();
    assert!(parts > 0, "a message pruned had a part emptied");
    let record = Record::ReasoningPruned(Box::new(ReasoningPruned {
        generation: state.generation,
        through_ordinal: state.through_ordinal,
        at_unix_ms,
        messages: std::mem::take(&mut pruner.messages),
    }));
    let out = rewrite(&scan, bytes, &pruner.rewritten, &record)?;
    Ok(Some(PrunedLog {
        bytes: out,
        parts,
        state,
    }))
}

/// A log's prune as it goes: the session as its records replay, the payloads rewritten by
/// seq, the messages pruned and the newest ordinal among them.
struct Pruner {
    session: Session,
    rewritten: HashMap<u64, Vec<u8>>,
    messages: Vec<PrunedMessage>,
    through: u64,
}

impl Pruner {
    fn new() -> Pruner {
        Pruner {
            session: Session::with_entries(),
            rewritten: HashMap::new(),
            messages: Vec::new(),
            through: 0,
        }
    }

    /// Applies one record, and prunes the reasoning it carries.
    fn apply(&mut self, seq: u64, record: Record) -> Result<(), PruneError> {
        let carries = match &record {
            Record::ModelStepFinished(r) => r.content.iter().any(carries_reasoning),
            Record::EpisodeImported(r) => r
                .messages
                .iter()
                .any(|m| m.content.iter().any(carries_reasoning)),
            _ => false,
        };
        let misfit = |reason| PruneError::Misfit { seq, reason };
        if !carries {
            return self.session.apply(seq, record).map_err(misfit);
        }
        self.session.apply(seq, record.clone()).map_err(misfit)?;
        let changed = match record {
            Record::ModelStepFinished(mut r) => {
                let mid = broca_core::replay::assistant_mid(seq, &r).to_string();
                self.prune(mid, &mut r.content)?
                    .then(|| Record::ModelStepFinished(r))
            }
            Record::EpisodeImported(mut r) => {
                let mut any = false;
                for (i, m) in r.messages.iter_mut().enumerate() {
                    let mid = broca_core::entries::imported_mid(seq, i);
                    any |= self.prune(mid, &mut m.content)?;
                }
                any.then(|| Record::EpisodeImported(r))
            }
            _ => None,
        };
        if let Some(record) = changed {
            let mut payload = Vec::new();
            record.encode_payload(&mut payload);
            self.rewritten.insert(seq, payload);
        }
        Ok(())
    }

    /// Prunes one message's reasoning, when its entry (one of the newest) holds it as
    /// recorded; `true` when it did.
    fn prune(&mut self, mid: String, content: &mut Vec<Block>) -> Result<bool, PruneError> {
        if !content.iter().any(carries_reasoning) {
            return Ok(false);
        }
        let entries = self
            .session
            .entries
            .as_ref()
            .map_or(&[][..], |e| &e.list[..]);
        let Some(index) = entries.iter().rposition(|e| e.mid == mid) else {
            return Ok(false);
        };
        let entry = &entries[index];
        if !matches!(&entry.body, broca_core::entries::Body::Message(m) if m.content == *content) {
            return Ok(false);
        }
        let stored = entry.body.to_json();
        let mut parts = Vec::new();
        for (i, b) in content.iter().enumerate() {
            if !carries_reasoning(b) {
                continue;
            }
            let part = &stored["content"][i];
            let canonical =
                serde_jcs::to_vec(part).map_err(|e| PruneError::Canonical(e.to_string()))?;
            parts.push(PrunedPart {
                index: i as u32,
                kind: kinds::REASONING.to_string(),
                sha256: content_digest(part),
                bytes: canonical.len() as u64,
            });
        }
        *content = content.iter().map(emptied).collect();
        assert!(
            !content.iter().any(carries_reasoning),
            "a pruned message carries none"
        );
        self.through = self.through.max(index as u64 + 1);
        // A message still carrying reasoning was never pruned: its digest as written is the
        // one over what it holds now.
        let digest = content_digest(&stored);
        self.messages.push(PrunedMessage { mid, digest, parts });
        Ok(true)
    }
}

/// The log `bytes` (as `scan` read it) written again with the `rewritten` payloads in place
/// and `record` after its last: every frame keeps its seq and epoch.
fn rewrite(
    scan: &broca_wal::recovery::Scan,
    bytes: &[u8],
    rewritten: &HashMap<u64, Vec<u8>>,
    record: &Record,
) -> Result<Vec<u8>, PruneError> {
    let tag = scan.header.lineage_tag();
    let start = scan.header.data_offset as usize;
    let mut out = Vec::with_capacity(bytes.len() + 4096);
    out.extend_from_slice(&bytes[..start]);
    let put = |out: &mut Vec<u8>, seq: u64, epoch: u32, kind: u16, payload: &[u8]| {
        let at = out.len();
        out.resize(at + frame::FRAME_HEADER_BYTES + payload.len(), 0);
        // Every byte before a record of the rewritten log is durable with the container.
        frame::write_frame(&mut out[at..], seq, tag, at as u64, epoch, kind, payload);
    };
    for f in &scan.frames {
        let payload = rewritten
            .get(&f.seq)
            .map_or(&bytes[f.payload.clone()], Vec::as_slice);
        put(&mut out, f.seq, f.epoch, f.kind, payload);
    }
    let mut payload = Vec::new();
    record.encode_payload(&mut payload);
    if payload.len() > frame::PAYLOAD_BYTES_MAX {
        return Err(PruneError::TooLarge);
    }
    put(
        &mut out,
        scan.next_seq(),
        scan.epoch_max,
        record.kind(),
        &payload,
    );
    Ok(out)
}
