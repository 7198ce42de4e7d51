//! Steered sends in a run (a child of `machine`): a run started with steers waiting, a steer
//! that joins the run in flight, and whether one waits for the next step boundary (where
//! `next_step_or_stop` renders them, and a run that would complete takes another step).

use super::*;
use broca_protocol::delivery::SendOrder;
use broca_protocol::Block;
use cortexkit_role_llm_runner::delivery_order::{choose, expired, Boundary, Mode};

/// A send waiting for the run's next step boundary: a steer, or a send whose ordered
/// delivery lists a mode a run in progress can take (`steer`, `tool_result`).
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    /// Its `SendSteered` seq.
    pub seq: u64,
    pub blocks: Vec<Block>,
    /// Its list; `None` for a steer, which goes out at the next boundary.
    pub order: Option<SendOrder>,
    /// Its submission (an ordered send's), which its end names.
    pub submission_id: Option<String>,
}

impl From<(u64, Vec<Block>)> for Waiting {
    fn from((seq, blocks): (u64, Vec<Block>)) -> Self {
        Waiting {
            seq,
            blocks,
            order: None,
            submission_id: None,
        }
    }
}

/// What one step boundary renders of the waiting sends.
pub(super) struct Rendered {
    /// The seqs rendered, in order.
    pub(super) steers: Vec<u64>,
    /// The ordered ones among them, with their mode.
    pub(super) delivered: Vec<broca_wal::runrec::StepDelivered>,
    /// The ordered sends whose time passed undelivered: each ends `expired`.
    pub(super) expired: Vec<String>,
}

impl RunMachine {
    /// [`RunMachine::start`] for a session whose steered sends (their record's seq and
    /// prompt) wait: the first step renders them after the run's prompt; and whose older
    /// turns a summary stands in for, when one does.
    pub fn start_with_steers(
        run_id: String,
        config: FrozenConfig,
        transcript: Vec<Arc<Message>>,
        compacted: Option<crate::compaction::Compacted>,
        steers: Vec<impl Into<Waiting>>,
        now_ms: u64,
    ) -> RunMachine {
        let mut m = RunMachine::new(run_id, config, transcript, 0, Spend::default(), now_ms);
        m.steers = steers.into_iter().map(Into::into).collect();
        m.compacted = compacted;
        m.next_step_or_stop();
        m
    }

    /// A steer waits for the next step boundary (a run already sealing leaves it to the next
    /// turn).
    pub(super) fn on_steer(&mut self, waiting: Waiting) {
        if !matches!(self.phase, Phase::Sealing(_) | Phase::Done) {
            self.steers.push(waiting);
        }
    }

    /// Takes the ordered send of `submission_id` off the sends waiting for the next boundary
    /// (it is being retracted); false when the run holds no such send (it went out already).
    pub fn withdraw(&mut self, submission_id: &str) -> bool {
        let before = self.steers.len();
        self.steers
            .retain(|w| w.submission_id.as_deref() != Some(submission_id));
        self.steers.len() < before
    }

    /// Whether a send waits that the next step would render even with no tool result to
    /// send (a steer, or a list naming `steer`): a run that would complete takes another
    /// step for it.
    pub(crate) fn steers_waiting(&self) -> bool {
        self.steers.iter().any(|w| {
            w.order
                .as_ref()
                .is_none_or(|o| o.modes.contains(&Mode::Steer))
        })
    }

    /// Renders the waiting sends this boundary can take into the conversation, after every
    /// result of the step before: every steer, and each ordered send in the first mode of its
    /// list possible here (`tool_result` only where the step before's results go out now);
    /// the others wait on, but those whose time passed, which end.
    pub(super) fn render_waiting(&mut self) -> Rendered {
        let mut boundary = Boundary::default().with_run_in_progress();
        let with_result = self.fresh_results.then(|| {
            self.transcript
                .iter()
                .rev()
                .find(|m| m.role == broca_protocol::Role::Assistant)
                .and_then(|m| m.tool_calls().last().map(|c| c.id.clone()))
        });
        let with_result = with_result.flatten();
        if with_result.is_some() {
            boundary = boundary.with_tool_result();
        }
        self.fresh_results = false;
        let mut out = Rendered {
            steers: Vec::new(),
            delivered: Vec::new(),
            expired: Vec::new(),
        };
        let mut keep = Vec::new();
        for w in std::mem::take(&mut self.steers) {
            let mode = match &w.order {
                None => None,
                Some(o) if expired(o.expires_at_ms, self.now_ms) => {
                    out.expired.extend(w.submission_id.clone());
                    continue;
                }
                Some(o) => match choose(&o.modes, &boundary) {
                    Some(mode) => Some(mode),
                    None => {
                        keep.push(w);
                        continue;
                    }
                },
            };
            if let Some(mode) = mode {
                out.delivered.push(broca_wal::runrec::StepDelivered {
                    seq: w.seq,
                    mode: mode.as_str().to_string(),
                    tool_call_id: (mode == Mode::ToolResult)
                        .then(|| with_result.clone())
                        .flatten(),
                });
            }
            crate::replay::push_steer(&mut self.transcript, w.blocks);
            out.steers.push(w.seq);
        }
        self.steers = keep;
        out
    }
}
