//! llm-runner/v1 `step_events`: the content-free `step.finished.v1` hint for each recorded
//! model attempt, built from the record and the session it is appended to (sans-IO; the host
//! publishes it once the record is durable).
//!
//! broca declares (broca_wire::role) `per_attempt` granularity and the `step_ref` history key: every record of a
//! model attempt is one event, a completed step (`ModelStepFinished`, `completed`) or a failed
//! attempt (`ModelAttemptFinished`, `failed`, also when the step was tried again). The event's
//! position is the record's own (the WAL's lineage as the log incarnation, the record's seq),
//! and its `attempt_id` is that position written `<lineage>-<seq>`: a WAL's lineage is new
//! whenever the log is made, so no two attempts share one, and a restored log keeps its own.

use std::num::NonZeroU64;

use broca_wal::record::Record;
use cortexkit_role_llm_runner::session_ref::{session_ref, SessionIdentity};
use cortexkit_role_llm_runner::step_events::{StepFinished, StepRef};

use broca_core::replay::Session;

/// The subject after `ck.{acct}.` that `runner` publishes its step hints on.
pub fn subject_tail(runner: &str) -> String {
    format!("live.{runner}.step.finished.v1")
}

/// Where a session's records are: the publishing module, the session's harness and session,
/// and its WAL's lineage (hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place<'a> {
    pub runner: &'a str,
    pub harness: &'a str,
    pub session: &'a str,
    pub lineage: &'a str,
}

/// The attempt id of the record `seq` of the WAL of lineage `lineage`.
pub fn attempt_id(lineage: &str, seq: u64) -> String {
    format!("{lineage}-{seq}")
}

/// The hint for `record`, appended as `seq` to `session` (the session before the record is
/// applied), or `None` when the record is not a model attempt's or names no open run.
pub fn step_finished(
    session: &Session,
    place: &Place<'_>,
    seq: u64,
    record: &Record,
) -> Option<StepFinished> {
    let (run_id, step, attempt, status, usage, finished_at) = match record {
        Record::ModelStepFinished(r) => (
            &r.run_id,
            r.step,
            r.attempt,
            "completed",
            Some(&r.usage),
            r.at_unix_ms,
        ),
        Record::ModelAttemptFinished(r) => (
            &r.run_id,
            r.step,
            r.attempt,
            "failed",
            r.usage.as_ref(),
            r.at_unix_ms,
        ),
        _ => return None,
    };
    let open = session.open.as_ref()?;
    let run = session.runs.get(open.index)?;
    if &run.run_id != run_id {
        return None;
    }
    let finished_at = finished_at.unwrap_or(0);
    let started_at = open.step_started_at.unwrap_or(finished_at).min(finished_at);
    let position = StepRef::new(
        place.runner,
        session_ref(&SessionIdentity {
            runner: place.runner,
            harness: place.harness,
            session: place.session,
        }),
        place.lineage,
        seq,
    );
    // Attempts count from 1, in the records as on the wire.
    let attempt = NonZeroU64::new(u64::from(attempt).max(1))?;
    let mut event = StepFinished::new(
        position,
        run_id.clone(),
        step.to_string(),
        attempt,
        status,
        place.harness,
        place.session,
        run.config.provider.clone(),
        run.config.model.clone(),
        started_at,
        finished_at,
    )
    .with_attempt_id(attempt_id(place.lineage, seq));
    if let Some(usage) = usage {
        event = event.with_usage(broca_core::spend::step_usage(usage));
    }
    if let Some(limit) = run.config.context_limit {
        event = event.with_context_limit(limit);
    }
    if let Record::ModelStepFinished(r) = record {
        if let Some(id) = &r.request_id {
            event = event.with_provider_request_id(id.clone());
        }
        if let Ok(serde_json::Value::String(reason)) = serde_json::to_value(&r.finish_reason) {
            event = event.with_finish_reason(reason);
        }
    }
    event.check().ok()?;
    Some(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use broca_core::support_tests::{started, step};
    use broca_protocol::{Block, ClassifiedError, ErrorClass, FinishReason, Usage};
    use broca_wal::runrec::{ModelAttemptFinished, ModelStepFinished};

    const PLACE: Place<'static> = Place {
        runner: "ck-broca",
        harness: "h",
        session: "s",
        lineage: "00112233aabbccdd",
    };

    fn session_in_step() -> Session {
        let mut s = Session::default();
        s.apply(1, started()).unwrap();
        let Record::StepStarted(mut r) = step(1) else {
            unreachable!()
        };
        r.at_unix_ms = Some(1_000);
        s.apply(2, Record::StepStarted(r)).unwrap();
        s
    }

    fn finished(usage: Usage) -> Record {
        Record::ModelStepFinished(Box::new(ModelStepFinished {
            run_id: "r".into(),
            step: 1,
            attempt: 2,
            content: vec![Block::Text { text: "hi".into() }],
            usage,
            finish_reason: FinishReason::EndTurn,
            request_id: Some("req_1".into()),
            quota: None,
            at_unix_ms: Some(1_500),
            step_seq: Some(2),
        }))
    }

    #[test]
    fn a_completed_step_is_one_hint_at_its_records_position() {
        let s = session_in_step();
        let usage = Usage {
            input: Some(100),
            cache_read: Some(40),
            output: Some(7),
            ..Default::default()
        };
        let e = step_finished(&s, &PLACE, 3, &finished(usage)).expect("a hint");
        assert_eq!(e.seq, 3);
        assert_eq!(e.log_incarnation, PLACE.lineage);
        assert_eq!(e.attempt_id.as_deref(), Some("00112233aabbccdd-3"));
        assert_eq!(
            e.session_ref,
            session_ref(&SessionIdentity {
                runner: "ck-broca",
                harness: "h",
                session: "s"
            })
        );
        assert_eq!((e.run_id.as_str(), e.step_id.as_str()), ("r", "1"));
        assert_eq!(e.attempt.get(), 2);
        assert_eq!(e.terminal_status, "completed");
        assert_eq!((e.provider.as_str(), e.model.as_str()), ("anthropic", "m"));
        assert_eq!((e.started_at_ms, e.finished_at_ms), (1_000, 1_500));
        // The role's disjoint input counters; a measure the provider did not report stays
        // absent, never 0.
        assert_eq!(e.input_tokens, Some(60));
        assert_eq!(e.cached_input_tokens, Some(40));
        assert_eq!(e.cache_write_tokens, None);
        assert_eq!(e.reasoning_tokens, None);
        assert_eq!(e.finish_reason.as_deref(), Some("end_turn"));
        assert_eq!(e.provider_request_id.as_deref(), Some("req_1"));
        // The closed wire shape reads back through the role's own decoder.
        let body = serde_json::to_vec(&e).unwrap();
        let subject = format!("ck.acct.{}", subject_tail("ck-broca"));
        let back =
            cortexkit_role_llm_runner::step_events::decode_step_finished(&subject, &body).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_failed_attempt_is_a_failed_hint_and_other_records_are_none() {
        let s = session_in_step();
        let failed = Record::ModelAttemptFinished(ModelAttemptFinished {
            run_id: "r".into(),
            step: 1,
            attempt: 1,
            error: ClassifiedError {
                class: ErrorClass::Transient,
                message: "busy".into(),
                retry_after_ms: None,
            },
            usage: None,
            answered: false,
            at_unix_ms: Some(1_200),
        });
        let e = step_finished(&s, &PLACE, 3, &failed).expect("a hint");
        assert_eq!(e.terminal_status, "failed");
        assert_eq!(e.input_tokens, None);
        assert_eq!(e.finish_reason, None);
        assert!(step_finished(&s, &PLACE, 2, &step(1)).is_none());
        // A record of a run that is not the open one names nothing.
        let Record::ModelStepFinished(mut other) = finished(Usage::default()) else {
            unreachable!()
        };
        other.run_id = "r2".into();
        assert!(step_finished(&s, &PLACE, 3, &Record::ModelStepFinished(other)).is_none());
    }
}
