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

/// Prunes the reasoning of the log `bytes` (a session at rest: the archive checked that no
/// run is open), made at `at_unix_ms`. `Ok(None)` when nothing is left to prune (the log is
/// then packed as it is); `Err` names why the log cannot be pruned (it is then packed as it
/// is too).
pub fn prune_log(bytes: &[u8], at_unix_ms: u64) -> Result<Option<PrunedLog>, String> {
    let scan = broca_wal::scan(bytes).map_err(|e| e.to_string())?;
    if let Verdict::Corrupt { reason } = &scan.verdict {
        return Err(format!("the log is damaged: {reason}"));
    }
    let bytes = &bytes[..scan.end as usize];
    let decoded = scan
        .decode(bytes)
        .map_err(|(offset, why)| format!("the record at offset {offset} does not decode: {why}"))?;
    // One pass: each record applied as replay applies it; a record carrying reasoning is
    // applied as written (its message's entry then holds the original), then pruned.
    let mut session = Session::with_entries();
    let mut rewritten: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut messages = Vec::new();
    let mut through = 0u64;
    for (seq, record) in decoded.records {
        let carries = match &record {
            Record::ModelStepFinished(r) => r.content.iter().any(carries_reasoning),
            Record::EpisodeImported(r) => r
                .messages
                .iter()
                .any(|m| m.content.iter().any(carries_reasoning)),
            _ => false,
        };
        let misfit = |reason| format!("the log does not replay: record {seq}: {reason}");
        if !carries {
            session.apply(seq, record).map_err(misfit)?;
            continue;
        }
        session.apply(seq, record.clone()).map_err(misfit)?;
        let entries = session.entries.as_ref().map_or(&[][..], |e| &e.list[..]);
        // One message: pruned when its entry (one of the newest) holds it as recorded.
        let mut prune = |mid: String, content: &mut Vec<Block>| -> Result<bool, String> {
            if !content.iter().any(carries_reasoning) {
                return Ok(false);
            }
            let Some(index) = entries.iter().rposition(|e| e.mid == mid) else {
                return Ok(false);
            };
            let entry = &entries[index];
            if !matches!(&entry.body, broca_core::entries::Body::Message(m) if m.content == *content)
            {
                return Ok(false);
            }
            let stored = entry.body.to_json();
            let mut parts = Vec::new();
            for (i, b) in content.iter().enumerate() {
                if !carries_reasoning(b) {
                    continue;
                }
                let part = &stored["content"][i];
                let canonical = serde_jcs::to_vec(part).map_err(|e| e.to_string())?;
                parts.push(PrunedPart {
                    index: i as u32,
                    kind: kinds::REASONING.to_string(),
                    sha256: content_digest(part),
                    bytes: canonical.len() as u64,
                });
            }
            *content = content.iter().map(emptied).collect();
            through = through.max(index as u64 + 1);
            // A message still carrying reasoning was never pruned: its digest as written is
            // the one over what it holds now.
            let digest = content_digest(&stored);
            messages.push(PrunedMessage { mid, digest, parts });
            Ok(true)
        };
        let changed = match record {
            Record::ModelStepFinished(mut r) => {
                let mid = broca_core::replay::assistant_mid(seq, &r).to_string();
                prune(mid, &mut r.content)?.then(|| Record::ModelStepFinished(r))
            }
            Record::EpisodeImported(mut r) => {
                let mut any = false;
                for (i, m) in r.messages.iter_mut().enumerate() {
                    any |= prune(broca_core::entries::imported_mid(seq, i), &mut m.content)?;
                }
                any.then(|| Record::EpisodeImported(r))
            }
            _ => None,
        };
        if let Some(record) = changed {
            let mut payload = Vec::new();
            record.encode_payload(&mut payload);
            rewritten.insert(seq, payload);
        }
    }
    // A session whose plan names a compaction provider is never pruned: its provider holds
    // copies of what it read, and the compaction contract defines no acceptance of a re-read
    // that differs (llm-runner/v1 0.8, `archive_prunes_reasoning`).
    if messages.is_empty() || broca_ck::provided::provider_of(&session).is_some() {
        return Ok(None);
    }
    let prior = session.prunes.state;
    let state = PruneState::new(
        prior.map_or(1, |p| p.generation + 1),
        prior.map_or(through, |p| p.through_ordinal.max(through)),
        at_unix_ms,
    );
    let parts = messages.iter().map(|m| m.parts.len()).sum();
    let record = Record::ReasoningPruned(Box::new(ReasoningPruned {
        generation: state.generation,
        through_ordinal: state.through_ordinal,
        at_unix_ms,
        messages,
    }));
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
        return Err("the prune's record would be over a record's limit".into());
    }
    put(
        &mut out,
        scan.next_seq(),
        scan.epoch_max,
        record.kind(),
        &payload,
    );
    Ok(Some(PrunedLog {
        bytes: out,
        parts,
        state,
    }))
}
