//! The session actor: opens the session's WAL (taking its writer lease), replays it, resumes a
//! run a crash left open, admits sends and drives their runs. Commands are processed in order
//! because the actor is driven through `&mut self`.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use broca_io::{Committer, LogConfig};
use glommio::channels::local_channel;

use crate::core::admission::{admit, AdmissionContext, Admitted, Refusal, SendRequest};
use crate::core::machine::{now_unix_ms, Command, Event, Outcome, RunMachine};
use crate::core::replay::{ReplayError, Session};
use crate::protocol::{ToolCall, ToolSpec};
use crate::wal::runrec::ResultBlock;
use crate::wal::{Record, SessionTriple, WalError, WalWriter};

use super::{ModelClient, ModelStream, ToolOutcome, ToolRunner};

/// Why an actor operation failed.
#[derive(Debug)]
pub enum ActorError {
    /// The WAL failed (its error names the file).
    Wal(WalError),
    /// The WAL's records do not replay (names the seq).
    Replay(String),
    /// The send was refused; nothing was written.
    Refused(Refusal),
    /// A crash was injected here (tests only): after the append of `seq`.
    Crashed { seq: u64 },
    /// The run loop stopped without an event to wait for (a bug; the run stays open and is
    /// resumed on the next open).
    Stalled(String),
}

impl std::fmt::Display for ActorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorError::Wal(e) => write!(f, "{e}"),
            ActorError::Replay(e) => write!(f, "{e}"),
            ActorError::Refused(r) => write!(f, "{r}"),
            ActorError::Crashed { seq } => write!(f, "crash injected after record {seq}"),
            ActorError::Stalled(run) => write!(f, "run {run}: the run loop stalled"),
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
    pub run_id: String,
    /// True when the send_id named an existing run and nothing was written.
    pub existing: bool,
}

/// One live session.
pub struct SessionActor<P: ModelClient, T: ToolRunner> {
    writer: WalWriter,
    state: Session,
    provider: Rc<P>,
    tools: Rc<T>,
    tool_specs: Vec<ToolSpec>,
    crash: CrashPlan,
    appends: u64,
    display: Option<Box<dyn FnMut(&str)>>,
    /// Timers sleep `after_ms * timer_permille / 1000` (tests shorten backoffs).
    timer_permille: u64,
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Opens the session in `wal_dir`: takes the lease, recovers the log and replays it. A
    /// run left open by a crash is not driven yet: call [`SessionActor::resume`].
    pub async fn open(
        wal_dir: &Path,
        triple: &SessionTriple,
        provider: Rc<P>,
        tools: Rc<T>,
        tool_specs: Vec<ToolSpec>,
        log: LogConfig,
        committer: Committer,
    ) -> Result<Self, ActorError> {
        let (writer, recovered) = WalWriter::open(wal_dir, triple, log, committer).await?;
        let state = match &recovered.scan {
            None => Session::default(),
            Some(scan) => Session::replay_scan(scan, &recovered.bytes).map_err(
                |ReplayError { seq, reason }| {
                    ActorError::Replay(format!(
                        "{}: the log does not replay (record seq {seq}): {reason}",
                        writer.path().display()
                    ))
                },
            )?,
        };
        Ok(SessionActor {
            writer,
            state,
            provider,
            tools,
            tool_specs,
            crash: CrashPlan::default(),
            appends: 0,
            display: None,
            timer_permille: 1000,
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
        if let Err(why) = crate::core::admission::check_resumable(&run.config) {
            // Never re-render an admitted run differently: seal it with the reason.
            let machine = RunMachine::refuse_resume(run_id.clone(), run.usage, open.step, why);
            let outcome = self.drive(machine).await?;
            return Ok(Some((run_id, outcome)));
        }
        let machine = RunMachine::resume(
            run_id.clone(),
            run.config.clone(),
            self.state.transcript.clone(),
            open.step,
            run.usage,
            open.point,
            open.cancel_requested,
        );
        let outcome = self.drive(machine).await?;
        Ok(Some((run_id, outcome)))
    }

    /// Admits a send: refuses it (writing nothing), answers an existing run for a repeated
    /// send_id (writing nothing), or makes RunStarted durable and answers the new run.
    pub async fn send(&mut self, req: &SendRequest) -> Result<SendReply, ActorError> {
        let ctx = AdmissionContext {
            tools: &self.tool_specs,
            run_id: format!(
                "run_{}_{}",
                &self.writer.header().lineage_hex()[..12],
                self.writer.next_seq()
            ),
            now_unix_ms: now_unix_ms(),
        };
        match admit(req, &self.state, &ctx).map_err(ActorError::Refused)? {
            Admitted::Existing { run_index } => Ok(SendReply {
                run_id: self.state.runs[run_index].run_id.clone(),
                existing: true,
            }),
            Admitted::New(started) => {
                let run_id = started.run_id.clone();
                self.append(Record::RunStarted(started), true).await?;
                Ok(SendReply {
                    run_id,
                    existing: false,
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
        );
        self.drive(machine).await
    }

    /// Appends a record, applies it to the session state, and honours the crash plan.
    async fn append(&mut self, record: Record, wait: bool) -> Result<(), ActorError> {
        let appended = self.writer.append(&record).await?;
        self.state.apply(appended.seq, record).map_err(|reason| {
            ActorError::Replay(format!("live record {}: {reason}", appended.seq))
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

    /// Performs the machine's commands until it finishes.
    async fn drive(&mut self, mut m: RunMachine) -> Result<Outcome, ActorError> {
        let mut stream: Option<P::Stream> = None;
        let mut timer_ms: Option<u64> = None;
        let (tx, rx) = local_channel::new_bounded::<(String, ToolOutcome)>(1024);
        let tx = Rc::new(tx);
        let mut in_flight = 0usize;
        loop {
            while let Some(cmd) = m.poll_command() {
                match cmd {
                    Command::Append { record, wait } => {
                        self.append(record, wait).await?;
                        if wait {
                            m.handle(Event::Durable);
                        }
                    }
                    Command::CallModel { request, .. } => {
                        match self.provider.open(&request).await {
                            Ok(s) => stream = Some(s),
                            Err(f) => {
                                log_failed_attempt(m.run_id(), &f.error);
                                m.handle(Event::AttemptFailed {
                                    error: f.error,
                                    usage: f.usage,
                                })
                            }
                        }
                    }
                    Command::AbortModel => stream = None,
                    Command::Dispatch { calls, .. } => {
                        in_flight += calls.len();
                        for call in calls {
                            self.spawn_tool(call, tx.clone());
                        }
                    }
                    Command::Display(text) => {
                        if let Some(sink) = &mut self.display {
                            sink(&text);
                        }
                    }
                    Command::SetTimer { after_ms } => timer_ms = Some(after_ms),
                    Command::Finish(outcome) => {
                        self.state.refresh_unresolved();
                        return Ok(outcome);
                    }
                }
            }
            if let Some(s) = &mut stream {
                match s.next().await {
                    Some(Ok(ev)) => m.handle(Event::Stream(ev)),
                    Some(Err(f)) => {
                        stream = None;
                        log_failed_attempt(m.run_id(), &f.error);
                        m.handle(Event::AttemptFailed {
                            error: f.error,
                            usage: f.usage,
                        });
                    }
                    None => {
                        stream = None;
                        m.handle(Event::StepEnded);
                    }
                }
            } else if let Some(ms) = timer_ms.take() {
                glommio::timer::sleep(Duration::from_millis(ms * self.timer_permille / 1000)).await;
                m.handle(Event::Timer);
            } else if in_flight > 0 {
                let Some((call_id, outcome)) = rx.recv().await else {
                    return Err(ActorError::Stalled(m.run_id().to_string()));
                };
                in_flight -= 1;
                m.handle(match outcome {
                    ToolOutcome::Done { content, is_error } => Event::ToolResult(ResultBlock {
                        call_id,
                        content,
                        is_error,
                        reason: None,
                    }),
                    ToolOutcome::Refused { reason } => Event::ToolResult(ResultBlock {
                        call_id,
                        content: format!("not run: refused before delivery: {reason}"),
                        is_error: true,
                        reason: Some("refused_before_delivery".into()),
                    }),
                    ToolOutcome::Indeterminate => Event::ToolIndeterminate { call_id },
                });
            } else if !m.is_done() {
                return Err(ActorError::Stalled(m.run_id().to_string()));
            }
        }
    }

    fn spawn_tool(
        &self,
        call: ToolCall,
        tx: Rc<local_channel::LocalSender<(String, ToolOutcome)>>,
    ) {
        let tools = self.tools.clone();
        glommio::spawn_local(async move {
            let id = call.id.clone();
            let outcome = tools.call(call).await;
            // The run may have ended (crash injected): then nobody listens, and that is fine.
            let _ = tx.send((id, outcome)).await;
        })
        .detach();
    }

    /// Closes the WAL, releasing the lease.
    pub async fn close(self) -> Result<(), ActorError> {
        Ok(self.writer.close().await?)
    }
}

/// Says on the log that a model attempt failed (its partial output, if any, is dropped).
fn log_failed_attempt(run_id: &str, error: &crate::protocol::ClassifiedError) {
    if error.class == crate::protocol::ErrorClass::Transient {
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

/// Tool runner bookkeeping shared by test tools: how often each call id was dispatched.
pub type DispatchCounts = Rc<RefCell<std::collections::HashMap<String, u32>>>;
