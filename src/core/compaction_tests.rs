//! The built-in compaction end to end in the domain: a run near its context limit asks its
//! model for a summary, records it before the step that uses it, and carries it in place of
//! the turns it covers; replay rebuilds the same view and a resumed run never asks again;
//! a failed summary lets the context limit end the run, naming why.

use broca_protocol::compaction::Compaction;
use broca_protocol::{Block, ClassifiedError, ErrorClass, FinishReason, Role, StreamEvent};
use broca_wal::runrec::{FinishKind, FrozenConfig, ResultBlock};
use broca_wal::Record;

use crate::compaction::{SUMMARY_INSTRUCTION, SUMMARY_SYSTEM};
use crate::machine::{Event, ResumeFrom, RunMachine};
use crate::machine_tests::config;
use crate::replay::{RunState, Session};
use crate::steer_tests::Live;

/// 1,000 tokens of context: a summary is due at 800 (about 3,200 bytes), and about 1,000
/// bytes of the latest turns are kept.
fn compacting() -> FrozenConfig {
    FrozenConfig {
        context_limit: Some(1000),
        compaction: Some(Compaction::summarize()),
        retention: None,
        title: None,
        plan: None,
        ..config()
    }
}

/// A tool step of call `id` answered with 1,500 bytes.
fn big_tool_step(live: &mut Live, id: &str) {
    live.tool_step(id);
    live.feed(Event::ToolResult(ResultBlock {
        call_id: id.into(),
        content: "r".repeat(1500),
        is_error: false,
        reason: None,
        size: None,
        parts: Vec::new(),
    }));
}

fn summary_answer(live: &mut Live, text: &str) {
    live.feed(Event::Stream(StreamEvent::TextDelta(text.into())));
    live.feed(Event::Stream(StreamEvent::Finish {
        reason: FinishReason::EndTurn,
        request_id: None,
    }));
    live.feed(Event::StepEnded);
}

/// The attempt in flight fails with `class`, saying `message`.
fn attempt_fails(live: &mut Live, class: ErrorClass, message: &str) {
    live.feed(Event::AttemptFailed {
        error: ClassifiedError {
            class,
            message: message.into(),
            retry_after_ms: None,
        },
        usage: None,
    });
}

fn compacted_records(live: &Live) -> Vec<&broca_wal::runrec::ContextCompacted> {
    live.records
        .iter()
        .filter_map(|(_, r)| match r {
            Record::ContextCompacted(c) => Some(&**c),
            _ => None,
        })
        .collect()
}

fn text_of(b: &Block) -> &str {
    match b {
        Block::Text { text } => text,
        other => panic!("not text: {other:?}"),
    }
}

/// Three tool steps of 1,500 bytes each, then the summary asked for before step 4.
fn up_to_the_summary() -> Live {
    let mut live = Live::start(compacting(), "go");
    for id in ["c1", "c2", "c3"] {
        big_tool_step(&mut live, id);
    }
    assert_eq!(
        live.calls.len(),
        4,
        "three steps, then the summary's request"
    );
    live
}

#[test]
fn a_run_near_its_limit_summarizes_older_turns_and_carries_the_summary() {
    let mut live = up_to_the_summary();
    // The summary's request: its own system text, one message quoting the turns it covers
    // (the first two tool steps), not the latest one it keeps.
    assert_eq!(live.systems[3].as_deref(), Some(SUMMARY_SYSTEM));
    let asked = &live.calls[3];
    assert_eq!(asked.len(), 1);
    let text = text_of(&asked[0].content[0]);
    assert!(text.contains("[tool call echo] {}"), "{text}");
    assert!(text.ends_with(SUMMARY_INSTRUCTION));
    assert!(
        compacted_records(&live).is_empty(),
        "nothing recorded before the answer"
    );
    let transcript_len = live.session.transcript.len();

    summary_answer(&mut live, "the user said go; two calls returned r's");
    let recorded = compacted_records(&live);
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].replaced, 5,
        "up to the latest assistant message"
    );
    assert_eq!(recorded[0].step, 4);
    assert!(recorded[0].estimate_before >= 800);
    // The record comes before the step that uses it.
    let kinds: Vec<u16> = live.records.iter().map(|(_, r)| r.kind()).collect();
    let at = kinds
        .iter()
        .position(|k| *k == broca_wal::record::kind::CONTEXT_COMPACTED)
        .unwrap();
    assert_eq!(kinds[at + 1], broca_wal::record::kind::STEP_STARTED);

    // Step 4's request: the summary, then the kept turns (an assistant message first).
    let view = &live.calls[4];
    assert_eq!(view.len(), 3);
    assert_eq!(view[0].role, Role::User);
    assert!(text_of(&view[0].content[0]).ends_with("two calls returned r's"));
    assert_eq!(view[1].role, Role::Assistant);
    assert_eq!(view[1], live.session.transcript[5]);
    // Reads keep every original message: the session's conversation is whole.
    assert_eq!(live.session.transcript.len(), transcript_len);
    assert_eq!(live.session.compacted.as_ref().map(|c| c.replaced), Some(5));

    // Replay rebuilds the same view from the records.
    let replayed = Session::replay(live.records.clone()).unwrap();
    assert_eq!(replayed.compacted, live.session.compacted);
    assert_eq!(
        crate::compaction::view(&replayed.transcript, replayed.compacted.as_ref()),
        *view
    );
}

#[test]
fn a_resumed_run_takes_the_recorded_summary_and_asks_for_none() {
    let mut live = up_to_the_summary();
    summary_answer(&mut live, "the gist");
    let asked_before = live.calls.len();
    // A crash right after the summary's record (and step 4's start): replay, then resume.
    let cut = live
        .records
        .iter()
        .position(|(_, r)| matches!(r, Record::ContextCompacted(_)))
        .unwrap();
    let records: Vec<_> = live.records[..=cut].to_vec();
    let session = Session::replay(records.clone()).unwrap();
    let open = session.open.clone().expect("the run is open");
    let run = &session.runs[open.index];
    let from = ResumeFrom {
        run_id: run.run_id.clone(),
        config: run.config.clone(),
        transcript: session.transcript.clone(),
        step: open.step,
        spend: run.spend,
        last_step: open.last_step,
        point: open.point,
        cancel_requested: open.cancel_requested,
        input: session.input,
        step_seq: open.step_seq,
        steers: Vec::new(),
        compacted: session.compacted.clone(),
    };
    let mut resumed = Live::start(config(), "unused");
    resumed.session = session;
    resumed.records = records;
    resumed.calls.clear();
    resumed.systems.clear();
    resumed.drive(RunMachine::resume(from, 0));
    assert_eq!(resumed.calls.len(), 1, "one request: the next step's");
    assert_ne!(resumed.systems[0].as_deref(), Some(SUMMARY_SYSTEM));
    assert_eq!(resumed.calls[0], live.calls[asked_before - 1]);
    assert!(text_of(&resumed.calls[0][0].content[0]).ends_with("the gist"));
}

#[test]
fn a_later_run_of_the_session_starts_from_the_summary() {
    let mut live = up_to_the_summary();
    summary_answer(&mut live, "the gist");
    live.text_step("done");
    assert_eq!(
        live.session.runs[0].state,
        RunState::Finished(FinishKind::Completed)
    );
    live.next_run("r2", "and now?", compacting());
    let first = live.calls.last().unwrap();
    assert!(text_of(&first[0].content[0]).ends_with("the gist"));
    assert_eq!(
        first.len(),
        5,
        "summary, the kept step, its answer, the new prompt"
    );
}

#[test]
fn a_failed_summary_lets_the_context_limit_end_the_run_naming_why() {
    let mut live = up_to_the_summary();
    attempt_fails(&mut live, ErrorClass::Permanent, "model refused");
    assert!(compacted_records(&live).is_empty());
    let run = &live.session.runs[0];
    assert_eq!(run.state, RunState::Finished(FinishKind::ContextLimit));
    let detail = run.detail.as_deref().unwrap();
    assert!(
        detail.contains("the summary of the older turns failed: model refused"),
        "{detail}"
    );
}

#[test]
fn a_transient_summary_failure_is_retried_after_its_backoff() {
    let mut live = up_to_the_summary();
    attempt_fails(&mut live, ErrorClass::Transient, "overloaded");
    assert_eq!(live.calls.len(), 4, "waiting for the backoff");
    live.machine.as_mut().unwrap().handle_timeout(60_000);
    live.pump();
    assert_eq!(live.calls.len(), 5);
    assert_eq!(live.systems[4].as_deref(), Some(SUMMARY_SYSTEM));
    summary_answer(&mut live, "the gist");
    assert_eq!(compacted_records(&live).len(), 1);
}

#[test]
fn a_summary_that_does_not_fit_the_conversation_is_a_misfit() {
    let mut live = up_to_the_summary();
    summary_answer(&mut live, "the gist");
    let mut records = live.records.clone();
    for (_, r) in &mut records {
        if let Record::ContextCompacted(c) = r {
            c.replaced = 4; // a user message: the kept turns would not start at an answer
        }
    }
    let err = Session::replay(records).unwrap_err();
    assert!(
        err.to_string()
            .contains("do not start at an assistant message"),
        "{err}"
    );
}

#[test]
fn a_step_the_provider_refuses_as_too_long_is_tried_again_after_a_summary() {
    // Two steps: under the threshold by the estimate, but the provider counts more.
    let mut live = Live::start(compacting(), "go");
    for id in ["c1", "c2"] {
        big_tool_step(&mut live, id);
    }
    assert_eq!(live.calls.len(), 3, "no summary was due by the estimate");
    attempt_fails(&mut live, ErrorClass::ContextOverflow, "prompt is too long");
    assert_eq!(live.systems[3].as_deref(), Some(SUMMARY_SYSTEM));
    summary_answer(&mut live, "the gist");
    let recorded = compacted_records(&live);
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        recorded[0].step, 3,
        "the refused step's next attempt carries it"
    );
    assert_eq!(recorded[0].replaced, 3);
    // Step 3 is tried again (no new step started), carrying the summary.
    let kinds: Vec<&str> = live
        .records
        .iter()
        .map(|(_, r)| Record::kind_name(r.kind()).unwrap())
        .collect();
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["model_attempt_finished", "context_compacted"]
    );
    let retried = live.calls.last().unwrap();
    assert!(text_of(&retried[0].content[0]).ends_with("the gist"));
    assert_eq!(retried.len(), 3);
    live.text_step("done");
    assert_eq!(
        live.session.runs[0].state,
        RunState::Finished(FinishKind::Completed)
    );
    let replayed = Session::replay(live.records.clone()).unwrap();
    assert_eq!(replayed.compacted, live.session.compacted);
}

#[test]
fn a_refused_step_with_nothing_left_to_cut_ends_at_the_context_limit() {
    let mut live = Live::start(compacting(), "go");
    attempt_fails(&mut live, ErrorClass::ContextOverflow, "prompt is too long");
    assert_eq!(
        live.calls.len(),
        1,
        "no summary: nothing before the prompt to cut"
    );
    assert_eq!(
        live.session.runs[0].state,
        RunState::Finished(FinishKind::ContextLimit)
    );
}
