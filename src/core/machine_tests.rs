//! The state machine alone: cancel, shutdown, pause and ordering, fed by hand.

use super::machine::{Command, Event, RunMachine};
use broca_protocol::{ClassifiedError, ErrorClass, FinishReason, Message, StreamEvent, Usage};
use broca_wal::runrec::{FinishKind, FrozenConfig, ResultBlock, StopConditions};
use broca_wal::Record;

pub(crate) use crate::support_tests::{config, drain, Feed};

/// The commands' kinds, display deltas left out (they are lossy and never ordered against
/// records; [`display_deltas_name_their_message_and_part`] checks them).
pub(crate) fn kinds(cmds: &[Command]) -> Vec<String> {
    cmds.iter()
        .filter(|c| !matches!(c, Command::Display(_)))
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
        size: None,
        parts: Vec::new(),
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
        ["cancel_requested", "abort", "run_finished!"]
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
        size: None,
        parts: Vec::new(),
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
    assert_eq!(kinds(&cmds), ["abort", "run_finished!"]);
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
            input: Default::default(),
            step_seq: None,
            steers: Vec::new(),
            compacted: None,
            run_id: "r".into(),
            config: config(),
            transcript: Vec::new(),
            step: 2,
            spend: Default::default(),
            last_step: None,
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

/// A config whose frozen catalog entry prices input at 3 and output at 15 (USD per million
/// tokens), cache reads at 0.3 and writes at 3.75.
fn priced(stop: StopConditions, context_limit: Option<u64>) -> FrozenConfig {
    use broca_wal::runrec::{CatalogEntry, CatalogPrices, CatalogProvider};
    FrozenConfig {
        catalog: Some(CatalogEntry {
            provider: CatalogProvider {
                id: "scripted".into(),
                family: "scripted".into(),
                base_url: "http://127.0.0.1".into(),
                credential_env: "X".into(),
            },
            model: "m".into(),
            context_window: None,
            max_output: None,
            prices: Some(CatalogPrices {
                currency: "USD".into(),
                unit: "per_million_tokens".into(),
                input: Some(3.0),
                output: Some(15.0),
                cache_read: Some(0.3),
                cache_write: Some(3.75),
                tiers: Vec::new(),
            }),
            capability: None,
        }),
        stop,
        context_limit,
        ..config()
    }
}

/// One model step asking for the tool `id`, reporting `usage`.
pub(crate) fn step_reporting(m: &mut RunMachine, id: &str, usage: Option<Usage>) {
    m.feed(Event::Stream(StreamEvent::ToolCallStart {
        index: 0,
        id: id.into(),
        name: "echo".into(),
    }));
    m.feed(Event::Stream(StreamEvent::ToolCallArgsDelta {
        index: 0,
        json: "{}".into(),
    }));
    if let Some(u) = usage {
        m.feed(Event::Stream(StreamEvent::Usage(u)));
    }
    m.feed(Event::Stream(StreamEvent::Finish {
        reason: FinishReason::ToolUse,
        request_id: None,
    }));
    m.feed(Event::StepEnded);
}

pub(crate) fn counts(input: u64, output: u64) -> Option<Usage> {
    Some(Usage {
        input: Some(input),
        output: Some(output),
        ..Usage::default()
    })
}

/// Runs the tools of the step just ended (its intent durable, its one call answered).
pub(crate) fn answer(m: &mut RunMachine, id: &str, content: &str) -> Vec<Command> {
    m.feed(Event::Durable);
    drain(m);
    m.feed(Event::ToolResult(ResultBlock {
        call_id: id.into(),
        content: content.into(),
        is_error: false,
        reason: None,
        size: None,
        parts: Vec::new(),
    }));
    drain(m)
}

pub(crate) fn finished(cmds: &[Command]) -> &broca_wal::runrec::RunFinished {
    cmds.iter()
        .find_map(|c| match c {
            Command::Append {
                record: Record::RunFinished(f),
                ..
            } => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no run_finished in {cmds:?}"))
}

#[test]
fn a_cost_budget_runs_until_spent_and_stops_exhausted_with_the_cost_it_measured() {
    let stop = StopConditions {
        input_cap: None,
        max_steps: 10,
        max_total_tokens: None,
        max_cost_micros: Some(100),
    };
    let mut m = RunMachine::start(
        "r".into(),
        priced(stop, None),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    // 10 input tokens at 3 and 2 output at 15: 60 micro-USD a step.
    step_reporting(&mut m, "c1", counts(10, 2));
    assert_eq!(
        kinds(&drain(&mut m)),
        ["model_step_finished", "tool_dispatch_intent!"]
    );
    assert_eq!(
        kinds(&answer(&mut m, "c1", "x")),
        ["tool_result", "step_started", "call"],
        "60 of 100 spent: the next step runs"
    );
    step_reporting(&mut m, "c2", counts(10, 2));
    let cmds = drain(&mut m);
    // 120 spent: the run stops before the step's tools are dispatched.
    assert_eq!(
        kinds(&cmds),
        ["model_step_finished", "tool_result", "run_finished!"],
        "{cmds:?}"
    );
    let f = finished(&cmds);
    assert_eq!(f.reason, FinishKind::BudgetExhausted);
    assert_eq!(
        f.detail.as_deref(),
        Some("cost 120 micro-USD of a 100 micro-USD budget")
    );
    assert_eq!(f.spend.cost_micros, Some(120));
    assert_eq!(f.usage.input, Some(20));
}

#[test]
fn a_cost_budget_stops_before_a_request_that_would_surely_overrun_it() {
    let stop = StopConditions {
        input_cap: None,
        max_steps: 10,
        max_total_tokens: None,
        max_cost_micros: Some(950),
    };
    let mut m = RunMachine::start(
        "r".into(),
        priced(stop, None),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    // 300 input tokens at 3: 900 spent of 950. The next request resends those 300 tokens,
    // 90 micro-USD at the cheapest (cache read) rate at least: it cannot fit, so the tools
    // are not dispatched and no request is made.
    step_reporting(&mut m, "c1", counts(300, 0));
    let cmds = drain(&mut m);
    assert_eq!(
        kinds(&cmds),
        ["model_step_finished", "tool_result", "run_finished!"]
    );
    let f = finished(&cmds);
    assert_eq!(f.reason, FinishKind::BudgetExhausted);
    assert_eq!(
        f.detail.as_deref(),
        Some(
            "cost 900 micro-USD of a 950 micro-USD budget, and the next request would cost \
             at least 90 more"
        )
    );
}

#[test]
fn a_step_that_reports_no_usage_stops_a_token_budget_unmeasured_naming_it() {
    let stop = StopConditions {
        input_cap: None,
        max_steps: 10,
        max_total_tokens: Some(10_000),
        max_cost_micros: None,
    };
    let mut m = RunMachine::start(
        "r".into(),
        priced(stop, None),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    step_reporting(&mut m, "c1", counts(10, 2));
    drain(&mut m);
    answer(&mut m, "c1", "x");
    step_reporting(&mut m, "c2", None);
    let cmds = drain(&mut m);
    let f = finished(&cmds);
    assert_eq!(f.reason, FinishKind::BudgetUnmeasured);
    assert!(
        f.detail
            .as_deref()
            .unwrap()
            .starts_with("step 2 (attempt 1) did not report its input and output"),
        "{:?}",
        f.detail
    );
    // The total sums the step that reported (a lower bound), and the budget still stopped
    // the run: it counts the unmeasured step apart.
    assert_eq!(
        f.usage.input,
        Some(10),
        "the measured step's input, never 0 added"
    );
    assert_eq!(f.spend.unmeasured_steps, 1);
    assert!(
        !cmds
            .iter()
            .any(|c| matches!(c, Command::Dispatch { .. } | Command::CallModel { .. })),
        "nothing runs unmetered"
    );
}

#[test]
fn a_failed_attempt_is_metered_only_when_the_provider_had_answered() {
    let stop = StopConditions {
        input_cap: None,
        max_steps: 10,
        max_total_tokens: Some(10_000),
        max_cost_micros: None,
    };
    let transient = || ClassifiedError {
        class: ErrorClass::Transient,
        message: "overloaded".into(),
        retry_after_ms: None,
    };
    let mut m = RunMachine::start(
        "r".into(),
        priced(stop, None),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    // Refused before any answer: not billed, the retry runs.
    m.feed(Event::AttemptFailed {
        error: transient(),
        usage: None,
    });
    m.handle_timeout(60_000);
    assert_eq!(kinds(&drain(&mut m)), ["model_attempt_finished", "call"]);
    // Cut off mid-answer without usage: it may have been billed and was not metered.
    m.feed(Event::Stream(StreamEvent::TextDelta("par".into())));
    m.feed(Event::AttemptFailed {
        error: transient(),
        usage: None,
    });
    m.handle_timeout(120_000);
    let cmds = drain(&mut m);
    let answered = cmds.iter().any(|c| {
        matches!(c, Command::Append { record: Record::ModelAttemptFinished(a), .. } if a.answered)
    });
    assert!(answered, "{cmds:?}");
    assert_eq!(m.spend().unmeasured_steps(), 1);
    // The retry's step is measured, and the run stops before going on.
    step_reporting(&mut m, "c1", counts(10, 2));
    let f_cmds = drain(&mut m);
    let f = finished(&f_cmds);
    assert_eq!(f.reason, FinishKind::BudgetUnmeasured);
    assert!(
        f.detail
            .as_deref()
            .unwrap()
            .starts_with("step 1 (attempt 2)"),
        "{:?}",
        f.detail
    );
}

#[test]
fn the_context_limit_is_checked_before_each_request_from_an_estimate() {
    let stop = StopConditions {
        input_cap: None,
        max_steps: 10,
        max_total_tokens: None,
        max_cost_micros: None,
    };
    let mut m = RunMachine::start(
        "r".into(),
        priced(stop, Some(100)),
        vec![Message::user_text("go").into()],
        0,
    );
    assert_eq!(
        kinds(&drain(&mut m)),
        ["step_started", "call"],
        "a short prompt is sent"
    );
    step_reporting(&mut m, "c1", counts(60, 10));
    drain(&mut m);
    // 60 in + 10 out + a 200-byte result (about 50 tokens): the next request would pass 100.
    let cmds = answer(&mut m, "c1", &"x".repeat(200));
    let f = finished(&cmds);
    assert_eq!(f.reason, FinishKind::ContextLimit, "{cmds:?}");
    assert!(
        f.detail
            .as_deref()
            .unwrap()
            .starts_with("the next request would carry about 1"),
        "{:?}",
        f.detail
    );
    assert!(!cmds.iter().any(|c| matches!(c, Command::CallModel { .. })));
    // Without any reported input, the whole request is estimated: a 1,000-byte prompt
    // passes a limit of 100 before anything is sent.
    let mut big = RunMachine::start(
        "r".into(),
        priced(
            StopConditions {
                input_cap: None,
                max_steps: 10,
                max_total_tokens: None,
                max_cost_micros: None,
            },
            Some(100),
        ),
        vec![Message::user_text("y".repeat(1000)).into()],
        0,
    );
    let cmds = drain(&mut big);
    assert_eq!(kinds(&cmds), ["run_finished!"]);
    assert_eq!(finished(&cmds).reason, FinishKind::ContextLimit);
}

#[test]
fn display_deltas_name_their_message_and_part() {
    use super::machine::{DeltaKind, DisplayDelta};
    let mut m = RunMachine::start(
        "r".into(),
        config(),
        vec![Message::user_text("go").into()],
        0,
    );
    drain(&mut m);
    // The caller performed the StepStarted append: it took seq 7, the message's id.
    m.step_recorded(7);
    m.feed(Event::Stream(StreamEvent::ThinkingDelta("hm".into())));
    m.feed(Event::Stream(StreamEvent::TextDelta("Hel".into())));
    m.feed(Event::Stream(StreamEvent::TextDelta("lo".into())));
    m.feed(Event::Stream(StreamEvent::ToolCallStart {
        index: 0,
        id: "c1".into(),
        name: "echo".into(),
    }));
    m.feed(Event::Stream(StreamEvent::ToolCallArgsDelta {
        index: 0,
        json: "{}".into(),
    }));
    let deltas: Vec<DisplayDelta> = drain(&mut m)
        .into_iter()
        .filter_map(|c| match c {
            Command::Display(d) => Some(d),
            _ => None,
        })
        .collect();
    let chunk = |part, kind, text: &str| DisplayDelta::Chunk {
        mid: Some(7),
        part,
        kind,
        text: text.into(),
    };
    // Each chunk names the index its part has in the stored message: the text's two
    // deltas one part, the call's arguments another.
    assert_eq!(
        deltas,
        [
            chunk(0, DeltaKind::Reasoning, "hm"),
            chunk(1, DeltaKind::Text, "Hel"),
            chunk(1, DeltaKind::Text, "lo"),
            chunk(2, DeltaKind::ToolInput("c1".into()), "{}"),
        ]
    );
    // A failed attempt's words are dropped: the retry starts with a reset.
    m.feed(Event::AttemptFailed {
        error: ClassifiedError {
            class: ErrorClass::Transient,
            message: "overloaded".into(),
            retry_after_ms: None,
        },
        usage: None,
    });
    drain(&mut m);
    let retry = m.poll_timeout().expect("a backoff").at_ms;
    m.handle_timeout(retry);
    let cmds = drain(&mut m);
    assert!(
        matches!(
            cmds.first(),
            Some(Command::Display(DisplayDelta::Reset { mid: Some(7) }))
        ),
        "{cmds:?}"
    );
}
