//! How a run stops (a child of `machine`): a cancel at once or at the step boundary, a
//! shutdown, a pause for the caller, and the terminal record that seals the run, with each
//! call of unknown outcome closed in the same commit.

use super::*;

impl RunMachine {
    pub(super) fn on_cancel(&mut self) {
        if matches!(self.phase, Phase::Sealing(_) | Phase::Done) || self.cancel_requested {
            return;
        }
        self.cancel_requested = true;
        let record = CancelRequested {
            run_id: self.run_id.clone(),
            at_unix_ms: self.now_ms,
            at: None,
        };
        self.push(Record::CancelRequested(record), false);
        match &self.phase {
            Phase::Streaming | Phase::Backoff => {
                if matches!(self.phase, Phase::Streaming) {
                    self.out.push_back(Command::AbortModel);
                }
                self.seal(FinishKind::Cancelled, None, None, Vec::new());
            }
            // Tools in flight finish and are recorded; the run stops at the next boundary.
            _ => {}
        }
    }

    /// A cancel at the step boundary: recorded, then honoured where the next step would
    /// start (a second one changes nothing; a later cancel at once escalates it).
    pub(super) fn on_cancel_at_boundary(&mut self) {
        if matches!(self.phase, Phase::Sealing(_) | Phase::Done)
            || self.cancel_requested
            || self.cancel_at_boundary
        {
            return;
        }
        self.cancel_at_boundary = true;
        let record = CancelRequested {
            run_id: self.run_id.clone(),
            at_unix_ms: self.now_ms,
            at: Some("step_boundary".into()),
        };
        self.push(Record::CancelRequested(record), false);
        // Waiting for a retry's backoff is a boundary already: no step is under way.
        if matches!(self.phase, Phase::Backoff) {
            self.seal(FinishKind::Cancelled, None, None, Vec::new());
        }
    }

    pub(super) fn on_shutdown(&mut self) {
        let detail = Some("broca shut down".to_string());
        self.interrupt_cause = Some(interrupt_cause::RUNNER_SHUTDOWN);
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Streaming | Phase::Backoff => {
                self.out.push_back(Command::AbortModel);
                self.seal(FinishKind::Interrupted, detail, None, Vec::new());
            }
            Phase::AwaitIntent { calls, .. } => {
                // The intent may be durable, but nothing was dispatched: say so.
                self.resolve_undispatched(&calls, FinishKind::Interrupted);
                self.seal(FinishKind::Interrupted, detail, None, Vec::new());
            }
            Phase::Tools {
                waiting,
                mut indeterminate,
                ..
            } => {
                indeterminate.extend(waiting);
                self.seal(FinishKind::Interrupted, detail, None, indeterminate);
            }
            other => self.phase = other,
        }
    }

    pub(super) fn pause(&mut self, reason: &str, error: ClassifiedError) {
        let record = RunPaused {
            run_id: self.run_id.clone(),
            reason: reason.to_string(),
            error: Some(error.clone()),
            usage: self.spend.usage(),
            spend: self.spend_summary(),
            at_unix_ms: Some(self.now_ms),
        };
        self.push(Record::RunPaused(record), true);
        self.phase =
            Phase::Sealing(self.outcome(None, Some(reason.to_string()), Some(error), Vec::new()));
    }

    pub(super) fn spend_summary(&self) -> SpendSummary {
        SpendSummary {
            unmeasured_steps: self.spend.unmeasured_steps(),
            cost_micros: self.spend.cost_micros().filter(|_| self.prices().is_some()),
        }
    }

    pub(super) fn outcome(
        &self,
        reason: Option<FinishKind>,
        detail: Option<String>,
        error: Option<ClassifiedError>,
        indeterminate_tool_calls: Vec<String>,
    ) -> Outcome {
        let spend = self.spend_summary();
        Outcome {
            reason,
            detail,
            error,
            indeterminate_tool_calls,
            usage: self.spend.usage(),
            unmeasured_steps: spend.unmeasured_steps,
            cost_micros: spend.cost_micros,
        }
    }

    pub(super) fn seal(
        &mut self,
        reason: FinishKind,
        detail: Option<String>,
        error: Option<ClassifiedError>,
        indeterminate: Vec<String>,
    ) {
        assert!(
            reason == FinishKind::Interrupted || indeterminate.is_empty(),
            "only an interrupted run names calls of unknown outcome"
        );
        // Each call of unknown outcome is closed in the commit that ends the run, before any
        // later model call: outcome unknown, never a fake success, and never sent again.
        let batch_id = format!("{}.{}", self.run_id, self.step);
        for call_id in &indeterminate {
            self.push_result(
                batch_id.clone(),
                ResultBlock {
                    call_id: call_id.clone(),
                    content: broca_wal::runrec::OUTCOME_UNKNOWN_TEXT.into(),
                    is_error: true,
                    reason: Some(result_reason::OUTCOME_UNKNOWN.into()),
                    size: None,
                    parts: Vec::new(),
                },
            );
        }
        let record = RunFinished {
            run_id: self.run_id.clone(),
            reason,
            detail: detail.clone(),
            error: error.clone(),
            indeterminate_tool_calls: indeterminate.clone(),
            usage: self.spend.usage(),
            spend: self.spend_summary(),
            at_unix_ms: Some(self.now_ms),
            cause: (reason == FinishKind::Interrupted)
                .then(|| self.interrupt_cause.map(str::to_string))
                .flatten(),
            budget: self.stop_budget.take(),
            structured_output: self.structured_output(reason),
        };
        self.push(Record::RunFinished(record), true);
        self.phase = Phase::Sealing(self.outcome(Some(reason), detail, error, indeterminate));
    }

    /// Seals the run at a stop condition, with its budget's figures when a budget stopped it.
    pub(super) fn seal_stop(&mut self, stop: limits::Stop) {
        self.stop_budget = stop.budget;
        self.seal(stop.kind, Some(stop.detail), None, Vec::new());
    }
}
