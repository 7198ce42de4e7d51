//! The state machine alone: cancel, shutdown, pause and ordering, fed by hand.

use super::machine::{Command, Event, RunMachine};
use broca_protocol::{
    ClassifiedError, ErrorClass, FinishReason, Message, StreamEvent, ToolSpec, Usage,
};
use broca_wal::runrec::{CachePolicy, FinishKind, FrozenConfig, ResultBlock, StopConditions};
use broca_wal::Record;

fn config() -> FrozenConfig {
    FrozenConfig {
        provider: "scripted".into(),
        model: "m".into(),
        credential_id: "env:X".into(),
        renderer_version: 1,
        catalog_digest: "d".into(),
        catalog: None,
        system: None,
        tools: vec![ToolSpec {
            name: "echo".into(),
            description: String::new(),
            input_schema: serde_json::json!({}),
            route: String::new(),
        }]
        .into(),
        tools_digest: "t".into(),
        generation: Default::default(),
        stop: StopConditions {
            max_steps: 5,
            max_total_tokens: None,
            max_cost_micros: None,
        },
        context_limit: None,
        cache_policy: CachePolicy::Auto,
    }
}

/// Feeds events at time 0 (these tests are about order, not time).
trait Feed {
    fn feed(&mut self, event: Event);
}

impl Feed for RunMachine {
    fn feed(&mut self, event: Event) {
        self.handle(event, 0);
    }
}

fn drain(m: &mut RunMachine) -> Vec<Command> {
    std::iter::from_fn(|| m.poll_command()).collect()
}

fn kinds(cmds: &[Command]) -> Vec<String> {
    cmds.iter()
        .map(|c| match c {
            Command::Append { record, wait } => {
                format!(
                    "{}{}",
                    Record::kind_name(record.kind()).unwrap(),
                    if *wait { "!" } else { "" }
                )
            }
            Command::CallModel { .. } => "call".into(),
            Command::AbortModel => "abort".into(),
            Command::Dispatch { .. } => "dispatch".into(),
            Command::Display(_) => "display".into(),
            Command::Finish(o) => format!("finish:{}", o.reason.map_or("paused", |r| r.as_str())),
        })
        .collect()
}

fn tool_step(m: &mut RunMachine, id: &str) {
    m.feed(Event::Stream(StreamEvent::ToolCallStart {
        index: 0,
        id: id.into(),
        name: "echo".into(),
    }));
    m.feed(Event::Stream(StreamEvent::ToolCallArgsDelta {
        index: 0,
        json: "{}".into(),
    }));
    m.feed(Event::Stream(StreamEvent::Usage(Usage {
        input: Some(1),
        output: Some(1),
        ..Usage::default()
    })));
    m.feed(Event::Stream(StreamEvent::Finish {
        reason: FinishReason::ToolUse,
        request_id: None,
    }));
    m.feed(Event::StepEnded);
}

#[test]
fn dispatch_waits_for_the_durable_intent() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    assert_eq!(kinds(&drain(&mut m)), ["step_started", "call"]);
    tool_step(&mut m, "c1");
    assert_eq!(
        kinds(&drain(&mut m)),
        ["model_step_finished", "tool_dispatch_intent!"]
    );
    m.feed(Event::ToolResult(ResultBlock {
        call_id: "c1".into(),
        content: "x".into(),
        is_error: false,
        reason: None,
    }));
    assert!(
        drain(&mut m).is_empty(),
        "no result is taken before the intent is durable"
    );
    m.feed(Event::Durable);
    assert_eq!(kinds(&drain(&mut m)), ["dispatch"]);
}

#[test]
fn cancel_while_streaming_aborts_and_finishes_cancelled() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    m.feed(Event::Stream(StreamEvent::TextDelta("par".into())));
    m.feed(Event::Cancel);
    assert_eq!(
        kinds(&drain(&mut m)),
        ["display", "cancel_requested", "abort", "run_finished!"]
    );
    m.feed(Event::StepEnded); // a late end of the abandoned stream changes nothing
    assert!(drain(&mut m).is_empty());
    m.feed(Event::Durable);
    assert_eq!(kinds(&drain(&mut m)), ["finish:cancelled"]);
}

#[test]
fn cancel_while_tools_run_records_their_results_then_finishes_cancelled() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    tool_step(&mut m, "c1");
    m.feed(Event::Durable);
    drain(&mut m);
    m.feed(Event::Cancel);
    assert_eq!(kinds(&drain(&mut m)), ["cancel_requested"]);
    m.feed(Event::ToolResult(ResultBlock {
        call_id: "c1".into(),
        content: "x".into(),
        is_error: false,
        reason: None,
    }));
    assert_eq!(kinds(&drain(&mut m)), ["tool_result", "run_finished!"]);
}

#[test]
fn shutdown_with_tools_in_flight_is_interrupted_naming_them_never_cancelled() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    tool_step(&mut m, "c1");
    m.feed(Event::Durable);
    drain(&mut m);
    m.feed(Event::Shutdown);
    let cmds = drain(&mut m);
    let Some(Command::Append {
        record: Record::RunFinished(f),
        wait: true,
    }) = cmds.last()
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(f.reason, FinishKind::Interrupted);
    assert_eq!(f.indeterminate_tool_calls, vec!["c1".to_string()]);
}

#[test]
fn shutdown_while_streaming_aborts_and_is_interrupted_without_the_partial_step() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    assert_eq!(kinds(&drain(&mut m)), ["step_started", "call"]);
    m.feed(Event::Stream(StreamEvent::TextDelta("half an ans".into())));
    m.feed(Event::Shutdown);
    let cmds = drain(&mut m);
    // The partial output is displayed, never recorded as a step; the stream is abandoned.
    assert_eq!(kinds(&cmds), ["display", "abort", "run_finished!"]);
    let Some(Command::Append {
        record: Record::RunFinished(f),
        ..
    }) = cmds.last()
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(
        f.reason,
        FinishKind::Interrupted,
        "interrupted, never cancelled"
    );
    assert!(f.indeterminate_tool_calls.is_empty());
    // A late end of the abandoned stream changes nothing; the seal is awaited.
    m.feed(Event::Stream(StreamEvent::TextDelta("swer".into())));
    m.feed(Event::StepEnded);
    assert!(drain(&mut m).is_empty());
    m.feed(Event::Durable);
    assert_eq!(kinds(&drain(&mut m)), ["finish:interrupted"]);
}

#[test]
fn shutdown_before_dispatch_says_the_calls_never_ran() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    tool_step(&mut m, "c1");
    drain(&mut m); // the intent is appended, not yet durable
    m.feed(Event::Shutdown);
    let cmds = drain(&mut m);
    assert_eq!(kinds(&cmds), ["tool_result", "run_finished!"]);
    let Command::Append {
        record: Record::ToolResult(r),
        ..
    } = &cmds[0]
    else {
        panic!()
    };
    assert_eq!(r.result.reason.as_deref(), Some("not_dispatched"));
}

#[test]
fn auth_required_pauses_the_run() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    let error = ClassifiedError {
        class: ErrorClass::AuthRequired,
        message: "401".into(),
        retry_after_ms: None,
    };
    m.feed(Event::AttemptFailed { error, usage: None });
    assert_eq!(
        kinds(&drain(&mut m)),
        ["model_attempt_finished", "run_paused!"]
    );
    m.feed(Event::Durable);
    assert_eq!(kinds(&drain(&mut m)), ["finish:paused"]);
}

#[test]
fn context_overflow_from_the_provider_ends_at_the_context_limit() {
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    let error = ClassifiedError {
        class: ErrorClass::ContextOverflow,
        message: "too long".into(),
        retry_after_ms: None,
    };
    m.feed(Event::AttemptFailed { error, usage: None });
    let cmds = drain(&mut m);
    let Some(Command::Append {
        record: Record::RunFinished(f),
        ..
    }) = cmds.last()
    else {
        panic!()
    };
    assert_eq!(f.reason, FinishKind::ContextLimit);
    assert_eq!(f.error.as_ref().unwrap().class, ErrorClass::ContextOverflow);
}

#[test]
fn a_run_refused_at_resume_is_sealed_interrupted_with_the_reason() {
    let mut m = RunMachine::refuse_resume(
        super::machine::ResumeFrom {
            run_id: "r".into(),
            config: config(),
            transcript: Vec::new(),
            step: 2,
            usage: Usage::default(),
            point: super::machine::ResumePoint::BeforeStep,
            cancel_requested: false,
        },
        "renderer drift".into(),
        0,
    );
    let cmds = drain(&mut m);
    assert_eq!(kinds(&cmds), ["run_resumed", "run_finished!"]);
    let Command::Append {
        record: Record::RunFinished(f),
        ..
    } = &cmds[1]
    else {
        panic!()
    };
    assert_eq!(f.detail.as_deref(), Some("renderer drift"));
}

#[test]
fn a_stalled_stream_is_detected_from_the_time_handed_in() {
    use super::machine::{TimeoutKind, STREAM_STALL_MS};
    let t0 = 1_000_000;
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        t0,
    );
    assert_eq!(kinds(&drain(&mut m)), ["step_started", "call"]);
    // An event resets the silence: the deadline moves with it.
    m.handle(
        Event::Stream(StreamEvent::TextDelta("th".into())),
        t0 + 5_000,
    );
    drain(&mut m);
    let timeout = m.poll_timeout().unwrap();
    assert_eq!(timeout.kind, TimeoutKind::StreamStall);
    assert_eq!(timeout.at_ms, t0 + 5_000 + STREAM_STALL_MS);
    // Told a time before the deadline: nothing. However long the wall clock says it has
    // been, only the time handed in counts.
    m.handle_timeout(timeout.at_ms - 1);
    assert!(drain(&mut m).is_empty());
    // At the deadline: the stream is abandoned as a failed, transient attempt.
    m.handle_timeout(timeout.at_ms);
    let cmds = drain(&mut m);
    assert_eq!(kinds(&cmds), ["abort", "model_attempt_finished"]);
    let Command::Append {
        record: Record::ModelAttemptFinished(a),
        ..
    } = &cmds[1]
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(a.error.class, ErrorClass::Transient);
    assert_eq!(
        a.at_unix_ms,
        Some(timeout.at_ms),
        "records carry the time handed in"
    );
    // Then the backoff, also on the caller's clock; a late event of the stalled stream is
    // ignored.
    m.handle(
        Event::Stream(StreamEvent::TextDelta("late".into())),
        timeout.at_ms + 1,
    );
    assert!(drain(&mut m).is_empty());
    let backoff = m.poll_timeout().unwrap();
    assert_eq!(backoff.kind, TimeoutKind::Backoff);
    assert!(backoff.at_ms > timeout.at_ms);
    m.handle_timeout(backoff.at_ms);
    assert_eq!(kinds(&drain(&mut m)), ["call"], "the second attempt");
    assert_eq!(m.poll_timeout().unwrap().kind, TimeoutKind::StreamStall);
}
