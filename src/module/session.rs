//! The session actor: opens the session's WAL (taking its writer lease), replays it, resumes a
//! run a crash left open, admits sends and drives their runs. Commands are processed in order
//! because the actor is driven through `&mut self`.

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use broca_io::{Committer, LogConfig};
use futures_channel::oneshot;
use glommio::channels::local_channel;

use broca_core::admission::{
    admit_prepared, admit_unprepared, Admitted, Prepared, Refusal, SendRequest, Unprepared,
};
use broca_core::machine::{Command, Event, Outcome, ResumeFrom, RunMachine, Timeout, TimeoutKind};
use broca_core::replay::{RunView, Session};
use broca_protocol::{ToolCall, ToolSpec};
use broca_wal::runrec::result_reason;
use broca_wal::runrec::ResultBlock;
use broca_wal::{Record, SessionTriple, WalError};
use broca_wal_writer::WalWriter;

use super::{ModelClient, ModelStream, ToolOutcome, ToolRunner};

#[path = "import.rs"]
mod import;

#[path = "queue.rs"]
mod queue;
pub use import::{
    check_read_only, import_error, log_files, read_source, ImportInput, ImportReply, ImportTarget,
    IMPORT_BYTES_MAX,
};
pub use queue::{Cancelled, Retracted};

/// Why an actor operation failed.
#[derive(Debug)]
pub enum ActorError {
    /// The WAL failed (its error names the file).
    Wal(WalError),
    /// The WAL's records do not replay (names the file and the seq).
    Replay(broca_core::ReadError),
    /// The send was refused; nothing was written.
    Refused(Refusal),
    /// A crash was injected here (tests only): after the append of `seq`.
    Crashed { seq: u64 },
    /// The run loop stopped without an event to wait for (a bug; the run stays open and is
    /// resumed on the next open).
    Stalled(String),
    /// An import was refused; nothing was written.
    Import(broca_import::ImportError),
}

impl std::fmt::Display for ActorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorError::Wal(e) => write!(f, "{e}"),
            ActorError::Replay(e) => write!(f, "{e}"),
            ActorError::Refused(r) => write!(f, "{r}"),
            ActorError::Crashed { seq } => write!(f, "crash injected after record {seq}"),
            ActorError::Stalled(run) => write!(f, "run {run}: the run loop stalled"),
            ActorError::Import(e) => write!(f, "{e}"),
        }
    }
}

impl ActorError {
    /// The management error for this failure: a refusal keeps its code; anything else is
    /// an internal error naming what failed.
    pub fn to_rpc_error(&self) -> broca_wire::RpcError {
        match self {
            ActorError::Refused(r) => broca_wire::RpcError::refusal(r),
            ActorError::Import(e) => import::import_error(e),
            other => broca_wire::RpcError::new(broca_wire::Code::Internal, other.to_string()),
        }
    }
}

impl From<WalError> for ActorError {
    fn from(e: WalError) -> ActorError {
        ActorError::Wal(e)
    }
}

/// Test hooks: where to stop as if the process died.
#[derive(Debug, Clone, Copy, Default)]
pub struct CrashPlan {
    /// Stop right after this many appends (counted from the open, the lease record excluded).
    pub after_appends: Option<u64>,
    /// Whether that append is made durable before stopping (else it may be lost or torn).
    pub durable: bool,
}

/// The answer to a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReply {
    /// The run the send started or named (empty for a queued send).
    pub run_id: String,
    /// True when the send_id named an existing run (or queued send) and nothing was written.
    pub existing: bool,
    /// The queued send's submission, when the send waits for the active run to end.
    pub pending: Option<String>,
}

/// One live session.
pub struct SessionActor<P: ModelClient, T: ToolRunner> {
    writer: WalWriter,
    state: Session,
    provider: Rc<P>,
    tools: Rc<T>,
    tool_specs: Arc<[ToolSpec]>,
    /// The session's triple, handed to tool calls with the run's id.
    triple: Rc<SessionTriple>,
    crash: CrashPlan,
    appends: u64,
    display: Option<Box<dyn FnMut(&str)>>,
    /// Timers sleep `after_ms * timer_permille / 1000` (tests shorten backoffs).
    timer_permille: u64,
    /// Commands answered while a run is active (serve).
    inbox: Option<Rc<local_channel::LocalReceiver<SessionCommand>>>,
    /// Told of every record appended: its seq, the log end after it, the record.
    on_append: Option<Box<dyn FnMut(u64, u64, &Record)>>,
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Opens the session in `wal_dir`: takes the lease, recovers the log and replays it. A
    /// run left open by a crash is not driven yet: call [`SessionActor::resume`].
    pub async fn open(
        wal_dir: &Path,
        triple: &SessionTriple,
        provider: Rc<P>,
        tools: Rc<T>,
        tool_specs: impl Into<Arc<[ToolSpec]>>,
        log: LogConfig,
        committer: Committer,
    ) -> Result<Self, ActorError> {
        let (writer, recovered) = WalWriter::open(wal_dir, triple, log, committer).await?;
        // Replay decodes on the blocking pool (with threads of its own for long logs), never
        // on this shard's executor; the file's bytes are freed once it is done.
        let replayed = glommio::executor()
            .spawn_blocking(move || match &recovered.scan {
                None => Ok(Session::default()),
                Some(scan) => Session::replay_scan(scan, &recovered.bytes),
            })
            .await;
        let state = replayed.map_err(|error| {
            ActorError::Replay(broca_core::ReadError::Replay {
                path: writer.path().to_path_buf(),
                error,
            })
        })?;
        Ok(SessionActor {
            writer,
            state,
            provider,
            tools,
            tool_specs: tool_specs.into(),
            triple: Rc::new(triple.clone()),
            crash: CrashPlan::default(),
            appends: 0,
            display: None,
            timer_permille: 1000,
            inbox: None,
            on_append: None,
        })
    }

    /// Sets the crash plan (tests).
    pub fn set_crash_plan(&mut self, plan: CrashPlan) {
        self.crash = plan;
    }

    /// Scales every timer the run loop arms (tests: 0 makes backoffs instant).
    pub fn set_timer_permille(&mut self, permille: u64) {
        self.timer_permille = permille;
    }

    /// Receives the display lane's text deltas.
    pub fn set_display(&mut self, sink: Box<dyn FnMut(&str)>) {
        self.display = Some(sink);
    }

    /// The session as replayed and as appended since.
    pub fn state(&self) -> &Session {
        &self.state
    }

    /// The WAL writer.
    pub fn writer(&self) -> &WalWriter {
        &self.writer
    }

    /// Resumes the run a crash left open, if any, and drives it to its end.
    pub async fn resume(&mut self) -> Result<Option<(String, Outcome)>, ActorError> {
        let Some(open) = self.state.open.clone() else {
            return Ok(None);
        };
        let run = &self.state.runs[open.index];
        let run_id = run.run_id.clone();
        let catalog = broca_catalog::current();
        let now = crate::now_unix_ms();
        let from = ResumeFrom {
            run_id: run_id.clone(),
            config: run.config.clone(),
            transcript: self.state.transcript.clone(),
            step: open.step,
            spend: run.spend,
            last_step: open.last_step,
            point: open.point,
            cancel_requested: open.cancel_requested,
            input: self.state.input,
        };
        if let Err(why) = broca_core::admission::check_resumable(&run.config, &catalog) {
            // Never re-render an admitted run differently: seal it with the reason.
            let machine = RunMachine::refuse_resume(from, why, now);
            let outcome = self.drive(machine).await?;
            return Ok(Some((run_id, outcome)));
        }
        let machine = RunMachine::resume(from, now);
        let outcome = self.drive(machine).await?;
        Ok(Some((run_id, outcome)))
    }

    /// Admits a send: refuses it (writing nothing), answers an existing run for a repeated
    /// send_id (writing nothing), or makes RunStarted durable and answers the new run.
    pub async fn send(&mut self, req: &SendRequest) -> Result<SendReply, ActorError> {
        let catalog = broca_catalog::current();
        let admission =
            broca_core::admission::prepare(req, &self.tool_specs, &catalog, self.provider.check());
        self.send_prepared(admission).await
    }

    /// The session's part of admitting a send whose own part ran already ([`prepare`]):
    /// the same answers as [`SessionActor::send`], admission not run twice.
    ///
    /// [`prepare`]: broca_core::admission::prepare
    pub async fn send_prepared(
        &mut self,
        admission: Result<Prepared, Unprepared>,
    ) -> Result<SendReply, ActorError> {
        let admitted = match admission {
            Ok(p) => {
                let run_id = format!(
                    "run_{}_{}",
                    &self.writer.header().lineage_hex()[..12],
                    self.writer.next_seq()
                );
                admit_prepared(p, &self.state, run_id, crate::now_unix_ms())
            }
            Err(u) => admit_unprepared(&u, &self.state),
        };
        match admitted.map_err(ActorError::Refused)? {
            Admitted::Existing { run_index } => Ok(SendReply {
                run_id: self.state.runs[run_index].run_id.clone(),
                existing: true,
                pending: None,
            }),
            Admitted::Pending { submission_id } => Ok(SendReply {
                run_id: String::new(),
                existing: true,
                pending: Some(submission_id),
            }),
            Admitted::New(started) => {
                let run_id = started.run_id.clone();
                self.append(Record::RunStarted(started), true).await?;
                Ok(SendReply {
                    run_id,
                    existing: false,
                    pending: None,
                })
            }
            Admitted::Queued(queued) => {
                let submission_id = queued.submission_id.clone();
                self.append(Record::SendQueued(queued), true).await?;
                Ok(SendReply {
                    run_id: String::new(),
                    existing: false,
                    pending: Some(submission_id),
                })
            }
        }
    }

    /// Drives the run just admitted by [`SessionActor::send`] to its end.
    pub async fn run_admitted(&mut self) -> Result<Outcome, ActorError> {
        let Some(open) = self.state.open.clone() else {
            return Err(ActorError::Stalled("no admitted run".into()));
        };
        let run = &self.state.runs[open.index];
        let machine = RunMachine::start(
            run.run_id.clone(),
            run.config.clone(),
            self.state.transcript.clone(),
            crate::now_unix_ms(),
        );
        self.drive(machine).await
    }

    /// Appends a record, applies it to the session state, and honours the crash plan. A record
    /// nothing waits for is deferred: it shares the fdatasync of the next one waited for (a
    /// tool step's result and the next step's start ride on that step's tool intent), so a
    /// tool step costs one fdatasync.
    async fn append(&mut self, record: Record, wait: bool) -> Result<(), ActorError> {
        let appended = if wait {
            self.writer.append(&record).await?
        } else {
            self.writer.append_deferred(&record).await?
        };
        match super::crash::due(&record) {
            None | Some(super::crash::Abort::AfterAction) => {}
            Some(super::crash::Abort::WhenDurable) => {
                // A crash test asked for the process to die right after this boundary is
                // durable.
                self.writer.wait_durable(appended.end).await?;
                super::crash::abort_now(&record);
            }
            Some(super::crash::Abort::Now) => super::crash::abort_now(&record),
        }
        if let Some(hook) = &mut self.on_append {
            hook(appended.seq, appended.end, &record);
        }
        self.state.apply(appended.seq, record).map_err(|reason| {
            ActorError::Replay(broca_core::ReadError::Replay {
                path: self.writer.path().to_path_buf(),
                error: broca_core::ReplayError {
                    seq: appended.seq,
                    reason,
                },
            })
        })?;
        self.appends += 1;
        let crash_now = self.crash.after_appends == Some(self.appends);
        if wait || (crash_now && self.crash.durable) {
            self.writer.wait_durable(appended.end).await?;
        }
        if crash_now {
            return Err(ActorError::Crashed { seq: appended.seq });
        }
        Ok(())
    }

    /// Performs the machine's commands until it finishes. The model stream and the tools run
    /// as tasks that report into one channel, so the loop also answers the session's commands
    /// (status, cancel, shutdown, a busy send) while a run is active; the machine's timeout
    /// (a backoff, a silent stream) is slept on beside them, and the clock read here is the
    /// time handed to the machine with every event.
    async fn drive(&mut self, mut m: RunMachine) -> Result<Outcome, ActorError> {
        let (tx, rx) = local_channel::new_bounded::<Input>(INPUT_QUEUE);
        let mut calls = InFlight {
            tx: Rc::new(tx),
            call: Rc::new(Cell::new(0)),
            streaming: false,
            tools: 0,
        };
        loop {
            while let Some(cmd) = m.poll_command() {
                if let Some(outcome) = self.perform(cmd, &mut m, &mut calls).await? {
                    return Ok(outcome);
                }
            }
            let timeout = m.poll_timeout();
            if !calls.streaming && timeout.is_none() && calls.tools == 0 && !m.is_done() {
                return Err(ActorError::Stalled(m.run_id().to_string()));
            }
            match self.next(&rx, timeout).await {
                Next::Timeout(at_ms) => m.handle_timeout(at_ms),
                Next::Input(Some(input)) => feed(&mut m, input, &mut calls),
                Next::Input(None) => return Err(ActorError::Stalled(m.run_id().to_string())),
                Next::Command(Some(cmd)) => {
                    // Boxed: a rare path, kept out of every active run's future.
                    Box::pin(self.command_during_run(cmd, &mut m)).await;
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
            Command::Append { record, wait } => {
                // Boxed: the append's state lives only while it runs, not in the future every
                // active run keeps while it waits for its model.
                Box::pin(self.append(record, wait)).await?;
                if wait {
                    m.handle(Event::Durable, crate::now_unix_ms());
                }
            }
            Command::CallModel { request, .. } => {
                calls.call.set(calls.call.get() + 1);
                calls.streaming = true;
                self.spawn_model(request, calls.call.clone(), calls.tx.clone());
            }
            Command::AbortModel => {
                calls.call.set(calls.call.get() + 1);
                calls.streaming = false;
            }
            Command::Dispatch { calls: batch, .. } => {
                calls.tools += batch.len();
                for c in batch {
                    let route = self.route_of(&c.name);
                    self.spawn_tool(c, route, calls.tx.clone());
                }
            }
            Command::Display(text) => {
                if let Some(sink) = &mut self.display {
                    sink(&text);
                }
            }
            Command::Finish(outcome) => {
                calls.call.set(calls.call.get() + 1);
                self.state.refresh_unresolved();
                return Ok(Some(outcome));
            }
        }
        Ok(None)
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

    /// Answers a command that arrives while a run is active.
    async fn command_during_run(&mut self, cmd: SessionCommand, m: &mut RunMachine) {
        match cmd {
            SessionCommand::Send { admission, reply } => {
                // Admission answers a repeated send_id or refuses (the session is busy);
                // it never starts a second run beside this one.
                let answer = self.send_prepared(*admission).await;
                let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
            }
            SessionCommand::Status { run_id, reply } => {
                let _ = reply.send(self.view(run_id.as_deref()));
            }
            SessionCommand::Cancel {
                run_id,
                caller,
                reply,
            } => {
                // Owner-only, whether or not the run is the active one.
                let answer = if !caller.owns(&self.state.owners()) {
                    Cancelled::NotOwner
                } else if run_id != m.run_id() {
                    Cancelled::NotActive
                } else {
                    m.handle(Event::Cancel, crate::now_unix_ms());
                    Cancelled::Ack
                };
                let _ = reply.send(answer);
            }
            SessionCommand::Retract {
                submission_id,
                caller,
                reply,
            } => {
                let answer = self.retract_for(&caller, &submission_id).await;
                let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
            }
            SessionCommand::Barrier { reply } => {
                let _ = reply.send(self.barrier().await.ok());
            }
            SessionCommand::Import { input, reply } => {
                let busy = ActorError::Import(broca_import::ImportError {
                    code: broca_wire::Code::SessionBusy,
                    file: input.file,
                    line: None,
                    message: format!(
                        "the session's run {} has not ended: import once it has",
                        m.run_id()
                    ),
                });
                let _ = reply.send(Err(busy.to_rpc_error()));
            }
            SessionCommand::Shutdown => m.handle(Event::Shutdown, crate::now_unix_ms()),
            SessionCommand::Close => {} // only an idle session closes
        }
    }

    /// The run `run_id` (the latest run when `None`), as the WAL tells it.
    pub fn view(&self, run_id: Option<&str>) -> Option<RunView> {
        match run_id {
            Some(id) => self.state.run(id).cloned(),
            None => self.state.runs.last().cloned(),
        }
    }

    /// Calls `hook` with every record appended from now on (seq, log end after it, record).
    pub fn set_on_append(&mut self, hook: Box<dyn FnMut(u64, u64, &Record)>) {
        self.on_append = Some(hook);
    }

    /// Waits until everything appended so far is durable; returns the last seq.
    pub async fn barrier(&self) -> Result<u64, ActorError> {
        self.writer.wait_durable(self.writer.log().end()).await?;
        Ok(self.writer.next_seq() - 1)
    }

    /// Sets the channel of commands a running run also answers.
    pub fn set_inbox(&mut self, inbox: Rc<local_channel::LocalReceiver<SessionCommand>>) {
        self.inbox = Some(inbox);
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
                    glommio::timer::sleep(Duration::from_millis(left_ms * permille / 1000)).await;
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
        glommio::spawn_local(async move {
            // Boxed: opening (render, connect, send) needs more state than streaming does, and
            // the task keeps the larger of the two for its whole life otherwise.
            let opened = Box::pin(provider.open(&request)).await;
            drop(request);
            let mut stream = match opened {
                Ok(s) => s,
                Err(f) => {
                    let _ = tx
                        .send(Input::Model {
                            call: me,
                            item: Some(Err(f)),
                        })
                        .await;
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

    /// The route frozen for tool `name` in the active run's config (empty when none).
    fn route_of(&self, name: &str) -> String {
        self.state
            .open
            .as_ref()
            .and_then(|open| self.state.runs.get(open.index))
            .and_then(|run| run.config.tools.iter().find(|t| t.name == name))
            .map(|t| t.route.clone())
            .unwrap_or_default()
    }

    fn spawn_tool(&self, call: ToolCall, route: String, tx: Rc<local_channel::LocalSender<Input>>) {
        let tools = self.tools.clone();
        let origin = super::ToolOrigin {
            triple: self.triple.clone(),
            run_id: self
                .state
                .open
                .as_ref()
                .and_then(|open| self.state.runs.get(open.index))
                .map(|run| run.run_id.clone())
                .unwrap_or_default(),
        };
        glommio::spawn_local(async move {
            let call_id = call.id.clone();
            let outcome = tools.call(call, route, origin).await;
            // The run may have ended (crash injected): then nobody listens, and that is fine.
            let _ = tx.send(Input::Tool { call_id, outcome }).await;
        })
        .detach();
    }

    /// Closes the WAL, releasing the lease.
    pub async fn close(self) -> Result<(), ActorError> {
        Ok(self.writer.close().await?)
    }
}

/// Says on the log that a model attempt failed (its partial output, if any, is dropped).
fn log_failed_attempt(run_id: &str, error: &broca_protocol::ClassifiedError) {
    if error.class == broca_protocol::ErrorClass::Transient {
        tracing::warn!(run_id, "model attempt failed ({}); its output is dropped and the call retried if attempts remain: {}", error.class.as_str(), error.message);
    } else {
        tracing::warn!(
            run_id,
            "model attempt failed ({}): {}",
            error.class.as_str(),
            error.message
        );
    }
}

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
        item: Option<Result<broca_protocol::StreamEvent, super::Failure>>,
    },
    Tool {
        call_id: String,
        outcome: ToolOutcome,
    },
}

/// What a running run has out: the model call in flight (a stale call's events are ignored and
/// its task stops) and the tool calls not yet answered.
struct InFlight {
    tx: Rc<local_channel::LocalSender<Input>>,
    call: Rc<Cell<u64>>,
    streaming: bool,
    tools: usize,
}

/// Feeds one input to the machine, with the time it arrived.
fn feed(m: &mut RunMachine, input: Input, calls: &mut InFlight) {
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
        Input::Tool { call_id, outcome } => {
            super::crash::tool_answered();
            calls.tools -= 1;
            let event = match outcome {
                ToolOutcome::Done { content, is_error } => Event::ToolResult(ResultBlock {
                    call_id,
                    content,
                    is_error,
                    reason: None,
                    size: None,
                }),
                ToolOutcome::TooLarge { bytes } => Event::ToolResult(ResultBlock {
                    call_id,
                    content: format!(
                        "{} ({bytes} bytes; the limit is {TOOL_RESULT_LIMIT})",
                        cortexkit_role_llm_runner::tool_result_limit::OUTPUT_DISCARDED
                    ),
                    is_error: true,
                    reason: Some(result_reason::TOOL_RESULT_TOO_LARGE.into()),
                    size: Some(broca_wal::runrec::ResultSize {
                        bytes,
                        limit: TOOL_RESULT_LIMIT,
                    }),
                }),
                ToolOutcome::Refused { reason } => Event::ToolResult(ResultBlock {
                    call_id,
                    content: format!("not run: refused before delivery: {reason}"),
                    is_error: true,
                    reason: Some(result_reason::REFUSED_BEFORE_DELIVERY.into()),
                    size: None,
                }),
                ToolOutcome::Indeterminate => Event::ToolIndeterminate { call_id },
            };
            m.handle(event, now);
        }
    }
}

enum Next {
    Input(Option<Input>),
    Command(Option<SessionCommand>),
    /// The machine's timeout came: tell it this time.
    Timeout(u64),
}

/// A command for a live session; each is answered in order.
pub enum SessionCommand {
    /// Admit a send (the run then runs in the actor).
    Send {
        /// The send as admission's first part left it (see [`SessionActor::send_prepared`]);
        /// boxed, as it carries the resolved config.
        admission: Box<Result<Prepared, Unprepared>>,
        reply: oneshot::Sender<Result<SendReply, broca_wire::RpcError>>,
    },
    /// The view of a run (the latest when `None`).
    Status {
        run_id: Option<String>,
        reply: oneshot::Sender<Option<RunView>>,
    },
    /// Withdraw a queued send before it starts (owner-only).
    Retract {
        submission_id: String,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Result<Retracted, broca_wire::RpcError>>,
    },
    /// Cancel the run if it is the active one and the caller owns the session.
    Cancel {
        run_id: String,
        caller: broca_wire::Caller,
        reply: oneshot::Sender<Cancelled>,
    },
    /// Wait until everything appended is durable; answer the last seq (`None` if the log
    /// failed).
    Barrier { reply: oneshot::Sender<Option<u64>> },
    /// Import another harness's log (refused while a run is active).
    Import {
        input: Box<ImportInput>,
        reply: oneshot::Sender<Result<ImportReply, broca_wire::RpcError>>,
    },
    /// Seal the active run Interrupted and stop.
    Shutdown,
    /// Close the session if no run is active (its memory and WAL descriptor freed; the next
    /// command reopens it); ignored during a run.
    Close,
}

/// Tool runner bookkeeping shared by test tools: how often each call id was dispatched.
pub type DispatchCounts = Rc<RefCell<std::collections::HashMap<String, u32>>>;
