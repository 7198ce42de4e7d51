//! What a session's reasoning prunes left (its `reasoning_pruned` records, folded as they are
//! applied): the prune state, and what reads serve of each message's original. The rewrite
//! that makes a prune is broca-read's `prune`.

use std::collections::HashMap;

use broca_wal::runrec::{PrunedMessage, ReasoningPruned};
use cortexkit_role_llm_runner::archive_prunes_reasoning::{
    PrunedReasoning, ReasoningPruned as PruneState,
};

/// What a session's prunes left: its state (`reasoning_pruned`) and, by mid, what reads
/// serve of each message's original.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prunes {
    pub state: Option<PruneState>,
    pub messages: HashMap<String, PrunedMessage>,
}

impl Prunes {
    /// Applies a prune's record.
    pub fn apply(&mut self, r: &ReasoningPruned) {
        self.state = Some(PruneState::new(
            r.generation,
            r.through_ordinal,
            r.at_unix_ms,
        ));
        for m in &r.messages {
            match self.messages.get_mut(&m.mid) {
                Some(held) => {
                    let new = m
                        .parts
                        .iter()
                        .filter(|p| !held.parts.iter().any(|h| h.index == p.index));
                    held.parts.extend(new.cloned().collect::<Vec<_>>());
                    held.parts.sort_by_key(|p| p.index);
                }
                None => {
                    self.messages.insert(m.mid.clone(), m.clone());
                }
            }
        }
    }

    /// The page rows of the message `mid`'s emptied parts (none when it was never pruned).
    pub fn rows(&self, mid: &str) -> Vec<PrunedReasoning> {
        self.messages.get(mid).map_or_else(Vec::new, |m| {
            m.parts
                .iter()
                .map(|p| {
                    PrunedReasoning::new(
                        mid,
                        p.index.to_string(),
                        p.kind.clone(),
                        p.bytes,
                        p.sha256.clone(),
                    )
                })
                .collect()
        })
    }
}
