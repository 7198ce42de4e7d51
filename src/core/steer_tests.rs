//! Steered and interrupting sends, end to end in the domain: admission, the machine that
//! renders a steer at its next step boundary, and replay, which must rebuild the same
//! conversation from the records the machine asked for.

use std::sync::Arc;

use broca_protocol::{Block, FinishReason, Message, Role, StreamEvent};
use broca_wal::runrec::{FinishKind, ResultBlock, RunStarted};
use broca_wal::Record;

use crate::admission::{admit_prepared, start_queued, Admitted, Prepared};
use crate::machine::{Command, Event, RunMachine};
use crate::machine_tests::{config, drain, Feed};
use crate::replay::{Session, SteerDelivered};

/// A session and the machine of its one run, each record the machine appends applied to the
/// session (as the actor does), with its seq.
pub(crate) struct Live {
    pub session: Session,
    pub machine: Option<RunMachine>,
    seq: u64,
    /// The messages of each model request, in order.
    pub calls: Vec<Vec<Arc<Message>>>,
    /// The system text of each model request, in order.
    pub systems: Vec<Option<String>>,
    /// Every record applied, with its seq: what a replay after a crash reads.
    pub records: Vec<(u64, Record)>,
}

impl Live {
    fn new() -> Live {
        Live::start(config(), "go")
    }

    /// A session whose first run `r` starts with `prompt` under `config`.
    pub(crate) fn start(config: broca_wal::runrec::FrozenConfig, prompt: &str) -> Live {
        let mut live = Live {
            session: Session::with_entries(),
            machine: None,
            seq: 0,
            calls: Vec::new(),
            systems: Vec::new(),
            records: Vec::new(),
        };
        live.next_run("r", prompt, config);
        live
    }

    /// Starts run `run_id` with `prompt` under `config` in the session, as the actor does.
    pub(crate) fn next_run(
        &mut self,
        run_id: &str,
        prompt: &str,
        config: broca_wal::runrec::FrozenConfig,
    ) {
        let mut r = started(run_id, prompt, None);
        r.config = config.clone();
        self.apply(Record::RunStarted(Box::new(r)));
        let m = RunMachine::start_with_steers(
            run_id.into(),
            config,
            self.session.transcript.clone(),
            self.session.compacted.clone(),
            Vec::<crate::machine::Waiting>::new(),
            0,
        );
        self.machine = Some(m);
        self.pump();
    }

    /// Takes `machine` as the session's (a resumed run) and performs what it asks.
    pub(crate) fn drive(&mut self, machine: RunMachine) {
        self.machine = Some(machine);
        self.pump();
    }

    fn apply(&mut self, record: Record) -> u64 {
        self.seq += 1;
        self.records.push((self.seq, record.clone()));
        self.session.apply(self.seq, record).unwrap();
        self.seq
    }

    /// Performs the machine's commands: appends applied (a waited one made durable at once),
    /// model requests kept.
    pub(crate) fn pump(&mut self) {
        loop {
            let cmds = drain(self.machine.as_mut().unwrap());
            if cmds.is_empty() {
                return;
            }
            for c in cmds {
                match c {
                    Command::Append { record, wait } => {
                        let step = matches!(record, Record::StepStarted(_));
                        let seq = self.apply(record);
                        let m = self.machine.as_mut().unwrap();
                        if step {
                            m.step_recorded(seq);
                        }
                        if wait {
                            m.feed(Event::Durable);
                        }
                    }
                    Command::CallModel { request, .. } => {
                        self.calls.push(request.messages);
                        self.systems.push(request.system);
                    }
                    _ => {}
                }
            }
        }
    }

    pub(crate) fn feed(&mut self, event: Event) {
        self.machine.as_mut().unwrap().feed(event);
        self.pump();
    }

    /// A steer accepted through admission while the run is open: its record applied, then
    /// the machine told, as the actor does.
    fn steer(&mut self, send_id: &str, prompt: &str) -> u64 {
        let admitted = admit_prepared(
            prepared(send_id, prompt, "steer"),
            &self.session,
            "x".into(),
            0,
        );
        let Ok(Admitted::Steered(record)) = admitted else {
            panic!("a steer into an open run is admitted as one: {admitted:?}")
        };
        assert_eq!(record.run_id, "r");
        let seq = self.apply(Record::SendSteered(record));
        self.feed(Event::Steer {
            seq,
            blocks: broca_protocol::user_blocks(prompt, &[]),
        });
        seq
    }

    pub(crate) fn text_step(&mut self, text: &str) {
        self.feed(Event::Stream(StreamEvent::TextDelta(text.into())));
        self.feed(Event::Stream(StreamEvent::Finish {
            reason: FinishReason::EndTurn,
            request_id: None,
        }));
        self.feed(Event::StepEnded);
    }

    pub(crate) fn tool_step(&mut self, id: &str) {
        self.call_step(None, id, "echo", "{}");
    }

    /// A step that says `text` (when given), then calls tool `name` (`id`) with `args`.
    pub(crate) fn call_step(&mut self, text: Option<&str>, id: &str, name: &str, args: &str) {
        if let Some(text) = text {
            self.feed(Event::Stream(StreamEvent::TextDelta(text.into())));
        }
        for ev in [
            StreamEvent::ToolCallStart {
                index: 0,
                id: id.into(),
                name: name.into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: args.into(),
            },
            StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: None,
            },
        ] {
            self.feed(Event::Stream(ev));
        }
        self.feed(Event::StepEnded);
    }

    /// Call `id`'s tool answers `content`.
    pub(crate) fn answered(&mut self, id: &str, content: &str) {
        self.feed(Event::ToolResult(ResultBlock {
            call_id: id.into(),
            content: content.into(),
            is_error: false,
            reason: None,
            size: None,
            parts: Vec::new(),
        }));
    }
}

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

fn started(run_id: &str, prompt: &str, delivery: Option<&str>) -> RunStarted {
    RunStarted {
        run_id: run_id.into(),
        send_id: Some(format!("send-{run_id}")),
        inputs_digest: format!("digest-{run_id}"),
        prompt: prompt.into(),
        config: config(),
        resolved_calls: Vec::new(),
        at_unix_ms: 0,
        principal: None,
        scope_owner: None,
        submission_id: None,
        client_message_id: None,
        resolved_mid: None,
        delivery: delivery.map(str::to_string),
        steer_seq: None,
        media: Vec::new(),
        order: None,
        pre_user: Vec::new(),
    }
}

fn prepared(send_id: &str, prompt: &str, delivery: &str) -> Prepared {
    Prepared {
        send_id: Some(send_id.into()),
        inputs_digest: format!("digest-{send_id}"),
        prompt_digest: crate::replay::prompt_digest(prompt),
        prompt: prompt.into(),
        config: config(),
        client_message_id: None,
        caller: broca_wire::Caller::operator(),
        delivery: Some(delivery.into()),
        order: None,
        named: vec!["model"],
        content: Vec::new(),
        policy_required: false,
        plan: None,
        pre_user: Vec::new(),
    }
}

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
    // A re-send answers the step it was rendered at.
    let answer = crate::views::steer_answer(&live.session, seq).unwrap();
    assert_eq!(answer["delivered"]["as"], "step");
    assert_eq!(answer["delivered"]["ref"], seq.to_string());
    assert_eq!(answer["run_id"], "r");
    assert_eq!(answer["state"], "finished");
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
    let answer = crate::views::steer_answer(&live.session, seq).unwrap();
    assert_eq!(
        (
            &answer["delivered"]["as"],
            &answer["delivered"]["ref"],
            &answer["run_id"]
        ),
        (&"turn".into(), &"r2".into(), &"r2".into())
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
