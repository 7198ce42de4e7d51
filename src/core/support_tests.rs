//! What the tests of broca-core and of the crates above it build sessions from: a frozen
//! config, the records of a run, and [`Live`], a session and its run's machine driven as the
//! actor drives them. Compiled for tests, and for other crates' tests through the
//! `test-support` feature; never in a production build.

use std::sync::Arc;

use broca_protocol::{FinishReason, Message, StreamEvent, ToolSpec};
use broca_wal::runrec::{
    CachePolicy, FinishKind, FrozenConfig, ResultBlock, RunFinished, RunStarted, StepStarted,
    StopConditions,
};
use broca_wal::Record;

use crate::admission::{admit_prepared, Admitted, Prepared};
use crate::machine::{Command, Event, RunMachine};
use crate::replay::Session;

pub fn config() -> FrozenConfig {
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
            reply: None,
        }]
        .into(),
        tools_digest: "t".into(),
        generation: Default::default(),
        stop: StopConditions {
            input_cap: None,
            max_steps: 5,
            max_total_tokens: None,
            max_cost_micros: None,
        },
        context_limit: None,
        cache_policy: CachePolicy::Auto,
        directives: Vec::new(),
        structured_output: None,
        route_decision_id: None,
        compaction: None,
        retention: None,
        retention_policy: None,
        title: None,
        plan: None,
    }
}

/// Feeds events at time 0 (these tests are about order, not time).
pub trait Feed {
    fn feed(&mut self, event: Event);
}

impl Feed for RunMachine {
    fn feed(&mut self, event: Event) {
        self.handle(event, 0);
    }
}

pub fn drain(m: &mut RunMachine) -> Vec<Command> {
    std::iter::from_fn(|| m.poll_command()).collect()
}

/// Run `r`'s RunStarted, for `anthropic/m`.
pub fn started() -> Record {
    let config = crate::admission::prepare(
        &crate::admission::SendRequest {
            prompt: "go".into(),
            model: "anthropic/m".into(),
            ..Default::default()
        },
        &[],
        &broca_catalog::Catalog::builtin(),
        &broca_protocol::model::AnyProvider,
    )
    .unwrap()
    .config;
    started_with("r", config, 0)
}

/// The RunStarted of run `run_id` under `config`, at `at` (ms), prompt `go`.
pub fn started_with(run_id: &str, config: broca_wal::runrec::FrozenConfig, at: u64) -> Record {
    Record::RunStarted(Box::new(RunStarted {
        run_id: run_id.into(),
        send_id: None,
        inputs_digest: "d".into(),
        prompt: "go".into(),
        config,
        resolved_calls: Vec::new(),
        at_unix_ms: at,
        principal: None,
        scope_owner: None,
        submission_id: None,
        client_message_id: None,
        resolved_mid: None,
        delivery: None,
        steer_seq: None,
        media: Vec::new(),
        order: None,
        pre_user: Vec::new(),
    }))
}

/// Run `r`'s StepStarted of step `n`.
pub fn step(n: u32) -> Record {
    Record::StepStarted(StepStarted {
        run_id: "r".into(),
        step: n,
        at_unix_ms: None,
        steers: Vec::new(),
        delivered: Vec::new(),
    })
}

pub fn finished(run_id: &str, at: u64) -> Record {
    Record::RunFinished(RunFinished {
        run_id: run_id.into(),
        reason: FinishKind::Completed,
        detail: None,
        error: None,
        indeterminate_tool_calls: Vec::new(),
        usage: Default::default(),
        spend: Default::default(),
        at_unix_ms: Some(at),
        cause: None,
        budget: None,
        structured_output: None,
    })
}

/// A session and the machine of its one run, each record the machine appends applied to the
/// session (as the actor does), with its seq.
pub struct Live {
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
    pub fn new() -> Live {
        Live::start(config(), "go")
    }

    /// A session whose first run `r` starts with `prompt` under `config`.
    pub fn start(config: broca_wal::runrec::FrozenConfig, prompt: &str) -> Live {
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
    pub fn next_run(
        &mut self,
        run_id: &str,
        prompt: &str,
        config: broca_wal::runrec::FrozenConfig,
    ) {
        let mut r = run_started(run_id, prompt, None);
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
    pub fn drive(&mut self, machine: RunMachine) {
        self.machine = Some(machine);
        self.pump();
    }

    pub fn apply(&mut self, record: Record) -> u64 {
        self.seq += 1;
        self.records.push((self.seq, record.clone()));
        self.session.apply(self.seq, record).unwrap();
        self.seq
    }

    /// Performs the machine's commands: appends applied (a waited one made durable at once),
    /// model requests kept.
    pub fn pump(&mut self) {
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

    pub fn feed(&mut self, event: Event) {
        self.machine.as_mut().unwrap().feed(event);
        self.pump();
    }

    /// A steer accepted through admission while the run is open: its record applied, then
    /// the machine told, as the actor does.
    pub fn steer(&mut self, send_id: &str, prompt: &str) -> u64 {
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

    pub fn text_step(&mut self, text: &str) {
        self.feed(Event::Stream(StreamEvent::TextDelta(text.into())));
        self.feed(Event::Stream(StreamEvent::Finish {
            reason: FinishReason::EndTurn,
            request_id: None,
        }));
        self.feed(Event::StepEnded);
    }

    pub fn tool_step(&mut self, id: &str) {
        self.call_step(None, id, "echo", "{}");
    }

    /// A step that says `text` (when given), then calls tool `name` (`id`) with `args`.
    pub fn call_step(&mut self, text: Option<&str>, id: &str, name: &str, args: &str) {
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
    pub fn answered(&mut self, id: &str, content: &str) {
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

/// A send as admission's first part leaves it: `prompt` as `send_id`, delivered `delivery`.
pub fn prepared(send_id: &str, prompt: &str, delivery: &str) -> Prepared {
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
        shown_parts: Default::default(),
    }
}

/// The RunStarted of run `run_id` with `prompt`, delivered `delivery`, under [`config`].
pub fn run_started(run_id: &str, prompt: &str, delivery: Option<&str>) -> RunStarted {
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
