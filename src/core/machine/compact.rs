//! The built-in compaction in a run (a child of `machine`; docs/compaction.md). Before a
//! step whose request would come near the context limit, the older turns are summarized by
//! the run's own model; the summary's `ContextCompacted` record is durable before the step
//! starts, and from then on the requests carry the summary in place of the turns it covers.
//! A resumed run takes the recorded summary from replay and never asks for it again. A
//! provider that refuses a request as too long (the estimate was short of its count) gets a
//! summary too, and the step's next attempt carries it.

use super::*;
use crate::compaction::{self, Compacted};

/// A summary being asked for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Compacting {
    /// Where it cuts.
    cut: usize,
    /// The estimate that made it due.
    estimate: u64,
    /// A step's attempt the provider refused as too long: its attempts so far and its
    /// backoff spent, which its next attempt goes on from. `None` before a step.
    within_step: Option<(u32, u64)>,
}

impl RunMachine {
    /// The messages the run's requests carry: the summary in place of the turns it covers.
    pub(super) fn view(&self) -> Vec<Arc<Message>> {
        compaction::view(&self.transcript, self.compacted.as_ref())
    }

    /// Where to cut, and the estimate that made it due, when the run compacts and its next
    /// request's estimate reached the threshold; `None` when it is not due or nothing more
    /// can be summarized.
    pub(super) fn compaction_due(&self) -> Option<(usize, u64)> {
        let policy = self.config.compaction?;
        let limit = self.config.context_limit?;
        let (estimate, _) = self.next_request_estimate();
        if estimate < policy.trigger(limit) {
            return None;
        }
        let keep_bytes =
            usize::try_from(policy.keep(limit).saturating_mul(4)).unwrap_or(usize::MAX);
        let cut = compaction::cut(
            &self.transcript,
            self.compacted.as_ref(),
            keep_bytes,
            limits::message_bytes,
        )?;
        Some((cut, estimate))
    }

    /// Asks the run's model for the summary of the turns before `cut`, before the next step.
    pub(super) fn start_compaction(&mut self, cut: usize, estimate: u64) {
        self.begin_compaction(Compacting {
            cut,
            estimate,
            within_step: None,
        });
    }

    /// The provider refused the step's attempt as too long: a summary, when the run
    /// summarizes and something more can be cut; the step's next attempt carries it. False
    /// when no summary can make room.
    pub(super) fn compact_within_step(&mut self) -> bool {
        let (Some(policy), Some(limit)) = (self.config.compaction, self.config.context_limit)
        else {
            return false;
        };
        if self.compaction_gave_up.is_some() {
            return false;
        }
        let keep_bytes =
            usize::try_from(policy.keep(limit).saturating_mul(4)).unwrap_or(usize::MAX);
        let Some(cut) = compaction::cut(
            &self.transcript,
            self.compacted.as_ref(),
            keep_bytes,
            limits::message_bytes,
        ) else {
            return false;
        };
        let (estimate, _) = self.next_request_estimate();
        self.begin_compaction(Compacting {
            cut,
            estimate,
            within_step: Some((self.attempt, self.backoff_spent_ms)),
        });
        true
    }

    fn begin_compaction(&mut self, c: Compacting) {
        self.compacting = Some(c);
        self.attempt = 0;
        self.backoff_spent_ms = 0;
        self.call_compaction();
    }

    /// The step the summary comes before: the next one, or the one whose attempt it retries.
    fn compaction_step(&self, c: &Compacting) -> u32 {
        if c.within_step.is_some() {
            self.step
        } else {
            self.step + 1
        }
    }

    /// One attempt at the summary: a request of its own, with no tools and no display.
    pub(super) fn call_compaction(&mut self) {
        let Some(c) = self.compacting else {
            unreachable!("a summary is asked for only while compacting")
        };
        let cut = c.cut;
        assert!(
            self.attempt < MODEL_ATTEMPTS_MAX,
            "the attempts are bounded"
        );
        self.attempt += 1;
        self.acc = StepAccumulator::default();
        self.answered = false;
        self.phase = Phase::Streaming;
        self.stream_active_ms = self.now_ms;
        let text = compaction::request_text(&self.transcript, self.compacted.as_ref(), cut);
        let request = Request {
            provider: self.config.provider.clone(),
            model: self.config.model.clone(),
            credential_id: self.config.credential_id.clone(),
            system: Some(compaction::SUMMARY_SYSTEM.to_string()),
            messages: vec![Arc::new(Message {
                role: broca_protocol::Role::User,
                content: vec![Block::Text { text }],
            })],
            tools: Arc::from(Vec::new()),
            generation: broca_protocol::Generation {
                max_output_tokens: self.config.generation.max_output_tokens,
                ..Default::default()
            },
            prompt_cache: false,
            route: self.config.catalog.as_ref().map(|e| ProviderRoute {
                family: e.provider.family.clone(),
                base_url: e.provider.base_url.clone(),
            }),
            shape: None,
            media: Default::default(),
        };
        self.out.push_back(Command::CallModel {
            step: self.compaction_step(&c),
            attempt: self.attempt,
            request,
        });
    }

    /// The summary's stream ended: its text is recorded (durable before the next step), or
    /// the run ends at the context limit when it brought none.
    pub(super) fn on_compaction_ended(&mut self) {
        let Some(c) = self.compacting else {
            unreachable!("only while compacting")
        };
        let step_of = self.compaction_step(&c);
        let step = std::mem::take(&mut self.acc).finish();
        let summary: String = step
            .content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let summary = summary.trim().to_string();
        let record_room = broca_wal::frame::PAYLOAD_BYTES_MAX / 2;
        if summary.is_empty() || summary.len() > record_room {
            let why = if summary.is_empty() {
                "the model's summary of the older turns was empty".to_string()
            } else {
                format!(
                    "the model's summary of the older turns is {} bytes, more than a record \
                     holds",
                    summary.len()
                )
            };
            return self.compaction_failed(why);
        }
        let prices = self.prices().cloned();
        self.spend
            .add(step_of, 0, Some(&step.usage), prices.as_ref());
        let record = broca_wal::runrec::ContextCompacted {
            run_id: self.run_id.clone(),
            step: step_of,
            replaced: c.cut as u64,
            summary: summary.clone(),
            usage: Some(step.usage),
            estimate_before: c.estimate,
            at_unix_ms: self.now_ms,
        };
        self.push(Record::ContextCompacted(Box::new(record)), true);
        self.phase = Phase::AwaitCompaction(Compacted {
            replaced: c.cut,
            summary: Arc::new(compaction::summary_message(&summary)),
        });
    }

    /// The summary is durable: the requests carry it from now on, and the next step's size
    /// is estimated afresh. A step whose attempt was refused as too long tries again.
    pub(super) fn on_compaction_durable(&mut self, c: Compacted) {
        self.compacted = Some(c);
        self.last_step = None;
        match self.compacting.take().and_then(|c| c.within_step) {
            Some((attempt, backoff_spent)) => {
                self.attempt = attempt;
                self.backoff_spent_ms = backoff_spent;
                if self.attempt < MODEL_ATTEMPTS_MAX {
                    return self.call_model();
                }
                let detail = format!("the model call failed {} times; giving up", self.attempt);
                self.seal(FinishKind::Error, Some(detail), None, Vec::new());
            }
            None => self.next_step_or_stop(),
        }
    }

    /// A summary attempt failed: a transient failure is retried as a step's would be; any
    /// other gives the summary up (see `compaction_failed`).
    pub(super) fn on_compaction_attempt_failed(&mut self, error: ClassifiedError) {
        if error.class == ErrorClass::Transient && self.attempt < MODEL_ATTEMPTS_MAX {
            let backoff =
                (BACKOFF_BASE_MS << (self.attempt.max(1) - 1).min(10)).min(BACKOFF_CAP_MS);
            let wait = error.retry_after_ms.unwrap_or(0).max(backoff);
            if self.backoff_spent_ms + wait <= RETRY_WINDOW_MS {
                self.backoff_spent_ms += wait;
                self.phase = Phase::Backoff;
                self.backoff_until_ms = self.now_ms.saturating_add(wait);
                return;
            }
        }
        let why = format!("the summary of the older turns failed: {}", error.message);
        self.compaction_failed(why);
    }

    /// A summary failed: the run stops summarizing and goes on while its requests fit; the
    /// context limit then ends it, naming why no summary made room. A step the provider
    /// refused as too long ends there.
    fn compaction_failed(&mut self, why: String) {
        let within_step = self.compacting.take().and_then(|c| c.within_step);
        self.compaction_gave_up = Some(why.clone());
        if within_step.is_some() {
            let detail = format!("the provider refused the request as too long; {why}");
            return self.seal(FinishKind::ContextLimit, Some(detail), None, Vec::new());
        }
        self.next_step_or_stop();
    }
}
