//! A run driven by its session's actor: the machine's commands performed (appends, the model
//! call, tool dispatch, display) and its events fed back with the time they arrived. The model
//! stream and the tools run as tasks that report into one channel, so the loop also answers the
//! session's commands while a run is active.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use glommio::channels::local_channel;

use broca_core::machine::{Command, Event, Outcome, RunMachine, Timeout, TimeoutKind};
use broca_protocol::model::{Failure, ModelClient, ModelStream};
use broca_protocol::ToolCall;
use broca_shards::registry::Msg;
use broca_tools::{ToolOrigin, ToolOutcome, ToolRunner};
use broca_wal::runrec::{result_reason, ResultBlock, ToolDispatchIntent};
use broca_wal::Record;

use crate::actor::{ActorError, SessionActor};
use crate::command::SessionCommand;

/// Inputs queued for the drive loop at most (the model stream's task waits beyond it). A
/// bounded channel preallocates its queue, so this stays small: it is per active run.
const INPUT_QUEUE: usize = 4;

/// The model-visible limit of a tool module's answer (tool-provider/v1's 64 KiB measure).
const TOOL_RESULT_LIMIT: u64 = cortexkit_role_tool_provider::result::MAX_MODEL_VISIBLE_BYTES as u64;

/// What the drive loop waits for.
enum Input {
    /// An item of model call `call`: an event, the attempt's failure, or `None` at the end.
    Model {
        call: u64,
        item: Option<Result<broca_protocol::StreamEvent, Failure>>,
    },
    Tool {
        call_id: String,
        outcome: ToolOutcome,
        /// The parts of an answer in parts (its images kept).
        parts: Vec<broca_wal::runrec::ResultPart>,
    },
    /// The compaction provider's answer to the ride model call `call` waits on.
    Ride {
        call: u64,
        answer: crate::compactor::RideOutcome,
    },
}

/// What a running run has out: the model call in flight (a stale call's events are ignored and
/// its task stops) and the tool calls not yet answered.
struct InFlight {
    tx: Rc<local_channel::LocalSender<Input>>,
    call: Rc<Cell<u64>>,
    streaming: bool,
    tools: usize,
    /// The calls of the last dispatch intent, in its order: a dispatched call takes the key
    /// of the first of its id not yet sent, a result the facts of the first not yet answered.
    batch: Vec<Intended>,
    /// The compaction view the step in flight renders through (a retry keeps it).
    view: crate::view::StepView,
    /// The model request waiting on its compaction provider's ride, with its step.
    riding: Option<(crate::compactor::Riding, broca_protocol::Request, u32)>,
}

/// A call of the last dispatch intent: its model id, key and schema pin as the intent
/// recorded them, and whether it was sent and answered.
struct Intended {
    id: String,
    key: String,
    pin: Option<String>,
    sent: bool,
    answered: bool,
}

enum Next {
    Input(Option<Input>),
    Command(Option<Msg<SessionCommand>>),
    /// The machine's timeout came: tell it this time.
    Timeout(u64),
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Performs the machine's commands until it finishes; the machine's timeout (a backoff, a
    /// silent stream) is slept on beside the inputs, and the clock read here is the time
    /// handed to the machine with every event.
    pub(crate) async fn drive(&mut self, mut m: RunMachine) -> Result<Outcome, ActorError> {
        let (tx, rx) = local_channel::new_bounded::<Input>(INPUT_QUEUE);
        let mut calls = InFlight {
            tx: Rc::new(tx),
            call: Rc::new(Cell::new(0)),
            streaming: false,
            tools: 0,
            batch: Vec::new(),
            view: Default::default(),
            riding: None,
        };
        loop {
            while let Some(cmd) = m.poll_command() {
                if let Some(outcome) = self.perform(cmd, &mut m, &mut calls).await? {
                    return Ok(outcome);
                }
            }
            let timeout = m.poll_timeout();
            let stalled = ActorError::Stalled {
                run_id: m.run_id().to_string(),
            };
            // A ride waits as part of the model call it precedes (`streaming` holds meanwhile).
            if !calls.streaming && timeout.is_none() && calls.tools == 0 && !m.is_done() {
                return Err(stalled);
            }
            match self.next(&rx, timeout).await {
                Next::Timeout(at_ms) => m.handle_timeout(at_ms),
                Next::Input(Some(Input::Ride { call, answer })) => {
                    Box::pin(self.ride_came(call, answer, &mut m, &mut calls)).await
                }
                Next::Input(Some(input)) => feed(&mut m, input, &mut calls, &*self.hooks),
                Next::Input(None) => return Err(stalled),
                Next::Command(Some(Msg::Command(cmd))) => {
                    // Boxed: a rare path, kept out of every active run's future.
                    let after = Box::pin(self.answer(cmd, Some(&mut m))).await;
                    // A failed WAL meets the run at its next append.
                    assert!(
                        matches!(after, crate::After::Serve | crate::After::Close),
                        "a command during a run starts nothing and waits for no rest: {after:?}"
                    );
                }
                // Only an idle session closes to make room.
                Next::Command(Some(Msg::Close)) => {}
                Next::Command(Some(Msg::Shutdown)) => {
                    m.handle(Event::Shutdown, crate::now_unix_ms())
                }
                Next::Command(None) => {
                    // Whoever sends commands is gone (the daemon stops): seal the run.
                    self.inbox = None;
                    m.handle(Event::Shutdown, crate::now_unix_ms());
                }
            }
        }
    }

    /// Performs one of the machine's commands; the outcome once the run is over.
    async fn perform(
        &mut self,
        cmd: Command,
        m: &mut RunMachine,
        calls: &mut InFlight,
    ) -> Result<Option<Outcome>, ActorError> {
        match cmd {
            Command::Append { mut record, wait } => {
                match &mut record {
                    Record::ToolDispatchIntent(intent) => calls.batch = self.stamp_keys(intent),
                    Record::ToolResult(r) => stamp_result(&mut calls.batch, r),
                    Record::StepStarted(_) => calls.batch.clear(),
                    _ => {}
                }
                let seq = self.writer.next_seq();
                let step = matches!(record, Record::StepStarted(_));
                // Boxed: the append's state lives only while it runs, not in the future every
                // active run keeps while it waits for its model.
                Box::pin(self.append(record, wait)).await?;
                if step {
                    m.step_recorded(seq);
                }
                if wait {
                    m.handle(Event::Durable, crate::now_unix_ms());
                }
            }
            Command::CallModel { request, step, .. } => self.call_model(request, step, calls),
            Command::AbortModel => {
                calls.call.set(calls.call.get() + 1);
                calls.streaming = false;
                calls.riding = None;
            }
            Command::Dispatch { calls: batch, .. } => self.dispatch(batch, calls),
            Command::Display(delta) => self.watch.display(&delta),
            Command::Finish(outcome) => {
                calls.call.set(calls.call.get() + 1);
                self.state.refresh_unresolved();
                return Ok(Some(outcome));
            }
        }
        Ok(None)
    }

    /// Calls the model with `request` (rendered through the step's view), or first rides
    /// the compaction provider: the ride is one more input of this loop (a cancel, a steer or
    /// a read is answered while it waits, and an abandoned ride's answer is dropped).
    fn call_model(
        &mut self,
        mut request: broca_protocol::Request,
        step: u32,
        calls: &mut InFlight,
    ) {
        assert!(!calls.streaming, "one model call at a time");
        self.through_view(&mut request, step, &mut calls.view);
        calls.call.set(calls.call.get() + 1);
        calls.streaming = true;
        match self.ride_due(&request) {
            Some((riding, ride)) => {
                calls.riding = Some((riding, request, step));
                let (me, tx) = (calls.call.get(), calls.tx.clone());
                glommio::spawn_local(async move {
                    let answer = ride.await;
                    let _ = tx.send(Input::Ride { call: me, answer }).await;
                })
                .detach();
            }
            None => self.spawn_model(request, calls.call.clone(), calls.tx.clone()),
        }
    }

    /// Dispatches a batch of tool calls, each with the key its intent recorded.
    fn dispatch(&mut self, batch: Vec<ToolCall>, calls: &mut InFlight) {
        assert!(!batch.is_empty(), "a dispatch carries calls");
        assert_eq!(
            calls.tools, 0,
            "a batch is dispatched once the last one answered"
        );
        calls.tools += batch.len();
        for c in batch {
            let route = self.route_of(&c.name);
            let Some(intended) = calls.batch.iter_mut().find(|i| i.id == c.id && !i.sent) else {
                unreachable!("a dispatched call is in its intent")
            };
            intended.sent = true;
            let key = intended.key.clone();
            self.spawn_tool(c, route, key, calls.tx.clone());
        }
    }

    /// The next thing a running run must hear of: a model event or a tool's answer, a
    /// command for the session, or the machine's timeout.
    async fn next(
        &self,
        rx: &local_channel::LocalReceiver<Input>,
        timeout: Option<Timeout>,
    ) -> Next {
        let wake = self.sleep_until(timeout);
        match self.inbox.clone() {
            Some(inbox) => {
                futures_lite::future::or(
                    futures_lite::future::or(async { Next::Input(rx.recv().await) }, async {
                        Next::Command(inbox.recv().await)
                    }),
                    wake,
                )
                .await
            }
            None => futures_lite::future::or(async { Next::Input(rx.recv().await) }, wake).await,
        }
    }

    /// The ride the model call `call` waits on answered: the request goes out (through a view
    /// it brought), or, over the usable window even so, the turn ends at the ceiling and
    /// nothing goes out (cortexkit-role-compaction RD4). The answer of a call since abandoned
    /// (a cancel) is dropped.
    async fn ride_came(
        &mut self,
        call: u64,
        answer: crate::compactor::RideOutcome,
        m: &mut RunMachine,
        calls: &mut InFlight,
    ) {
        if call != calls.call.get() {
            return;
        }
        let Some((riding, mut request, step)) = calls.riding.take() else {
            return;
        };
        let answered = self
            .ride_answered(riding, answer, &mut request, step, &mut calls.view)
            .await;
        match answered {
            Ok(()) => {
                calls.call.set(calls.call.get() + 1);
                self.spawn_model(request, calls.call.clone(), calls.tx.clone());
            }
            Err(why) => {
                calls.call.set(calls.call.get() + 1);
                calls.streaming = false;
                let error = broca_protocol::ClassifiedError {
                    class: broca_protocol::ErrorClass::ContextOverflow,
                    message: why.to_string(),
                    retry_after_ms: None,
                };
                m.handle(
                    Event::AttemptFailed { error, usage: None },
                    crate::now_unix_ms(),
                );
            }
        }
    }

    /// Resolves at the machine's timeout with the time to hand it: a backoff's end (scaled by
    /// the test timer setting, the machine told its own deadline), or the real time of a
    /// silent stream's deadline. Never, without a timeout.
    fn sleep_until(&self, timeout: Option<Timeout>) -> impl std::future::Future<Output = Next> {
        let permille = self.timer_permille;
        async move {
            let Some(t) = timeout else {
                return futures_lite::future::pending().await;
            };
            let left_ms = t.at_ms.saturating_sub(crate::now_unix_ms());
            match t.kind {
                TimeoutKind::Backoff => {
                    let scaled_ms = left_ms.saturating_mul(permille) / 1000;
                    glommio::timer::sleep(Duration::from_millis(scaled_ms)).await;
                    Next::Timeout(t.at_ms.max(crate::now_unix_ms()))
                }
                TimeoutKind::StreamStall => {
                    glommio::timer::sleep(Duration::from_millis(left_ms)).await;
                    Next::Timeout(crate::now_unix_ms())
                }
            }
        }
    }

    fn spawn_model(
        &self,
        request: broca_protocol::Request,
        call: Rc<Cell<u64>>,
        tx: Rc<local_channel::LocalSender<Input>>,
    ) {
        let provider = self.provider.clone();
        let me = call.get();
        let store = self.content();
        let (family, facts) = self
            .open_run()
            .map(|r| (r.config.family().to_string(), r.config.input_facts()))
            .unwrap_or_default();
        glommio::spawn_local(async move {
            let mut request = request;
            // The attachments' bytes, read just before the call (a request of text alone
            // reads nothing).
            match crate::uploads::load_media(store, &family, &facts, &request).await {
                Ok(media) => request.media = media,
                Err(why) => {
                    let error = broca_protocol::ClassifiedError {
                        class: broca_protocol::ErrorClass::Permanent,
                        message: format!("an attachment cannot be read: {why}"),
                        retry_after_ms: None,
                    };
                    let item = Some(Err(broca_protocol::model::Failure { error, usage: None }));
                    let _ = tx.send(Input::Model { call: me, item }).await;
                    return;
                }
            }
            // Boxed: opening (render, connect, send) needs more state than streaming does, and
            // the task keeps the larger of the two for its whole life otherwise.
            let opened = Box::pin(provider.open(&request)).await;
            drop(request);
            let mut stream = match opened {
                Ok(s) => s,
                Err(f) => {
                    let item = Some(Err(f));
                    let _ = tx.send(Input::Model { call: me, item }).await;
                    return;
                }
            };
            // Stops reading once the call is abandoned (aborted, or the run ended).
            while call.get() == me {
                let item = stream.next().await;
                let last = !matches!(item, Some(Ok(_)));
                if tx.send(Input::Model { call: me, item }).await.is_err() || last {
                    return;
                }
            }
        })
        .detach();
    }

    /// The open run's id and config (a run being driven is the open one).
    fn open_run(&self) -> Option<&broca_core::RunView> {
        let open = self.state.open.as_ref()?;
        self.state.runs.get(open.index)
    }

    /// The route frozen for tool `name` in the active run's config (empty when none).
    fn route_of(&self, name: &str) -> String {
        self.open_run()
            .and_then(|run| run.config.tools.iter().find(|t| t.name == name))
            .map(|t| t.route.clone())
            .unwrap_or_default()
    }

    /// The reply deadline metadata the run froze with tool `name`, if it has any.
    fn reply_of(&self, name: &str) -> Option<serde_json::Value> {
        self.open_run()
            .and_then(|run| run.config.tools.iter().find(|t| t.name == name))
            .and_then(|t| t.reply.clone())
    }

    /// Mints the keys of `intent`'s calls into it (what only the session knows: its triple);
    /// answers the batch's calls as the intent records them.
    fn stamp_keys(&self, intent: &mut ToolDispatchIntent) -> Vec<Intended> {
        assert!(
            intent.call_keys.is_empty(),
            "an intent's keys are minted once"
        );
        intent.call_keys = intent
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| broca_core::call_key(&self.triple, &intent.batch_id, i, &c.id))
            .collect();
        intent
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| Intended {
                id: c.id.clone(),
                key: intent.call_keys[i].clone(),
                pin: intent.schema_pin(i).map(str::to_string),
                sent: false,
                answered: false,
            })
            .collect()
    }

    fn spawn_tool(
        &self,
        call: ToolCall,
        route: String,
        call_key: String,
        tx: Rc<local_channel::LocalSender<Input>>,
    ) {
        let tools = self.tools.clone();
        let origin = ToolOrigin {
            triple: self.triple.clone(),
            run_id: self
                .open_run()
                .map(|r| r.run_id.clone())
                .unwrap_or_default(),
            call_key,
            scope_epoch: self.writer.header().created_unix_ms,
            reply: self.reply_of(&call.name),
        };
        let store = self.content();
        glommio::spawn_local(async move {
            let call_id = call.id.clone();
            let outcome = tools.call(call, route, origin).await;
            // An answer in parts: its images kept (durable) before its result is recorded.
            let (outcome, parts) = match outcome {
                ToolOutcome::Parts { parts, is_error } => {
                    match crate::uploads::keep_tool_parts(store, parts).await {
                        Ok((content, parts)) => (ToolOutcome::Done { content, is_error }, parts),
                        Err(why) => (
                            ToolOutcome::Done {
                                content: format!(
                                    "the tool answered with images that could not be kept: {why}"
                                ),
                                is_error: true,
                            },
                            Vec::new(),
                        ),
                    }
                }
                other => (other, Vec::new()),
            };
            // The run may have ended (crash injected): then nobody listens, and that is fine.
            let _ = tx
                .send(Input::Tool {
                    call_id,
                    outcome,
                    parts,
                })
                .await;
        })
        .detach();
    }
}

/// Puts on a result the key and pin its call's intent recorded (a result of a call the
/// intent does not hold, one a stop never sent, gets none).
fn stamp_result(batch: &mut [Intended], r: &mut broca_wal::runrec::ToolResult) {
    if let Some(i) = batch
        .iter_mut()
        .find(|i| i.id == r.result.call_id && !i.answered)
    {
        i.answered = true;
        r.call_key = Some(i.key.clone());
        r.schema_pin = i.pin.clone();
    }
}

/// Says on the log that a model attempt failed (its partial output, if any, is dropped).
fn log_failed_attempt(run_id: &str, error: &broca_protocol::ClassifiedError) {
    let class = error.class.as_str();
    if error.class == broca_protocol::ErrorClass::Transient {
        tracing::warn!(run_id, "model attempt failed ({class}); its output is dropped and the call retried if attempts remain: {}", error.message);
    } else {
        tracing::warn!(run_id, "model attempt failed ({class}): {}", error.message);
    }
}

/// Feeds one input to the machine, with the time it arrived.
fn feed(m: &mut RunMachine, input: Input, calls: &mut InFlight, hooks: &dyn crate::Hooks) {
    let now = crate::now_unix_ms();
    match input {
        Input::Model { call, item } if call == calls.call.get() => match item {
            Some(Ok(ev)) => m.handle(Event::Stream(ev), now),
            Some(Err(f)) => {
                calls.streaming = false;
                log_failed_attempt(m.run_id(), &f.error);
                let event = Event::AttemptFailed {
                    error: f.error,
                    usage: f.usage,
                };
                m.handle(event, now);
            }
            None => {
                calls.streaming = false;
                m.handle(Event::StepEnded, now);
            }
        },
        Input::Model { .. } => {} // an abandoned call
        Input::Ride { .. } => {}  // answered by the loop (`ride_came`)
        Input::Tool {
            call_id,
            outcome,
            parts,
        } => {
            hooks.tool_answered();
            assert!(calls.tools > 0, "an answer comes for a call dispatched");
            calls.tools -= 1;
            m.handle(tool_event(call_id, outcome, parts), now);
        }
    }
}

/// The machine's event for a tool call's outcome.
fn tool_event(
    call_id: String,
    outcome: ToolOutcome,
    parts: Vec<broca_wal::runrec::ResultPart>,
) -> Event {
    let refused = |content: String, reason: &str, size| {
        Event::ToolResult(ResultBlock {
            call_id: call_id.clone(),
            content,
            is_error: true,
            reason: Some(reason.into()),
            size,
            parts: Vec::new(),
        })
    };
    match outcome {
        ToolOutcome::Done { content, is_error } => Event::ToolResult(ResultBlock {
            call_id,
            content,
            is_error,
            reason: None,
            size: None,
            parts,
        }),
        // Kept by the call's task (`keep_tool_parts`) before it reached here.
        ToolOutcome::Parts { is_error, .. } => Event::ToolResult(ResultBlock {
            call_id,
            content: "the tool's answer in parts was not kept".into(),
            is_error,
            reason: None,
            size: None,
            parts: Vec::new(),
        }),
        ToolOutcome::TooLarge { bytes } => refused(
            format!(
                "{} ({bytes} bytes; the limit is {TOOL_RESULT_LIMIT})",
                cortexkit_role_llm_runner::tool_result_limit::OUTPUT_DISCARDED
            ),
            result_reason::TOOL_RESULT_TOO_LARGE,
            Some(broca_wal::runrec::ResultSize {
                bytes,
                limit: TOOL_RESULT_LIMIT,
            }),
        ),
        ToolOutcome::Refused { reason } => refused(
            format!("not run: refused before delivery: {reason}"),
            result_reason::REFUSED_BEFORE_DELIVERY,
            None,
        ),
        ToolOutcome::Indeterminate => Event::ToolIndeterminate { call_id },
    }
}
