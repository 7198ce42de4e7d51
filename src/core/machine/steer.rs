//! Steered sends in a run (a child of `machine`): a run started with steers waiting, a steer
//! that joins the run in flight, and whether one waits for the next step boundary (where
//! `next_step_or_stop` renders them, and a run that would complete takes another step).

use super::*;
use broca_protocol::Block;

impl RunMachine {
    /// [`RunMachine::start`] for a session whose steered sends (their record's seq and
    /// prompt) wait: the first step renders them after the run's prompt; and whose older
    /// turns a summary stands in for, when one does.
    pub fn start_with_steers(
        run_id: String,
        config: FrozenConfig,
        transcript: Vec<Arc<Message>>,
        compacted: Option<crate::compaction::Compacted>,
        steers: Vec<(u64, Vec<Block>)>,
        now_ms: u64,
    ) -> RunMachine {
        let mut m = RunMachine::new(run_id, config, transcript, 0, Spend::default(), now_ms);
        m.steers = steers;
        m.compacted = compacted;
        m.next_step_or_stop();
        m
    }

    /// A steer waits for the next step boundary (a run already sealing leaves it to the next
    /// turn).
    pub(super) fn on_steer(&mut self, seq: u64, blocks: Vec<Block>) {
        if !matches!(self.phase, Phase::Sealing(_) | Phase::Done) {
            self.steers.push((seq, blocks));
        }
    }

    /// Whether steered sends wait for the next step.
    pub(crate) fn steers_waiting(&self) -> bool {
        !self.steers.is_empty()
    }
}
