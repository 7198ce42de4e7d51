//! broca-core alone under a simulated world: no executor, no disk, no clock. The run loop's
//! machine and replay are driven by a seeded scheduler that keeps the time (backoffs and
//! silent streams are timeouts on this clock), answers model calls from a scripted model
//! that sometimes fails and sometimes goes silent, runs tool calls with delays, and keeps an
//! in-memory log whose durable prefix is what a crash leaves. A schedule crashes after its
//! `k`th append; the next life replays the durable prefix, resumes the open run, and retries
//! the acknowledged sends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use broca::core::admission::{admit, AdmissionContext, Admitted, SendRequest};
use broca::core::machine::{Command, Event, Outcome, ResumeFrom, RunMachine};
use broca::core::Session;
use broca::protocol::{
    ClassifiedError, ErrorClass, FinishReason, Message, Request, StreamEvent, ToolSpec, Usage,
};
use broca::wal::runrec::ResultBlock;
use broca::wal::Record;

use crate::Rng;

/// What the world does, from a seed.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    /// Tool steps a run asks for before it answers.
    pub tool_steps: usize,
    /// Percent of attempts that fail transiently, and that go silent (a stall).
    pub fail_percent: u64,
    pub stall_percent: u64,
    pub sends: usize,
}

impl Scenario {
    pub fn from_seed(seed: u64) -> Scenario {
        let mut r = Rng(seed);
        Scenario {
            seed,
            tool_steps: 1 + r.below(3) as usize,
            fail_percent: r.below(3) * 10,
            stall_percent: r.below(2) * 10,
            sends: 1 + r.below(2) as usize,
        }
    }
}

/// Why a life ended early.
#[derive(Debug)]
pub struct Crashed;

/// The in-memory log: every record appended, and how many of them are durable.
#[derive(Default, Clone)]
pub struct Log {
    pub records: Vec<(u64, Record)>,
    pub durable: usize,
}

/// What the world saw, across lives.
#[derive(Default)]
pub struct Observed {
    /// Dispatches per tool call id (side effects: at most one each).
    pub dispatched: HashMap<String, u32>,
    /// Sends answered with their run id, in order.
    pub acked: Vec<(String, String)>,
    /// Model calls started.
    pub model_calls: u64,
    /// Timeouts the machine asked for and was handed.
    pub timeouts: u64,
}

/// Something that will happen at a time.
enum Pending {
    Stream(Event),
    Tool(String),
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "echo".into(),
        description: "echo".into(),
        input_schema: serde_json::json!({"type": "object"}),
        route: String::new(),
        reply: None,
    }]
}

/// One life of the simulated actor: the clock, the log, the session, the scheduler.
pub struct Life<'a> {
    pub sc: &'a Scenario,
    pub rng: Rng,
    pub now_ms: u64,
    pub log: Log,
    pub session: Session,
    pub seen: &'a mut Observed,
    /// Crash after this many appends in this life (`None`: run to the end).
    pub crash_after: Option<usize>,
    appends: usize,
    /// The model call in flight (a stale call's events are dropped).
    call: u64,
    queue: BTreeMap<(u64, u64), (u64, Pending)>,
    order: u64,
}

impl<'a> Life<'a> {
    pub fn new(sc: &'a Scenario, seen: &'a mut Observed, log: Log, now_ms: u64) -> Life<'a> {
        let durable: Vec<(u64, Record)> = log.records[..log.durable].to_vec();
        let session = Session::replay(durable.iter().cloned()).expect("the durable prefix replays");
        Life {
            sc,
            rng: Rng(sc.seed ^ now_ms),
            now_ms,
            log: Log {
                durable: durable.len(),
                records: durable,
            },
            session,
            seen,
            crash_after: None,
            appends: 0,
            call: 0,
            queue: BTreeMap::new(),
            order: 0,
        }
    }

    fn at(&mut self, delay_ms: u64, call: u64, p: Pending) {
        self.order += 1;
        self.queue
            .insert((self.now_ms + delay_ms, self.order), (call, p));
    }

    fn append(&mut self, record: Record, wait: bool) -> Result<(), Crashed> {
        let seq = self.log.records.last().map_or(1, |(s, _)| s + 1);
        self.session
            .apply(seq, record.clone())
            .expect("a live record applies");
        self.log.records.push((seq, record));
        // Group commit: a record that waits makes the batch durable; the others become
        // durable with the next sync, or now and then by themselves.
        if wait || self.rng.below(4) == 0 {
            self.log.durable = self.log.records.len();
        }
        self.appends += 1;
        if self.crash_after == Some(self.appends) {
            return Err(Crashed);
        }
        Ok(())
    }

    /// Admits `req`; the send is answered once its RunStarted is durable.
    pub fn send(&mut self, req: &SendRequest) -> Result<Option<String>, Crashed> {
        let catalog = broca::catalog::Catalog::builtin();
        let specs = tools();
        let ctx = AdmissionContext {
            tools: &specs,
            run_id: format!("run{}-{}", self.sc.seed, self.log.records.len() + 1),
            now_unix_ms: self.now_ms,
            catalog: &catalog,
            providers: &broca::protocol::model::AnyProvider,
        };
        match admit(req, &self.session, &ctx).expect("the scenario's sends are valid") {
            Admitted::Existing { run_index } => {
                Ok(Some(self.session.runs[run_index].run_id.clone()))
            }
            Admitted::New(started) => {
                let run_id = started.run_id.clone();
                self.append(Record::RunStarted(started), true)?;
                let send_id = req.send_id.clone().unwrap_or_default();
                self.seen.acked.push((send_id, run_id.clone()));
                Ok(None)
            }
            Admitted::Queued(_)
            | Admitted::Pending { .. }
            | Admitted::Steered(_)
            | Admitted::SteerExisting { .. }
            | Admitted::Ended(_)
            | Admitted::Replacing { .. } => {
                panic!("the scenario sends only to a session with no run active, never a steer or a list")
            }
        }
    }

    /// The machine for the open run: resumed when it was there before this life.
    pub fn machine(&self, resumed: bool) -> Option<RunMachine> {
        let open = self.session.open.clone()?;
        let run = &self.session.runs[open.index];
        let transcript: Vec<Arc<Message>> = self.session.transcript.clone();
        Some(if resumed {
            RunMachine::resume(
                ResumeFrom {
                    run_id: run.run_id.clone(),
                    config: run.config.clone(),
                    transcript,
                    step: open.step,
                    spend: run.spend,
                    last_step: open.last_step,
                    point: open.point,
                    cancel_requested: open.cancel_requested,
                    input: self.session.input,
                    step_seq: open.step_seq,
                    steers: Vec::new(),
                    compacted: self.session.compacted.clone(),
                },
                self.now_ms,
            )
        } else {
            RunMachine::start(
                run.run_id.clone(),
                run.config.clone(),
                transcript,
                self.now_ms,
            )
        })
    }

    /// Drives `m` to its end, or to the planned crash.
    pub fn drive(&mut self, mut m: RunMachine) -> Result<Outcome, Crashed> {
        loop {
            while let Some(cmd) = m.poll_command() {
                match cmd {
                    Command::Append { record, wait } => {
                        let seq = self.log.records.last().map_or(1, |(s, _)| s + 1);
                        let step = matches!(record, Record::StepStarted(_));
                        self.append(record, wait)?;
                        if step {
                            m.step_recorded(seq);
                        }
                        if wait {
                            m.handle(Event::Durable, self.now_ms);
                        }
                    }
                    Command::CallModel { request, .. } => self.call_model(&request),
                    Command::AbortModel => self.call += 1,
                    Command::Dispatch { calls, .. } => {
                        for c in calls {
                            *self.seen.dispatched.entry(c.id.clone()).or_default() += 1;
                            let delay = 1 + self.rng.below(50);
                            self.at(delay, 0, Pending::Tool(c.id));
                        }
                    }
                    Command::Display(_) => {}
                    Command::Finish(outcome) => return Ok(outcome),
                }
            }
            self.next_event(&mut m);
        }
    }

    /// Feeds the earliest of what is due: a stream event, a tool result, or the machine's
    /// own timeout, advancing the clock to it.
    fn next_event(&mut self, m: &mut RunMachine) {
        let timeout = m.poll_timeout().map(|t| t.at_ms);
        let next = self.queue.keys().next().copied();
        match (next, timeout) {
            (Some((at, _)), t) if t.is_none_or(|t| at <= t) => {
                let (_, (call, p)) = self.queue.pop_first().expect("a queued event");
                self.now_ms = self.now_ms.max(at);
                match p {
                    Pending::Stream(ev) if call == self.call => m.handle(ev, self.now_ms),
                    Pending::Stream(_) => {} // an abandoned attempt
                    Pending::Tool(call_id) => m.handle(
                        Event::ToolResult(ResultBlock {
                            call_id: call_id.clone(),
                            content: format!("echo of {call_id}"),
                            is_error: false,
                            reason: None,
                            size: None,
                            parts: Vec::new(),
                        }),
                        self.now_ms,
                    ),
                }
            }
            (_, Some(t)) => {
                self.now_ms = self.now_ms.max(t);
                self.seen.timeouts += 1;
                m.handle_timeout(self.now_ms);
            }
            (None, None) => panic!("seed {}: the machine waits for nothing", self.sc.seed),
            (Some(_), None) => unreachable!("covered by the first arm"),
        }
    }

    /// The scripted model: tool steps until the scenario's count, then an answer; some
    /// attempts fail, some go silent.
    fn call_model(&mut self, request: &Request) {
        self.call += 1;
        self.seen.model_calls += 1;
        let call = self.call;
        let roll = self.rng.below(100);
        if roll < self.sc.fail_percent {
            let error = ClassifiedError {
                class: ErrorClass::Transient,
                message: "overloaded".into(),
                retry_after_ms: Some(1_000),
            };
            let ev = Event::AttemptFailed { error, usage: None };
            self.at(5, call, Pending::Stream(ev));
            return;
        }
        if roll < self.sc.fail_percent + self.sc.stall_percent {
            return; // silent: only the machine's stall timeout ends this attempt
        }
        let results = request
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .filter(|b| matches!(b, broca::protocol::Block::ToolResult { .. }))
            .count();
        let mut evs = Vec::new();
        if results < self.sc.tool_steps {
            let id = format!("call-{}-{results}", self.sc.seed);
            evs.push(StreamEvent::ToolCallStart {
                index: 0,
                id,
                name: "echo".into(),
            });
            evs.push(StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: "{}".into(),
            });
            evs.push(StreamEvent::ToolCallEnd { index: 0 });
        } else {
            evs.push(StreamEvent::TextDelta("done".into()));
        }
        evs.push(StreamEvent::Usage(Usage {
            input: Some(10),
            output: Some(2),
            ..Usage::default()
        }));
        evs.push(StreamEvent::Finish {
            reason: if results < self.sc.tool_steps {
                FinishReason::ToolUse
            } else {
                FinishReason::EndTurn
            },
            request_id: None,
        });
        for (i, ev) in evs.into_iter().enumerate() {
            let ev = Event::Stream(ev);
            self.at(10 + i as u64, call, Pending::Stream(ev));
        }
        let end = Event::StepEnded;
        self.at(20, call, Pending::Stream(end));
    }
}

/// The scenario's sends.
pub fn sends(sc: &Scenario) -> Vec<SendRequest> {
    (0..sc.sends)
        .map(|i| SendRequest {
            prompt: format!("task {i} of seed {}", sc.seed),
            model: "anthropic/sim".into(),
            send_id: Some(format!("send-{i}")),
            max_steps: Some(8),
            ..SendRequest::default()
        })
        .collect()
}

/// Runs every send of the scenario in one life (resuming an open run first).
pub fn live(life: &mut Life<'_>, resumed: bool) -> Result<(), Crashed> {
    if let Some(m) = life.machine(resumed).filter(|_| resumed) {
        life.drive(m)?;
    }
    for req in sends(life.sc) {
        if life.send(&req)?.is_none() {
            let m = life.machine(false).expect("the admitted run is open");
            life.drive(m)?;
        }
    }
    Ok(())
}
