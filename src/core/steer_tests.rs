//! Steered and interrupting sends, end to end in the domain: admission, the machine that
//! renders a steer at its next step boundary, and replay, which must rebuild the same
//! conversation from the records the machine asked for.

use broca_protocol::{Block, FinishReason, Message, Role, StreamEvent};
use broca_wal::runrec::{FinishKind, ResultBlock};
use broca_wal::Record;

use crate::admission::{admit_prepared, start_queued, Admitted, Prepared};
use crate::machine::Event;
use crate::machine_tests::config;
use crate::replay::SteerDelivered;

pub(crate) use crate::support_tests::Live;

/// A tool's plain answer to call `id`.
fn ok(id: &str) -> ResultBlock {
    ResultBlock {
        call_id: id.into(),
        content: "ok".into(),
        is_error: false,
        reason: None,
        size: None,
        parts: Vec::new(),
    }
}

use crate::support_tests::prepared;

fn texts(m: &Message) -> Vec<&str> {
    m.content
        .iter()
        .filter_map(|b| match b {
            Block::Text { text } => Some(text.as_str()),
            Block::ToolResult { .. } => Some("<result>"),
            _ => None,
        })
        .collect()
}

#[test]
fn a_steer_during_a_tool_call_joins_after_its_result_and_replay_agrees() {
    let mut live = Live::new();
    live.tool_step("c1");
    let seq = live.steer("st-1", "also check the tests");
    // Nothing renders it while the call is out: the next request is not made yet.
    assert_eq!(live.calls.len(), 1);
    assert_eq!(live.session.pending_steers.len(), 1);
    live.feed(Event::ToolResult(ok("c1")));
    // The second request ends with the result, then the steer, in one user message.
    let second = live.calls.last().unwrap();
    assert_eq!(live.calls.len(), 2);
    let last = second.last().unwrap();
    assert_eq!(last.role, Role::User);
    assert_eq!(texts(last), ["<result>", "also check the tests"]);
    live.text_step("done");
    assert!(live.machine.as_ref().unwrap().is_done());
    // Replay holds what the machine sent, and the steer is delivered at a step.
    let m = live.machine.as_ref().unwrap();
    assert_eq!(live.session.transcript, m.transcript());
    assert!(live.session.pending_steers.is_empty());
    assert_eq!(
        live.session.steer_sends[&own("st-1")].delivered,
        Some(SteerDelivered::Step { run: 0 })
    );
    assert!(live.session.undelivered_steers(0).is_empty());
    // Its own user entry, named by its record's seq, after the result's entry.
    let entries = &live.session.entries.as_ref().unwrap().list;
    let at = entries
        .iter()
        .position(|e| e.mid == seq.to_string())
        .unwrap();
    assert_eq!(entries[at].role, "user");
    assert_eq!(entries[at - 1].role, "tool");
    assert_eq!(entries[at + 1].role, "assistant");
    // A re-send names the steer (its answer, broca-read's `views::steer_answer`).
    let again = admit_prepared(
        prepared("st-1", "also check the tests", "steer"),
        &live.session,
        "y".into(),
        0,
    );
    assert_eq!(again, Ok(Admitted::SteerExisting { seq }));
}

#[test]
fn a_steer_while_the_final_answer_streams_gets_another_step() {
    let mut live = Live::new();
    live.feed(Event::Stream(StreamEvent::TextDelta("all done".into())));
    live.steer("st-2", "wait, one more thing");
    live.feed(Event::Stream(StreamEvent::Finish {
        reason: FinishReason::EndTurn,
        request_id: None,
    }));
    live.feed(Event::StepEnded);
    // Not completed: a second request carries the steer after the first answer.
    assert!(!live.machine.as_ref().unwrap().is_done());
    assert_eq!(live.calls.len(), 2);
    let last = live.calls[1].last().unwrap();
    assert_eq!(texts(last), ["wait, one more thing"]);
    live.text_step("and that too");
    assert!(live.machine.as_ref().unwrap().is_done());
    assert_eq!(
        live.session.runs[0].state,
        crate::RunState::Finished(FinishKind::Completed)
    );
    assert_eq!(
        live.session.transcript,
        live.machine.as_ref().unwrap().transcript()
    );
}

#[test]
fn a_steer_its_run_never_renders_starts_the_next_turn_once() {
    let mut live = Live::new();
    live.tool_step("c1");
    let seq = live.steer("st-3", "then summarize");
    // The run is cancelled at once: the steer waits on.
    live.feed(Event::Cancel);
    live.feed(Event::ToolResult(ok("c1")));
    assert_eq!(
        live.session.runs[0].state,
        crate::RunState::Finished(FinishKind::Cancelled)
    );
    assert_eq!(live.session.undelivered_steers(0), ["st-3"]);
    // The next turn is the steer, under the run's settings.
    let next = start_queued(&live.session, "r2".into(), 1).expect("the steer starts a turn");
    assert_eq!(
        (next.prompt.as_str(), next.steer_seq),
        ("then summarize", Some(seq))
    );
    assert_eq!(next.config, live.session.runs[0].config);
    live.apply(Record::RunStarted(Box::new(next)));
    assert!(live.session.pending_steers.is_empty());
    assert_eq!(
        live.session.steer_sends[&own("st-3")].delivered,
        Some(SteerDelivered::Turn { run: 1 })
    );
    // It is in the conversation once.
    let count = live
        .session
        .transcript
        .iter()
        .flat_map(|m| texts(m))
        .filter(|t| *t == "then summarize")
        .count();
    assert_eq!(count, 1);
    // Nothing is left to start.
    assert_eq!(start_queued(&live.session, "r3".into(), 2), None);
}

#[test]
fn a_steer_naming_other_settings_than_its_run_is_refused_by_the_first_that_differs() {
    let live = Live::new();
    let mut p = prepared("st-4", "x", "steer");
    p.config.model = "other".into();
    p.config.route_decision_id = Some("decision-b".into());
    p.named = vec!["model", "route_decision_id"];
    let refused = admit_prepared(p.clone(), &live.session, "x".into(), 0).unwrap_err();
    assert_eq!(refused.field(), Some("model"));
    p.config.model = config().model;
    let refused = admit_prepared(p.clone(), &live.session, "x".into(), 0).unwrap_err();
    assert_eq!(refused.field(), Some("route_decision_id"));
    // Left out, the run's own value is taken.
    p.named = vec!["model"];
    assert!(matches!(
        admit_prepared(p, &live.session, "x".into(), 0),
        Ok(Admitted::Steered(_))
    ));
}

#[test]
fn a_send_id_reused_in_another_delivery_mode_is_refused_naming_delivery() {
    let live = Live::new();
    // The run's own send, re-sent as a steer.
    let mut p = prepared("send-r", "go", "steer");
    p.inputs_digest = "digest-other".into();
    let refused = admit_prepared(p, &live.session, "x".into(), 0).unwrap_err();
    assert_eq!(refused.field(), Some("delivery"));
}

#[test]
fn an_interrupt_queued_before_its_cancel_was_recorded_still_stops_the_run() {
    let mut live = Live::new();
    let p = prepared("int-1", "stop, do this instead", "interrupt");
    let Ok(Admitted::Queued(q)) = admit_prepared(p, &live.session, "x".into(), 0) else {
        panic!("an interrupt behind a running run waits as a queued send")
    };
    assert_eq!(q.delivery.as_deref(), Some("interrupt"));
    live.apply(Record::SendQueued(q));
    // As a crash would leave it: no CancelRequested, yet the open run is to stop.
    assert!(live.session.open.as_ref().unwrap().cancel_requested);
    // And it starts before an earlier queued send.
    let mut session = live.session.clone();
    session.open = None;
    session.runs[0].state = crate::RunState::Finished(FinishKind::Cancelled);
    let queued_first = prepared("q-1", "later", "queue");
    let mut q1 = match admit_prepared(
        Prepared {
            delivery: None,
            ..queued_first
        },
        &live.session,
        "z".into(),
        0,
    ) {
        Ok(Admitted::Queued(q)) => q,
        other => panic!("{other:?}"),
    };
    q1.submission_id = "sub_first".into();
    session.queued.insert(0, *q1);
    let next = start_queued(&session, "r2".into(), 1).unwrap();
    assert_eq!(next.send_id.as_deref(), Some("int-1"));
}

/// The owner's key of `send_id`.
fn own(send_id: &str) -> crate::replay::SendKey {
    crate::replay::SendKey {
        sender: None,
        send_id: send_id.into(),
    }
}
