//! Resuming a run a crash left open: where replay found it ([`ResumeFrom`], [`ResumePoint`]),
//! and the machine that picks it up, or refuses to. A child of `machine`.

use super::*;

impl RunMachine {
    /// A machine that records the resume and seals the run Interrupted because its frozen
    /// renderer or catalog entry is no longer compatible (never re-rendered silently).
    pub fn refuse_resume(from: ResumeFrom, why: String, now_ms: u64) -> RunMachine {
        let ResumeFrom {
            run_id,
            config,
            step,
            spend,
            ..
        } = from;
        let mut m = RunMachine::new(run_id, config, Vec::new(), step, spend, now_ms);
        let record = RunResumed {
            run_id: m.run_id.clone(),
            from_step: step,
            at_unix_ms: now_ms,
        };
        m.push(Record::RunResumed(record), false);
        m.interrupt_cause = Some(broca_wal::runrec::interrupt_cause::RUNNER_CRASH);
        m.seal(FinishKind::Interrupted, Some(why), None, Vec::new());
        m
    }

    /// A machine for a run that has no terminal record, picked up after a crash at `now_ms`.
    /// Records RunResumed, then continues from `from.point`: a durable model step is never
    /// redone, and calls without results are never dispatched again (the run ends
    /// Interrupted naming them).
    pub fn resume(from: ResumeFrom, now_ms: u64) -> RunMachine {
        let ResumeFrom {
            run_id,
            config,
            transcript,
            step,
            spend,
            last_step,
            point,
            cancel_requested,
            input,
            step_seq,
            steers,
            compacted,
        } = from;
        let mut m = RunMachine::new(run_id, config, transcript, step, spend, now_ms);
        m.steers = steers;
        m.compacted = compacted;
        m.last_step = last_step;
        m.input = input;
        m.step_seq = step_seq;
        let record = RunResumed {
            run_id: m.run_id.clone(),
            from_step: step,
            at_unix_ms: now_ms,
        };
        m.push(Record::RunResumed(record), false);
        m.cancel_requested = cancel_requested;
        match point {
            ResumePoint::IntentOpen { missing } => {
                let detail =
                    "a crash left tool calls without results; their outcome is unknown".to_string();
                m.interrupt_cause = Some(broca_wal::runrec::interrupt_cause::RUNNER_CRASH);
                m.seal(FinishKind::Interrupted, Some(detail), None, missing);
            }
            ResumePoint::AfterStep { finish_reason, .. } => m.after_model_step(finish_reason),
            ResumePoint::ToolsDone => m.next_step_or_stop(),
            // The step that was under way has no durable output: a new step (with a new
            // number: step numbers are never reused) takes its place.
            ResumePoint::BeforeStep => m.next_step_or_stop(),
        }
        m
    }
}

/// Where a run a crash left open stands, as replay found it.
#[derive(Debug, Clone)]
pub struct ResumeFrom {
    pub run_id: String,
    pub config: FrozenConfig,
    pub transcript: Vec<Arc<Message>>,
    /// The last step with a durable record.
    pub step: u32,
    /// What the run spent before the crash, from its step records.
    pub spend: Spend,
    /// The last completed model step (what the next request's size is estimated from).
    pub last_step: Option<LastStep>,
    pub point: ResumePoint,
    pub cancel_requested: bool,
    /// The session's consumed input, its steps before the crash included.
    pub input: crate::spend::InputTally,
    /// The seq of the last step's StepStarted record (the id of its message).
    pub step_seq: Option<u64>,
    /// The sends waiting for a step boundary (steers, and ordered sends).
    pub steers: Vec<super::steer::Waiting>,
    /// The summary standing in for the older turns, as the log recorded it.
    pub compacted: Option<crate::compaction::Compacted>,
}
