//! The run loop as a sans-IO state machine. It takes events (a record durable, a stream event,
//! a step ended, an attempt failed, a tool result, cancel, shutdown), each with the time it
//! happened, and returns commands (append a record, with or without waiting for durability;
//! call the model; dispatch tools; finish). Time is an input, as in quinn-proto: the machine
//! reads no clock; [`RunMachine::poll_timeout`] says when it next needs to be told the time
//! (a retry's backoff ending, a stream that has been silent too long) and
//! [`RunMachine::handle_timeout`] tells it. The caller performs all I/O and keeps the clock.
//!
//! Per model step: StepStarted, the model call, ModelStepFinished. Per tool step: a durable
//! ToolDispatchIntent (the machine waits for [`Event::Durable`] before it asks for dispatch),
//! then one ToolResult per call as each arrives. The run ends with a durable RunFinished or
//! RunPaused, and then [`Command::Finish`].

use std::collections::VecDeque;
use std::sync::Arc;

use broca_protocol::{
    Block, ClassifiedError, ErrorClass, Message, ProviderRoute, Request, StreamEvent, ToolCall,
    Usage,
};
use broca_wal::runrec::{
    interrupt_cause, result_reason, CachePolicy, CancelRequested, FinishKind, FrozenConfig,
    ModelAttemptFinished, ResultBlock, RunFinished, RunPaused, RunResumed, SpendSummary,
    StepStarted, ToolResult,
};
use broca_wal::Record;

use super::spend::{InputTally, Spend};
use super::stream::StepAccumulator;

mod compact;
mod limits;
mod resume;
mod steer;
pub use steer::Waiting;
mod step_end;
mod stop;
mod submit;
pub use crate::replay::point::{push_result, LastStep, ResumePoint};
pub use resume::ResumeFrom;

/// Model attempts per step, at most (the first try included).
pub const MODEL_ATTEMPTS_MAX: u32 = 5;
/// Total backoff a step may spend on retries.
pub const RETRY_WINDOW_MS: u64 = 60_000;
const BACKOFF_BASE_MS: u64 = 500;
const BACKOFF_CAP_MS: u64 = 16_000;

/// A model stream that sends no event for this long is treated as a failed attempt (a
/// transient one, retried as such): the stall is detected from the times handed in, not by
/// a clock of the machine's own.
pub const STREAM_STALL_MS: u64 = 10 * 60 * 1000;

/// When the machine next needs [`RunMachine::handle_timeout`], and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    /// The time (Unix ms, as the caller keeps it) at which to call back.
    pub at_ms: u64,
    pub kind: TimeoutKind,
}

/// What a timeout is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// A failed attempt's backoff ends: the next attempt starts.
    Backoff,
    /// The stream in flight has been silent for [`STREAM_STALL_MS`].
    StreamStall,
}

/// What happens to the machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The record appended with `wait: true` is durable.
    Durable,
    /// An event of the model stream in flight.
    Stream(StreamEvent),
    /// The model stream ended normally.
    StepEnded,
    /// The model attempt failed, with whatever usage it reported.
    AttemptFailed {
        error: ClassifiedError,
        usage: Option<Usage>,
    },
    /// A dispatched tool call's result.
    ToolResult(ResultBlock),
    /// A dispatched tool call whose outcome cannot be known (delivered, then lost).
    ToolIndeterminate { call_id: String },
    /// The caller cancelled the run: at once.
    Cancel,
    /// The caller cancelled the run at its step boundary: the current model step and its
    /// whole tool batch finish and are recorded, and no further step starts.
    CancelAtStepBoundary,
    /// broca is shutting down: seal the run.
    Shutdown,
    /// A steered send (its `SendSteered` record `seq`, durable) joins the run: its prompt is
    /// rendered at the next step boundary, and a run that would complete takes another step
    /// for it.
    Steer { seq: u64, blocks: Vec<Block> },
    /// A send with an ordered delivery (its `SendSteered` record, durable) waits for the
    /// run's boundaries: it goes out at the first whose possible modes its list names.
    Ordered(steer::Waiting),
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Append `record`; with `wait`, feed [`Event::Durable`] once it is durable.
    Append { record: Record, wait: bool },
    /// Call the model with this request (render it with the frozen renderer).
    CallModel {
        step: u32,
        attempt: u32,
        request: Request,
    },
    /// Stop the model call in flight and drop its output.
    AbortModel,
    /// Dispatch these tool calls concurrently; feed each result as it arrives.
    Dispatch {
        batch_id: String,
        calls: Vec<ToolCall>,
    },
    /// A display-lane delta (lossy, never replayed).
    Display(DisplayDelta),
    /// The run is over; its terminal record is durable.
    Finish(Outcome),
}

/// A display-lane delta of the step in flight: a chunk of one part of the message it
/// streams, named by that message's id (its StepStarted seq; `None` before the caller said
/// it) and the part's index in the message as it will be stored; or a reset (the attempt
/// failed and a new one starts: drop what streamed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisplayDelta {
    Chunk {
        mid: Option<u64>,
        part: u32,
        kind: DeltaKind,
        text: String,
    },
    Reset {
        mid: Option<u64>,
    },
}

/// What a display chunk is part of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaKind {
    Text,
    Reasoning,
    /// A tool call's arguments (its model id).
    ToolInput(String),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// `None` for a paused run.
    pub reason: Option<FinishKind>,
    pub detail: Option<String>,
    pub error: Option<ClassifiedError>,
    pub indeterminate_tool_calls: Vec<String>,
    /// The run's totals (each measure summed over the metered steps that reported it).
    pub usage: Usage,
    /// Metered steps that did not report input or output.
    pub unmeasured_steps: u32,
    /// The run's cost in micro-units of its prices' currency, when measured and priced.
    pub cost_micros: Option<u64>,
}

#[derive(Debug)]
enum Phase {
    /// A model call is in flight.
    Streaming,
    /// Waiting for the retry timer.
    Backoff,
    /// A summary's record was appended; waiting for it to be durable before the requests
    /// carry it.
    AwaitCompaction(crate::compaction::Compacted),
    /// The intent was appended; waiting for it to be durable before dispatching `calls`.
    AwaitIntent {
        batch_id: String,
        calls: Vec<ToolCall>,
    },
    /// Tools dispatched; waiting for their results.
    Tools {
        batch_id: String,
        waiting: Vec<String>,
        indeterminate: Vec<String>,
    },
    /// The terminal record was appended; waiting for it to be durable.
    Sealing(Outcome),
    Done,
}

/// One run's state machine.
pub struct RunMachine {
    run_id: String,
    config: FrozenConfig,
    /// Shared with the session's transcript and with requests in flight.
    transcript: Vec<Arc<Message>>,
    step: u32,
    attempt: u32,
    backoff_spent_ms: u64,
    spend: Spend,
    /// The session's consumed input (its input cap's measure): the earlier runs' and this
    /// run's completed steps.
    input: InputTally,
    /// The budget figures of the stop being sealed, when a budget stopped the run.
    stop_budget: Option<broca_wal::runrec::BudgetStop>,
    last_step: Option<LastStep>,
    /// Whether the attempt in flight has had any answer (a failed attempt that had may have
    /// been billed).
    answered: bool,
    phase: Phase,
    cancel_requested: bool,
    /// A cancel at the step boundary waits: the run ends cancelled before its next step.
    cancel_at_boundary: bool,
    /// Why the run is being sealed interrupted (`interrupt_cause`), when it is.
    pub(crate) interrupt_cause: Option<&'static str>,
    acc: StepAccumulator,
    out: VecDeque<Command>,
    /// The time of the event being handled (Unix ms, as the caller gave it).
    now_ms: u64,
    /// When the backoff of a failed attempt ends (in [`Phase::Backoff`]).
    backoff_until_ms: u64,
    /// When the stream in flight last produced anything (in [`Phase::Streaming`]).
    stream_active_ms: u64,
    /// The seq of the current step's StepStarted record (the assistant message's id), once
    /// the caller said it ([`RunMachine::step_recorded`]).
    step_seq: Option<u64>,
    /// What the run's requests carry for its `structured_output`: the shape the provider
    /// enforces, and the system text with the schema's instruction where nothing enforces it.
    shape: Option<Arc<broca_protocol::OutputShape>>,
    system: Option<String>,
    /// The value a `submit_result` call submitted, validated, once its step ends the run.
    submitted: Option<cortexkit_role_llm_runner::structured_output::StructuredOutputResult>,
    /// Sends waiting for the next step boundary (steers, and ordered sends).
    steers: Vec<steer::Waiting>,
    /// Whether the step before's tool results go out with the next request (a boundary where
    /// `tool_result` is possible).
    fresh_results: bool,
    /// The summary standing in for the older turns, when one does.
    compacted: Option<crate::compaction::Compacted>,
    /// The summary being asked for.
    compacting: Option<compact::Compacting>,
    /// Why this run stopped summarizing (a summary failed): the context limit then ends it.
    compaction_gave_up: Option<String>,
}

impl RunMachine {
    /// A machine for a freshly admitted run whose RunStarted is durable. `transcript` ends
    /// with the run's prompt. Starts the first model step at `now_ms`.
    pub fn start(
        run_id: String,
        config: FrozenConfig,
        transcript: Vec<Arc<Message>>,
        now_ms: u64,
    ) -> RunMachine {
        RunMachine::start_with_steers(
            run_id,
            config,
            transcript,
            None,
            Vec::<Waiting>::new(),
            now_ms,
        )
    }

    fn new(
        run_id: String,
        config: FrozenConfig,
        transcript: Vec<Arc<Message>>,
        step: u32,
        spend: Spend,
        now_ms: u64,
    ) -> RunMachine {
        let input = config
            .stop
            .input_cap
            .map_or(InputTally::default(), |c| InputTally {
                spent: c.spent,
                unmeasured: c.unmeasured,
            });
        let rendering = config
            .structured_output
            .as_ref()
            .map(broca_protocol::structured::rendering);
        let shape = rendering.as_ref().and_then(|r| r.shape.clone());
        let system = match rendering.and_then(|r| r.instruction) {
            Some(i) => Some(match config.system.as_deref().filter(|s| !s.is_empty()) {
                Some(own) => format!("{own}\n\n{i}"),
                None => i,
            }),
            None => config.system.clone(),
        };
        RunMachine {
            shape,
            system,
            submitted: None,
            input,
            now_ms,
            backoff_until_ms: now_ms,
            stream_active_ms: now_ms,
            run_id,
            config,
            transcript,
            step,
            attempt: 0,
            backoff_spent_ms: 0,
            spend,
            stop_budget: None,
            last_step: None,
            answered: false,
            phase: Phase::Backoff,
            cancel_requested: false,
            cancel_at_boundary: false,
            interrupt_cause: None,
            acc: StepAccumulator::default(),
            out: VecDeque::new(),
            step_seq: None,
            steers: Vec::new(),
            fresh_results: false,
            compacted: None,
            compacting: None,
            compaction_gave_up: None,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The conversation so far, as the machine renders it.
    pub fn transcript(&self) -> &[Arc<Message>] {
        &self.transcript
    }

    /// The run's totals so far (each measure summed over the metered steps that reported it).
    pub fn usage(&self) -> Usage {
        self.spend.usage()
    }

    /// What the run has spent so far.
    pub fn spend(&self) -> &Spend {
        &self.spend
    }

    /// Whether [`Command::Finish`] was issued.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The next command to perform, if any.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.out.pop_front()
    }

    /// When the machine next needs [`RunMachine::handle_timeout`], if at all.
    pub fn poll_timeout(&self) -> Option<Timeout> {
        match self.phase {
            Phase::Backoff => Some(Timeout {
                at_ms: self.backoff_until_ms,
                kind: TimeoutKind::Backoff,
            }),
            Phase::Streaming => Some(Timeout {
                at_ms: self.stream_active_ms.saturating_add(STREAM_STALL_MS),
                kind: TimeoutKind::StreamStall,
            }),
            _ => None,
        }
    }

    /// Tells the machine the time: a backoff that ended starts the next attempt; a stream
    /// silent for [`STREAM_STALL_MS`] is abandoned as a failed attempt. Early calls change
    /// nothing.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        self.advance(now_ms);
        let Some(t) = self.poll_timeout() else {
            return;
        };
        if self.now_ms < t.at_ms {
            return;
        }
        match t.kind {
            TimeoutKind::Backoff if self.compacting.is_some() => self.call_compaction(),
            TimeoutKind::Backoff => self.call_model(),
            TimeoutKind::StreamStall => {
                self.out.push_back(Command::AbortModel);
                let error = ClassifiedError {
                    class: ErrorClass::Transient,
                    message: format!(
                        "the model stream sent nothing for {} s; the attempt is abandoned",
                        STREAM_STALL_MS / 1000
                    ),
                    retry_after_ms: None,
                };
                self.on_attempt_failed(error, None);
            }
        }
    }

    /// The caller's clock, never going back.
    fn advance(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// Feeds one event that happened at `now_ms`.
    pub fn handle(&mut self, event: Event, now_ms: u64) {
        self.advance(now_ms);
        match event {
            Event::Durable => self.on_durable(),
            Event::Stream(ev) => self.on_stream(ev),
            Event::StepEnded => self.on_step_ended(),
            Event::AttemptFailed { error, usage } => self.on_attempt_failed(error, usage),
            Event::ToolResult(result) => self.on_tool_result(result),
            Event::ToolIndeterminate { call_id } => self.on_tool_indeterminate(call_id),
            Event::Cancel => self.on_cancel(),
            Event::CancelAtStepBoundary => self.on_cancel_at_boundary(),
            Event::Shutdown => self.on_shutdown(),
            Event::Steer { seq, blocks } => self.on_steer((seq, blocks).into()),
            Event::Ordered(waiting) => self.on_steer(waiting),
        }
    }

    /// The StepStarted record of the current step took `seq` (the caller says so once it
    /// performed its append): that seq names the step's assistant message, which the step's
    /// later records carry.
    pub fn step_recorded(&mut self, seq: u64) {
        assert!(self.step >= 1, "a step was started");
        self.step_seq = Some(seq);
    }

    /// The seq of the current step's StepStarted (the id of the message it streams), once
    /// known.
    pub fn step_seq(&self) -> Option<u64> {
        self.step_seq
    }

    /// The route frozen for tool `name` (empty for a tool the run was not offered).
    fn route_of(&self, name: &str) -> &str {
        self.config
            .tools
            .iter()
            .find(|t| t.name == name)
            .map_or("", |t| t.route.as_str())
    }

    fn push(&mut self, record: Record, wait: bool) {
        assert!(
            !matches!(self.phase, Phase::Sealing(_)),
            "nothing follows a run's terminal record"
        );
        self.out.push_back(Command::Append { record, wait });
    }

    /// Starts the next model step, unless a stop condition says otherwise.
    fn next_step_or_stop(&mut self) {
        if self.cancel_requested || self.cancel_at_boundary {
            return self.seal(FinishKind::Cancelled, None, None, Vec::new());
        }
        if self.step >= self.config.stop.max_steps {
            let detail = format!("the run reached max_steps ({})", self.config.stop.max_steps);
            return self.seal(FinishKind::MaxSteps, Some(detail), None, Vec::new());
        }
        if let Some(stop) = self.limit_before_request() {
            return self.seal_stop(stop);
        }
        if let Some((cut, estimate)) = self.compaction_due() {
            return self.start_compaction(cut, estimate);
        }
        if let Some(stop) = self.context_limit_stop() {
            return self.seal_stop(stop);
        }
        assert!(
            self.step < self.config.stop.max_steps,
            "max_steps was checked"
        );
        self.step += 1;
        self.attempt = 0;
        self.backoff_spent_ms = 0;
        // The waiting sends join the conversation here: after every result of the step before.
        let rendered = self.render_waiting();
        for submission_id in rendered.expired {
            let ended = broca_wal::runrec::SendRetracted {
                submission_id,
                at_unix_ms: self.now_ms,
                ended: Some(broca_wal::runrec::SendEnded::Expired),
            };
            self.push(Record::SendRetracted(ended), false);
        }
        let record = StepStarted {
            run_id: self.run_id.clone(),
            step: self.step,
            at_unix_ms: Some(self.now_ms),
            steers: rendered.steers,
            delivered: rendered.delivered,
        };
        self.step_seq = None;
        self.push(Record::StepStarted(record), false);
        self.call_model();
    }

    fn call_model(&mut self) {
        assert!(self.step >= 1, "a model call belongs to a started step");
        assert!(
            self.attempt < MODEL_ATTEMPTS_MAX,
            "the attempts are bounded"
        );
        self.attempt += 1;
        if self.attempt > 1 {
            // What the failed attempt streamed is dropped: the display starts the step over.
            self.out
                .push_back(Command::Display(DisplayDelta::Reset { mid: self.step_seq }));
        }
        self.acc = StepAccumulator::default();
        self.answered = false;
        self.phase = Phase::Streaming;
        self.stream_active_ms = self.now_ms;
        let request = Request {
            provider: self.config.provider.clone(),
            model: self.config.model.clone(),
            credential_id: self.config.credential_id.clone(),
            system: self.system.clone(),
            messages: self.view(),
            tools: self.config.tools.clone(),
            generation: self.config.generation.clone(),
            prompt_cache: self.config.cache_policy == CachePolicy::Auto,
            // The run's own entry, never the catalog in use now.
            route: self.config.catalog.as_ref().map(|e| ProviderRoute {
                family: e.provider.family.clone(),
                base_url: e.provider.base_url.clone(),
            }),
            shape: self.shape.clone(),
            // Loaded by the session just before the call.
            media: Default::default(),
        };
        self.out.push_back(Command::CallModel {
            step: self.step,
            attempt: self.attempt,
            request,
        });
    }

    fn on_stream(&mut self, ev: StreamEvent) {
        if !matches!(self.phase, Phase::Streaming) {
            return; // a late event of an abandoned attempt
        }
        self.stream_active_ms = self.now_ms;
        self.answered = true;
        if self.compacting.is_some() {
            // A summary's answer is recorded whole, never shown as it streams.
            self.acc.push(ev);
            return;
        }
        let chunk = match &ev {
            StreamEvent::TextDelta(t) => Some((DeltaKind::Text, t.clone(), None)),
            StreamEvent::ThinkingDelta(t) => Some((DeltaKind::Reasoning, t.clone(), None)),
            StreamEvent::ToolCallArgsDelta { index, json } => {
                Some((DeltaKind::Text, json.clone(), Some(*index)))
            }
            _ => None,
        };
        self.acc.push(ev);
        if let Some((kind, text, tool)) = chunk.filter(|c| !c.1.is_empty()) {
            let located = match tool {
                None => self.acc.last_part().map(|p| (p, kind)),
                Some(index) => self
                    .acc
                    .tool_part(index)
                    .map(|(p, id)| (p, DeltaKind::ToolInput(id))),
            };
            if let Some((part, kind)) = located {
                self.out.push_back(Command::Display(DisplayDelta::Chunk {
                    mid: self.step_seq,
                    part,
                    kind,
                    text,
                }));
            }
        }
    }

    /// The record appended with `wait` is durable: only an intent or a terminal record is
    /// appended so, and the caller feeds this right after that append, before anything else.
    fn on_durable(&mut self) {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::AwaitIntent { batch_id, calls } => self.dispatch(batch_id, calls),
            Phase::AwaitCompaction(c) => self.on_compaction_durable(c),
            Phase::Sealing(outcome) => self.out.push_back(Command::Finish(outcome)),
            other => unreachable!("Durable fed in phase {other:?}: no record waited for it"),
        }
    }

    fn dispatch(&mut self, batch_id: String, calls: Vec<ToolCall>) {
        let calls_len = calls.len();
        assert!(calls_len > 0, "an intent names its calls");
        let mut send = Vec::with_capacity(calls.len());
        let mut refused = Vec::new();
        for call in calls {
            match self.refusal(&call) {
                Some(result) => refused.push(result),
                None => send.push(call),
            }
        }
        let waiting: Vec<String> = send.iter().map(|c| c.id.clone()).collect();
        assert_eq!(
            waiting.len() + refused.len(),
            calls_len,
            "each call is sent or refused"
        );
        self.phase = Phase::Tools {
            batch_id: batch_id.clone(),
            waiting,
            indeterminate: Vec::new(),
        };
        if !send.is_empty() {
            self.out.push_back(Command::Dispatch {
                batch_id,
                calls: send,
            });
        }
        for result in refused {
            self.record_result(result);
        }
        self.tools_maybe_done();
    }

    /// The error result a call gets instead of being sent: a tool this run was not offered,
    /// arguments that are not JSON, or arguments its input schema refuses. `None` sends it.
    fn refusal(&self, call: &ToolCall) -> Option<ResultBlock> {
        let refuse = |content: String, reason: &str| ResultBlock {
            call_id: call.id.clone(),
            content,
            is_error: true,
            reason: Some(reason.into()),
            size: None,
            parts: Vec::new(),
        };
        let Some(spec) = self.config.tools.iter().find(|t| t.name == call.name) else {
            return Some(refuse(
                format!(
                    "unknown tool `{}`: it was not offered to this run",
                    call.name
                ),
                result_reason::UNKNOWN_TOOL,
            ));
        };
        if let Some(raw) = super::stream::invalid_arguments(&call.input) {
            return Some(refuse(
                format!("the arguments are not valid JSON: {raw}"),
                result_reason::INVALID_ARGUMENTS,
            ));
        }
        let schema_check = serde_json::from_str::<serde_json::Value>(call.input.get())
            .map_err(|e| e.to_string())
            .and_then(|args| {
                broca_protocol::schema::validate(&spec.input_schema, &args)
                    .map_err(|m| m.to_string())
            });
        let why = schema_check.err()?;
        Some(refuse(
            format!(
                "the arguments do not match the input schema of `{}`: {why}; the tool was \
                 not called",
                call.name
            ),
            result_reason::INVALID_ARGUMENTS,
        ))
    }

    /// Records `result` of the batch in [`Phase::Tools`].
    fn record_result(&mut self, result: ResultBlock) {
        let Phase::Tools { batch_id, .. } = &self.phase else {
            unreachable!("a tool result is recorded only while the tools phase lasts")
        };
        let batch_id = batch_id.clone();
        self.push_result(batch_id, result);
    }

    /// Appends a ToolResult of `batch_id` and puts the result into the transcript.
    fn push_result(&mut self, batch_id: String, result: ResultBlock) {
        let record = ToolResult {
            run_id: self.run_id.clone(),
            batch_id,
            result: result.clone(),
            step_seq: self.step_seq,
            call_key: None,
            schema_pin: None,
            at_unix_ms: Some(self.now_ms),
        };
        self.push(Record::ToolResult(record), false);
        push_result(&mut self.transcript, result);
    }

    /// Takes `call_id` off the calls the batch waits for; false when it was not waiting.
    fn take_waiting(&mut self, call_id: &str) -> bool {
        let Phase::Tools { waiting, .. } = &mut self.phase else {
            return false;
        };
        let Some(i) = waiting.iter().position(|id| id == call_id) else {
            return false;
        };
        waiting.swap_remove(i);
        true
    }

    fn on_tool_result(&mut self, result: ResultBlock) {
        if self.take_waiting(&result.call_id) {
            self.record_result(result);
            self.tools_maybe_done();
        }
    }

    fn on_tool_indeterminate(&mut self, call_id: String) {
        if self.take_waiting(&call_id) {
            if let Phase::Tools { indeterminate, .. } = &mut self.phase {
                indeterminate.push(call_id);
            }
            self.tools_maybe_done();
        }
    }

    fn on_attempt_failed(&mut self, error: ClassifiedError, usage: Option<Usage>) {
        if !matches!(self.phase, Phase::Streaming) {
            return;
        }
        if self.compacting.is_some() {
            return self.on_compaction_attempt_failed(error);
        }
        // Metered when it reported usage or had begun to answer (it may have been billed);
        // an attempt refused before any answer was not.
        if usage.is_some() || self.answered {
            let prices = self.prices().cloned();
            self.spend
                .add(self.step, self.attempt, usage.as_ref(), prices.as_ref());
        }
        let record = ModelAttemptFinished {
            run_id: self.run_id.clone(),
            step: self.step,
            attempt: self.attempt,
            error: error.clone(),
            usage,
            answered: self.answered,
            at_unix_ms: Some(self.now_ms),
        };
        self.push(Record::ModelAttemptFinished(record), false);
        match error.class {
            ErrorClass::Transient => {
                assert!(self.attempt >= 1, "a failed attempt was made");
                let backoff = (BACKOFF_BASE_MS << (self.attempt - 1).min(10)).min(BACKOFF_CAP_MS);
                let wait = error.retry_after_ms.unwrap_or(0).max(backoff);
                if self.attempt < MODEL_ATTEMPTS_MAX
                    && self.backoff_spent_ms + wait <= RETRY_WINDOW_MS
                {
                    self.backoff_spent_ms += wait;
                    assert!(self.backoff_spent_ms <= RETRY_WINDOW_MS);
                    self.phase = Phase::Backoff;
                    self.backoff_until_ms = self.now_ms.saturating_add(wait);
                } else {
                    let detail = format!("the model call failed {} times; giving up", self.attempt);
                    self.seal(FinishKind::Error, Some(detail), Some(error), Vec::new());
                }
            }
            ErrorClass::AuthRequired => self.pause("auth_required", error),
            ErrorClass::ContextOverflow => {
                // A run that summarizes makes room and tries the step again.
                if self.compact_within_step() {
                    return;
                }
                let detail = "the provider refused the request as too long".to_string();
                self.seal(
                    FinishKind::ContextLimit,
                    Some(detail),
                    Some(error),
                    Vec::new(),
                )
            }
            ErrorClass::Permanent => self.seal(FinishKind::Error, None, Some(error), Vec::new()),
        }
    }
}
