//! The run loop end to end on a real WAL: admission, steps, durable intents before dispatch,
//! results, terminal records, idempotent sends, refusals that write nothing, resume.

use std::path::Path;
use std::rc::Rc;

use broca::core::admission::SendRequest;
use broca::core::machine::Outcome;
use broca::core::RunState;
use broca::session::{ActorError, CrashPlan, SessionActor};
use broca::wal::runrec::FinishKind;
use broca::wal::verify::read_and_scan;
use broca::wal::writer::wal_path;
use broca::wal::{Record, SessionTriple};
use broca_io::{Committer, LogConfig};
use broca_shards::run_local;
use broca_testkit::{CountingTools, Script, ScriptedModel};

fn triple() -> SessionTriple {
    SessionTriple::new("/proj", "test", "run").unwrap()
}

type Actor = SessionActor<ScriptedModel, CountingTools>;

async fn open(dir: &Path, script: Script, tools: &CountingTools) -> Actor {
    open_crashing(dir, script, tools, CrashPlan::default()).await
}

/// The session, stopping as if the process died where `plan` says.
async fn open_crashing(
    dir: &Path,
    script: Script,
    tools: &CountingTools,
    plan: CrashPlan,
) -> Actor {
    let actor = SessionActor::opener(
        dir,
        &triple(),
        Rc::new(ScriptedModel::new(script)),
        Rc::new(tools.clone()),
    )
    .tool_specs(CountingTools::specs(&["echo", "write"]))
    .log(LogConfig::default())
    .committer(Committer::default())
    .crash_plan(plan)
    .timer_permille(0)
    .open()
    .await
    .unwrap();
    actor
}

fn send(prompt: &str, send_id: &str) -> SendRequest {
    SendRequest {
        prompt: prompt.into(),
        model: "scripted/m1".into(),
        send_id: Some(send_id.into()),
        max_steps: Some(8),
        ..SendRequest::default()
    }
}

/// Opens the session, sends `req` and runs it to its end.
fn run_once(dir: &Path, script: Script, tools: &CountingTools, req: &SendRequest) -> Outcome {
    run_local(async {
        let mut a = open(dir, script, tools).await;
        a.send(req).await.unwrap();
        a.run_admitted().await.unwrap()
    })
    .unwrap()
}

fn dispatched(tools: &CountingTools) -> u32 {
    tools.dispatched.borrow().values().sum()
}

fn count(recs: &[(u64, Record)], pred: impl Fn(&Record) -> bool) -> usize {
    recs.iter().filter(|(_, r)| pred(r)).count()
}

fn records(dir: &Path) -> Vec<(u64, Record)> {
    let (bytes, scan) = read_and_scan(&wal_path(dir, &triple())).unwrap();
    scan.decode(&bytes).unwrap().records
}

/// Tools that look at the WAL on disk when a call arrives: with the log in the power-loss mode
/// (writes reach the file only with their fdatasync), the call's intent is in the file only if
/// it was made durable before the dispatch.
#[derive(Clone)]
struct DurabilityProbe {
    wal: std::path::PathBuf,
    counting: CountingTools,
    /// Each call, and whether its intent was durable when it arrived.
    seen: Rc<std::cell::RefCell<Vec<(String, bool)>>>,
}

impl broca::tools::ToolRunner for DurabilityProbe {
    async fn call(
        &self,
        call: broca::protocol::ToolCall,
        route: String,
        origin: broca::tools::ToolOrigin,
    ) -> broca::tools::ToolOutcome {
        let (bytes, scan) = read_and_scan(&self.wal).unwrap();
        let on_disk = scan.decode(&bytes).unwrap().records.iter().any(|(_, r)| {
            matches!(r, Record::ToolDispatchIntent(i) if i.calls.iter().any(|c| c.id == call.id))
        });
        self.seen.borrow_mut().push((call.id.clone(), on_disk));
        self.counting.call(call, route, origin).await
    }
}

#[test]
fn a_run_completes_with_each_intent_durable_before_its_results_and_one_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let probe = DurabilityProbe {
        wal: wal_path(dir.path(), &triple()),
        counting: tools.clone(),
        seen: Rc::default(),
    };
    let script = Script {
        seed: 7,
        tool_step_percent: 100,
        tool_steps_max: 2,
        tools: vec!["echo".into(), "write".into()],
        ..Script::default()
    };
    // Writes stay in memory until their fdatasync, and each sync is late (a slow disk): a
    // call dispatched before its intent's sync finished would find no intent on disk.
    let cfg = LogConfig {
        power_loss: Some(broca_io::power_loss::PowerLoss {
            sync_delay: std::time::Duration::from_millis(5),
            ledger: std::sync::Arc::new(broca_io::power_loss::Ledger::new(
                dir.path().join("ledger"),
            )),
        }),
        ..LogConfig::default()
    };
    let outcome = run_local(async {
        let mut a = SessionActor::opener(
            dir.path(),
            &triple(),
            Rc::new(ScriptedModel::new(script)),
            Rc::new(probe.clone()),
        )
        .tool_specs(CountingTools::specs(&["echo", "write"]))
        .log(cfg)
        .committer(Committer::default())
        .timer_permille(0)
        .open()
        .await
        .unwrap();
        let reply = a.send(&send("do things", "s1")).await.unwrap();
        let outcome = a.run_admitted().await.unwrap();
        assert_eq!(
            a.state().run(&reply.run_id).unwrap().state,
            RunState::Finished(FinishKind::Completed)
        );
        a.close().await.unwrap();
        outcome
    })
    .unwrap();
    assert_eq!(outcome.reason, Some(FinishKind::Completed));
    assert!(outcome.usage.input.is_some() && outcome.usage.output.is_some());
    let seen = probe.seen.borrow();
    assert!(!seen.is_empty(), "the script asks for tools");
    for (call_id, durable) in seen.iter() {
        assert!(
            durable,
            "{call_id} was dispatched before its intent was durable"
        );
    }

    let recs = records(dir.path());
    let mut intents = 0;
    let mut calls = 0;
    for (i, (_, r)) in recs.iter().enumerate() {
        if let Record::ToolDispatchIntent(intent) = r {
            intents += 1;
            calls += intent.calls.len();
            for call in &intent.calls {
                assert_eq!(tools.count(&call.id), 1, "{} dispatched once", call.id);
                let result_at = recs.iter().position(
                    |(_, r)| matches!(r, Record::ToolResult(t) if t.result.call_id == call.id),
                );
                assert!(result_at.unwrap() > i, "the result follows its intent");
            }
        }
    }
    assert!(intents >= 1);
    assert_eq!(
        calls,
        seen.len(),
        "every call of every intent was dispatched and probed"
    );
    let terminals = count(&recs, |r| matches!(r, Record::RunFinished(_)));
    assert_eq!(terminals, 1);
}

#[test]
fn a_repeated_send_id_returns_the_same_run_and_writes_nothing_and_other_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    run_local(async {
        let mut a = open(dir.path(), Script::default(), &tools).await;
        let first = a.send(&send("hello", "s1")).await.unwrap();
        a.run_admitted().await.unwrap();
        let path = wal_path(dir.path(), &triple());
        a.writer().log().sync().await.unwrap();
        let before = std::fs::read(&path).unwrap();

        let again = a.send(&send("hello", "s1")).await.unwrap();
        assert_eq!(again.run_id, first.run_id);
        assert!(again.existing);
        let err = a.send(&send("something else", "s1")).await.unwrap_err();
        assert!(
            matches!(&err, ActorError::Refused(r) if r.code().as_str() == "send_id_reuse"),
            "{err}"
        );
        let bad = SendRequest {
            model: "nope/x".into(),
            ..send("x", "s2")
        };
        let err = a.send(&bad).await.unwrap_err();
        assert!(
            matches!(&err, ActorError::Refused(r) if r.code().as_str() == "invalid_params"),
            "{err}"
        );
        let empty = SendRequest {
            prompt: String::new(),
            ..send("x", "s3")
        };
        assert!(a.send(&empty).await.is_err());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "refusals and repeats wrote nothing"
        );
        a.close().await.unwrap();
    })
    .unwrap();
}

#[test]
fn a_crash_after_the_intent_leaves_the_calls_indeterminate_and_the_resume_closes_them() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let script = Script {
        seed: 3,
        tool_step_percent: 100,
        ..Script::default()
    };
    // Appends: RunStarted, StepStarted, ModelStepFinished, ToolDispatchIntent: crash there.
    run_local(async {
        let plan = CrashPlan {
            after_appends: Some(4),
            durable: true,
        };
        let mut a = open_crashing(dir.path(), script.clone(), &tools, plan).await;
        a.send(&send("go", "s1")).await.unwrap();
        assert!(matches!(
            a.run_admitted().await,
            Err(ActorError::Crashed { .. })
        ));
    })
    .unwrap();
    assert!(
        tools.dispatched.borrow().is_empty(),
        "the crash came before any dispatch"
    );

    let (run_id, outcome) = run_local(async {
        let mut a = open(dir.path(), script.clone(), &tools).await;
        let resumed = a.resume().await.unwrap().expect("an open run");
        a.close().await.unwrap();
        resumed
    })
    .unwrap();
    assert_eq!(
        outcome.reason,
        Some(FinishKind::Interrupted),
        "never cancelled"
    );
    assert!(!outcome.indeterminate_tool_calls.is_empty());
    assert!(
        tools.dispatched.borrow().is_empty(),
        "indeterminate calls are never dispatched"
    );

    // The resume closed each call in the commit that ended the run: nothing is left for
    // the next send to resolve, and no later request carries a call without its result.
    run_local(async {
        let mut a = open(dir.path(), script, &tools).await;
        assert!(a.state().unresolved_calls.is_empty());
        let reply = a.send(&send("continue", "s2")).await.unwrap();
        assert_ne!(reply.run_id, run_id);
        a.run_admitted().await.unwrap();
        a.close().await.unwrap();
    })
    .unwrap();
    for id in &outcome.indeterminate_tool_calls {
        assert_eq!(
            tools.count(id),
            0,
            "an indeterminate call is never dispatched, also after the next send"
        );
    }
    let recs = records(dir.path());
    let resumed = count(&recs, |r| matches!(r, Record::RunResumed(_)));
    assert_eq!(resumed, 1, "every resume is recorded");
    let closed: Vec<&broca::wal::runrec::ResultBlock> = recs
        .iter()
        .filter_map(|(_, r)| match r {
            Record::ToolResult(t) => Some(&t.result),
            _ => None,
        })
        .filter(|b| b.reason.as_deref() == Some("outcome_unknown"))
        .collect();
    let ids: Vec<&str> = closed.iter().map(|b| b.call_id.as_str()).collect();
    assert_eq!(
        ids,
        outcome
            .indeterminate_tool_calls
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert!(closed
        .iter()
        .all(|b| b.is_error && b.content.contains("outcome unknown")));
    // Before the run's terminal record: closed in the commit that ends it.
    let last_result = recs
        .iter()
        .rposition(|(_, r)| matches!(r, Record::ToolResult(t) if t.result.reason.as_deref() == Some("outcome_unknown")))
        .unwrap();
    let finished = recs
        .iter()
        .position(|(_, r)| matches!(r, Record::RunFinished(_)))
        .unwrap();
    assert!(last_result < finished);
    let Some(Record::RunStarted(second)) = recs
        .iter()
        .map(|(_, r)| r)
        .filter(|r| matches!(r, Record::RunStarted(_)))
        .nth(1)
    else {
        panic!("two runs")
    };
    assert!(second.resolved_calls.is_empty());
}

#[test]
fn a_budget_the_provider_cannot_measure_stops_the_run_with_that_reason() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let script = Script {
        report_usage: false,
        ..Script::default()
    };
    let req = SendRequest {
        budget: Some(broca::core::admission::Budget {
            max_total_tokens: Some(1000),
            max_cost_micros: None,
        }),
        ..send("hi", "s1")
    };
    let outcome = run_once(dir.path(), script, &tools, &req);
    assert_eq!(outcome.reason, Some(FinishKind::BudgetUnmeasured));
    assert!(outcome.detail.unwrap().contains("did not report"));
    assert_eq!(outcome.usage.input, None, "absent is not zero");
}

#[test]
fn a_step_that_reports_no_usage_stops_a_token_budgeted_run_at_that_step() {
    // Three steps (two ask for a tool, the third answers); the second reports no usage.
    let script = |unreported: Vec<u32>| Script {
        tool_step_percent: 100,
        tool_steps_max: 2,
        calls_per_step_max: 1,
        unreported_steps: unreported,
        ..Script::default()
    };
    let req = SendRequest {
        budget: Some(broca::core::admission::Budget {
            max_total_tokens: Some(1_000_000),
            max_cost_micros: None,
        }),
        ..send("three steps", "s1")
    };
    // Measured on every step, the budget holds and the run completes with its totals.
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let whole = run_once(dir.path(), script(vec![]), &tools, &req);
    assert_eq!(whole.reason, Some(FinishKind::Completed), "{whole:?}");
    assert!(whole.usage.input.is_some() && whole.unmeasured_steps == 0);
    assert_eq!(dispatched(&tools), 2);

    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let outcome = run_once(dir.path(), script(vec![2]), &tools, &req);
    assert_eq!(
        outcome.reason,
        Some(FinishKind::BudgetUnmeasured),
        "{outcome:?}"
    );
    let detail = outcome.detail.clone().unwrap();
    assert!(detail.contains("step 2"), "{detail}");
    // Not run on unmetered: the second step's tool call is not dispatched, no third step.
    assert_eq!(dispatched(&tools), 1);
    let recs = records(dir.path());
    assert_eq!(
        count(&recs, |r| matches!(r, Record::ModelStepFinished(_))),
        2
    );
    // The sum covers the step that reported (a lower bound, the unknown step never taken as
    // 0), and the run says how many steps went unmeasured.
    assert!(outcome.usage.input.is_some_and(|n| n > 0), "{outcome:?}");
    assert_eq!(outcome.unmeasured_steps, 1);
}

#[test]
fn max_steps_stops_a_run_that_keeps_asking_for_tools() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let script = Script {
        tool_step_percent: 100,
        tool_steps_max: 100,
        ..Script::default()
    };
    let req = SendRequest {
        max_steps: Some(3),
        ..send("loop", "s1")
    };
    let outcome = run_once(dir.path(), script, &tools, &req);
    assert_eq!(outcome.reason, Some(FinishKind::MaxSteps));
    let recs = records(dir.path());
    let steps = count(&recs, |r| matches!(r, Record::ModelStepFinished(_)));
    assert_eq!(steps, 3);
}

#[test]
fn transient_failures_are_retried_a_bounded_number_of_times_and_each_attempt_recorded() {
    // Always failing: five attempts, each recorded, then the run ends in error, classified.
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let script = Script {
        transient_percent: 100,
        ..Script::default()
    };
    let outcome = run_once(dir.path(), script, &tools, &send("flaky", "s1"));
    assert_eq!(outcome.reason, Some(FinishKind::Error));
    assert_eq!(
        outcome.error.unwrap().class,
        broca::protocol::ErrorClass::Transient
    );
    let recs = records(dir.path());
    let attempts: Vec<u32> = recs
        .iter()
        .filter_map(|(_, r)| match r {
            Record::ModelAttemptFinished(a) => Some(a.attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, vec![1, 2, 3, 4, 5]);
    assert!(
        !recs
            .iter()
            .any(|(_, r)| matches!(r, Record::ModelStepFinished(_))),
        "no partial step"
    );

    // Failing half the time: some seed fails an attempt and the retry completes the run.
    let mut retried_and_completed = false;
    for seed in 1..40 {
        let dir = tempfile::tempdir().unwrap();
        let script = Script {
            transient_percent: 50,
            seed,
            ..Script::default()
        };
        let outcome = run_once(dir.path(), script, &tools, &send("flaky", "s1"));
        let failed = records(dir.path())
            .iter()
            .any(|(_, r)| matches!(r, Record::ModelAttemptFinished(_)));
        if failed && outcome.reason == Some(FinishKind::Completed) {
            retried_and_completed = true;
            break;
        }
    }
    assert!(retried_and_completed);
}

#[test]
fn requests_render_byte_for_byte_the_same_from_the_live_session_and_from_its_replay() {
    let dir = tempfile::tempdir().unwrap();
    let tools = CountingTools::default();
    let script = Script {
        seed: 11,
        tool_step_percent: 100,
        tool_steps_max: 3,
        tools: vec!["echo".into(), "write".into()],
        ..Script::default()
    };
    let (live, config) = run_local(async {
        let mut a = open(dir.path(), script, &tools).await;
        let reply = a.send(&send("do things", "s1")).await.unwrap();
        a.run_admitted().await.unwrap();
        let live = a.state().transcript.clone();
        let config = a.state().run(&reply.run_id).unwrap().config.clone();
        a.close().await.unwrap();
        (live, config)
    })
    .unwrap();
    let (bytes, scan) = read_and_scan(&wal_path(dir.path(), &triple())).unwrap();
    let replayed = broca::core::Session::replay_scan(&scan, &bytes)
        .unwrap()
        .transcript;
    assert!(
        live.iter().any(|m| m.tool_calls().next().is_some()),
        "the run called tools"
    );
    let request = |messages| broca::protocol::Request {
        provider: config.provider.clone(),
        model: config.model.clone(),
        credential_id: config.credential_id.clone(),
        system: Some("sys".into()),
        messages,
        tools: config.tools.clone(),
        generation: config.generation.clone(),
        prompt_cache: true,
        route: None,
        shape: None,
        media: Default::default(),
    };
    let (live, replayed) = (request(live), request(replayed));
    let aliases = broca::provider::Aliases::for_tools(&live.tools);
    assert_eq!(
        broca::provider::FAMILIES.len(),
        7,
        "every family of the brief"
    );
    for id in broca::provider::FAMILIES {
        let f = broca::provider::family(id).unwrap();
        assert_eq!(
            f.render(&live, &aliases).body,
            f.render(&replayed, &aliases).body,
            "{id}"
        );
    }
}
