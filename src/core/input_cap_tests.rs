//! The session's input cap (llm-runner/v1 `budget.max_input_tokens`) in the machine alone:
//! checked before each step and right after each step, on measured input only, never an
//! estimate; a stop seals the step's calls undispatched in the commit that ends the run.

use super::machine::{Command, Event, ResumeFrom, ResumePoint, RunMachine};
use super::machine_tests::{answer, config, counts, drain, finished, kinds, step_reporting, Feed};
use super::spend::InputTally;
use broca_protocol::{FinishReason, Message, Usage};
use broca_wal::runrec::{budget_stop, BudgetStop, FinishKind, FrozenConfig, InputCap};
use broca_wal::Record;

fn capped(limit: u64, spent: u64, unmeasured: bool) -> FrozenConfig {
    let mut c = config();
    c.stop.max_steps = 10;
    c.stop.input_cap = Some(InputCap {
        limit,
        spent,
        unmeasured,
    });
    c
}

fn start(config: FrozenConfig) -> RunMachine {
    RunMachine::start("r".into(), config, vec![Message::user_text("go").into()], 0)
}

fn stop(limit: u64, spent: u64, cause: &str) -> Option<BudgetStop> {
    Some(BudgetStop {
        measure: budget_stop::MAX_INPUT_TOKENS.into(),
        limit,
        spent,
        cause: cause.into(),
    })
}

/// The reason of each tool result the commands append.
fn result_reasons(cmds: &[Command]) -> Vec<Option<String>> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Append {
                record: Record::ToolResult(r),
                ..
            } => Some(r.result.reason.clone()),
            _ => None,
        })
        .collect()
}

/// The commands after a step the cap stopped: its one call's never-run result, then the
/// run's end in the same commit; the end's record.
fn sealed_after_the_step(m: &mut RunMachine) -> broca_wal::runrec::RunFinished {
    let cmds = drain(m);
    assert_eq!(
        kinds(&cmds),
        ["model_step_finished", "tool_result", "run_finished!"]
    );
    assert_eq!(
        result_reasons(&cmds),
        [Some("budget_exhausted".to_string())]
    );
    finished(&cmds).clone()
}

#[test]
fn input_under_the_cap_runs_on_and_output_never_counts() {
    let mut m = start(capped(10, 3, false));
    assert_eq!(kinds(&drain(&mut m)), ["step_started", "call"]);
    // 3 + 6 = 9 of 10: the tools run, however much the step wrote.
    step_reporting(&mut m, "c1", counts(6, 5_000));
    assert_eq!(
        kinds(&drain(&mut m)),
        ["model_step_finished", "tool_dispatch_intent!"]
    );
    assert_eq!(
        kinds(&answer(&mut m, "c1", "x")),
        ["tool_result", "step_started", "call"]
    );
}

#[test]
fn the_step_that_reaches_the_cap_ends_the_run_and_its_calls_never_run() {
    let mut m = start(capped(10, 3, false));
    drain(&mut m);
    // 3 + 7 = 10: a cap of 10 stops at exactly 10, before the step's call is dispatched.
    step_reporting(&mut m, "c1", counts(7, 1));
    let f = sealed_after_the_step(&mut m);
    assert_eq!(f.reason, FinishKind::BudgetExhausted);
    assert_eq!(f.budget, stop(10, 10, budget_stop::LIMIT_REACHED));
    m.feed(Event::Durable);
    assert_eq!(kinds(&drain(&mut m)), ["finish:budget_exhausted"]);
}

#[test]
fn a_step_may_overshoot_and_spent_is_what_was_measured() {
    let mut m = start(capped(10, 0, false));
    drain(&mut m);
    step_reporting(&mut m, "c1", counts(4, 1));
    answer(&mut m, "c1", "x");
    // 4 + 50: the step started under the cap; it is not estimated beforehand.
    step_reporting(&mut m, "c2", counts(50, 1));
    let f = finished(&drain(&mut m)).clone();
    assert_eq!(f.budget, stop(10, 54, budget_stop::LIMIT_REACHED));
}

#[test]
fn a_session_that_spent_its_cap_takes_no_step() {
    let mut m = start(capped(6, 6, false));
    let cmds = drain(&mut m);
    assert_eq!(kinds(&cmds), ["run_finished!"], "no model request");
    assert_eq!(
        finished(&cmds).budget,
        stop(6, 6, budget_stop::LIMIT_REACHED)
    );
}

#[test]
fn a_step_without_its_input_count_fails_closed_before_its_calls() {
    let mut m = start(capped(10, 3, false));
    drain(&mut m);
    let output_only = Some(Usage {
        output: Some(9),
        ..Usage::default()
    });
    step_reporting(&mut m, "c1", output_only);
    let f = sealed_after_the_step(&mut m);
    assert_eq!(f.reason, FinishKind::BudgetUnmeasured);
    // Only the measured steps before it: the unmeasured one is never counted as zero.
    assert_eq!(f.budget, stop(10, 3, budget_stop::USAGE_UNREPORTED));
}

#[test]
fn an_unmeasured_earlier_step_stops_a_capped_run_before_its_first_step() {
    let mut m = start(capped(10, 3, true));
    let cmds = drain(&mut m);
    assert_eq!(kinds(&cmds), ["run_finished!"]);
    assert_eq!(
        finished(&cmds).budget,
        stop(10, 3, budget_stop::USAGE_UNREPORTED)
    );
}

#[test]
fn a_run_without_a_cap_goes_on_whatever_its_steps_report() {
    let mut m = start(config());
    drain(&mut m);
    step_reporting(&mut m, "c1", None);
    assert_eq!(
        kinds(&drain(&mut m)),
        ["model_step_finished", "tool_dispatch_intent!"]
    );
}

#[test]
fn a_crash_after_the_crossing_step_seals_it_at_resume_without_dispatching() {
    // The step's record was durable (the session had spent 12 of 10 with it), its end not.
    let mut m = RunMachine::resume(
        ResumeFrom {
            step_seq: None,
            steers: Vec::new(),
            compacted: None,
            run_id: "r".into(),
            config: capped(10, 3, false),
            transcript: vec![
                Message::user_text("go").into(),
                Message {
                    role: broca_protocol::Role::Assistant,
                    content: vec![broca_protocol::Block::ToolUse {
                        id: "c1".into(),
                        name: "echo".into(),
                        input: broca_protocol::Json::empty_object(),
                    }],
                }
                .into(),
            ],
            step: 1,
            spend: Default::default(),
            last_step: None,
            point: ResumePoint::AfterStep {
                usage: counts(9, 1).unwrap(),
                finish_reason: FinishReason::ToolUse,
            },
            cancel_requested: false,
            input: InputTally {
                spent: 12,
                unmeasured: false,
            },
        },
        0,
    );
    let cmds = drain(&mut m);
    assert_eq!(
        kinds(&cmds),
        ["run_resumed", "tool_result", "run_finished!"]
    );
    assert_eq!(
        result_reasons(&cmds),
        [Some("budget_exhausted".to_string())]
    );
    assert_eq!(
        finished(&cmds).budget,
        stop(10, 12, budget_stop::LIMIT_REACHED)
    );
}
