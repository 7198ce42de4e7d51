//! The session actor: opens the session's WAL (taking its writer lease), replays it, resumes a
//! run a crash left open, admits sends and drives their runs. Commands are processed in order
//! because the actor is driven through `&mut self`. It is built with an [`Opener`].

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use broca_io::{Committer, LogConfig};
use broca_shards::registry::Inbox;

use broca_core::admission::{admit_prepared, admit_unprepared, Admitted, Prepared};
use broca_core::admission::{SendRequest, Unprepared};
use broca_core::machine::{Outcome, ResumeFrom, RunMachine};
use broca_core::replay::{RunView, Session};
use broca_core::ReplayError;
use broca_protocol::model::ModelClient;
use broca_protocol::ToolSpec;
use broca_read::ReadError;
use broca_tools::ToolRunner;
use broca_wal::{Record, SessionTriple};
use broca_wal_writer::WalWriter;

use crate::command::{Joins, SendReply, SessionCommand};
pub use crate::error::ActorError;
use crate::hooks::{Abort, CrashPlan, Hooks, NoHooks};
use crate::watch::{NoWatch, Watch};

/// Opens a [`SessionActor`]: the session, its model and tools, and what else it is wired to.
pub struct Opener<P, T> {
    wal_dir: PathBuf,
    triple: SessionTriple,
    model: Rc<P>,
    tools: Rc<T>,
    tool_specs: Arc<[ToolSpec]>,
    log: LogConfig,
    committer: Committer,
    crash: CrashPlan,
    hooks: Rc<dyn Hooks>,
    timer_permille: u64,
    inbox: Option<Rc<Inbox<SessionCommand>>>,
    watch: Rc<dyn Watch>,
    keep_entries: bool,
}

impl<P: ModelClient, T: ToolRunner> Opener<P, T> {
    /// Keeps the role's entries with the session (the runner hosts compaction providers:
    /// a provider's view is rendered over them).
    pub fn keep_entries(mut self, keep: bool) -> Self {
        self.keep_entries = keep;
        self
    }

    /// The tools the session's sends may be offered (none by default).
    pub fn tool_specs(mut self, specs: impl Into<Arc<[ToolSpec]>>) -> Self {
        self.tool_specs = specs.into();
        self
    }

    /// The log's configuration (the default's by default).
    pub fn log(mut self, log: LogConfig) -> Self {
        self.log = log;
        self
    }

    /// The shard's group-commit scheduler (a new one by default).
    pub fn committer(mut self, committer: Committer) -> Self {
        self.committer = committer;
        self
    }

    /// Where a test stops the actor as if the process died (nowhere by default).
    pub fn crash_plan(mut self, plan: CrashPlan) -> Self {
        self.crash = plan;
        self
    }

    /// The process's crash hooks ([`NoHooks`] by default).
    pub fn hooks(mut self, hooks: Rc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Scales every timer the run loop arms (tests: 0 makes backoffs instant).
    pub fn timer_permille(mut self, permille: u64) -> Self {
        self.timer_permille = permille;
        self
    }

    /// The commands a running run also answers (its shard's inbox for the session).
    pub fn inbox(mut self, inbox: Rc<Inbox<SessionCommand>>) -> Self {
        self.inbox = Some(inbox);
        self
    }

    /// What watches the actor: its appends, its display lane, its storage's health.
    pub fn watch(mut self, watch: Rc<dyn Watch>) -> Self {
        self.watch = watch;
        self
    }

    /// Opens the session: takes the lease, recovers the log and replays it. A run left open
    /// by a crash is not driven yet: call [`SessionActor::resume`].
    pub async fn open(self) -> Result<SessionActor<P, T>, ActorError> {
        let (writer, recovered) =
            WalWriter::open(&self.wal_dir, &self.triple, self.log, self.committer).await?;
        // Replay decodes on the blocking pool (with threads of its own for long logs), never
        // on this shard's executor; the file's bytes are freed once it is done.
        let empty = if self.keep_entries {
            Session::with_entries()
        } else {
            Session::default()
        };
        let replayed =
            broca_io::blocking::run(
                broca_io::blocking::Kind::WalReplay,
                move || match &recovered.scan {
                    None => Ok(empty),
                    Some(scan) => empty.replay_scan_into(scan, &recovered.bytes),
                },
            )
            .await;
        let mut state = replayed.map_err(|error| replay_error(writer.path(), error))?;
        state.boot = crate::uploads::process_boot();
        // The parts of uploads no longer open (lost with the process that took them).
        if !state.uploads.is_empty() {
            let store =
                crate::content::ContentStore::new(self.triple.address().media_dir(&self.wal_dir));
            let open: std::collections::HashSet<String> = state
                .uploads
                .iter()
                .filter(|(id, _)| {
                    matches!(
                        state.upload(id),
                        broca_core::replay::uploads::UploadState::Open(_)
                    )
                })
                .map(|(id, _)| id.clone())
                .collect();
            broca_io::blocking::run(broca_io::blocking::Kind::Media, move || {
                store.sweep_parts(|id| open.contains(id))
            })
            .await;
        }
        Ok(SessionActor {
            writer,
            state,
            wal_dir: self.wal_dir,
            provider: self.model,
            tools: self.tools,
            tool_specs: self.tool_specs,
            triple: Rc::new(self.triple),
            crash: self.crash,
            hooks: self.hooks,
            appends: 0,
            timer_permille: self.timer_permille,
            inbox: self.inbox,
            watch: self.watch,
            forwarding: Default::default(),
            compactor: None,
        })
    }
}

/// The error of a record of `path` that does not replay.
fn replay_error(path: &Path, error: ReplayError) -> ActorError {
    ActorError::Replay(ReadError::Replay {
        path: path.to_path_buf(),
        error,
    })
}

/// One live session.
pub struct SessionActor<P: ModelClient, T: ToolRunner> {
    pub(crate) writer: WalWriter,
    /// The WAL folder (the content store is beside it).
    pub(crate) wal_dir: PathBuf,
    pub(crate) state: Session,
    pub(crate) provider: Rc<P>,
    pub(crate) tools: Rc<T>,
    tool_specs: Arc<[ToolSpec]>,
    /// The session's triple, handed to tool calls with the run's id.
    pub(crate) triple: Rc<SessionTriple>,
    crash: CrashPlan,
    pub(crate) hooks: Rc<dyn Hooks>,
    appends: u64,
    /// Timers sleep `after_ms * timer_permille / 1000` (tests shorten backoffs).
    pub(crate) timer_permille: u64,
    /// Commands answered while a run is active (serve).
    pub(crate) inbox: Option<Rc<Inbox<SessionCommand>>>,
    /// What watches the actor (told, never reaching back in).
    pub(crate) watch: Rc<dyn Watch>,
    /// The person-only commands this process is forwarding now (their call keys): a retry
    /// of one waits for its reply instead of taking it for lost.
    pub(crate) forwarding: std::collections::HashSet<String>,
    /// The link to the session's compaction provider, by the plan identity it was made for.
    pub(crate) compactor: Option<(String, Option<crate::compactor::Compactor>)>,
}

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// An opener of the session `triple` in `wal_dir`, calling `model` and `tools`.
    pub fn opener(
        wal_dir: &Path,
        triple: &SessionTriple,
        model: Rc<P>,
        tools: Rc<T>,
    ) -> Opener<P, T> {
        Opener {
            wal_dir: wal_dir.to_path_buf(),
            triple: triple.clone(),
            model,
            tools,
            tool_specs: Arc::from(Vec::new()),
            log: LogConfig::default(),
            committer: Committer::default(),
            crash: CrashPlan::default(),
            hooks: Rc::new(NoHooks),
            timer_permille: 1000,
            inbox: None,
            watch: Rc::new(NoWatch),
            keep_entries: false,
        }
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
        let catalog = broca_catalog::current();
        let resumable =
            broca_core::resume::check_resumable(&self.state.runs[open.index].config, &catalog);
        if resumable.is_ok() {
            // Ordered sends still queued (a crash came between the run's start and their
            // handing over) wait for this run's boundaries, as they would have.
            for record in broca_core::admission::join_waiting(&self.state, crate::now_unix_ms()) {
                self.append(record, true).await?;
            }
        }
        let run = &self.state.runs[open.index];
        let run_id = run.run_id.clone();
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
            step_seq: open.step_seq,
            steers: self.pending_steers(),
            compacted: self.state.compacted.clone(),
        };
        let machine = match resumable {
            // Never re-render an admitted run differently: seal it with the reason.
            Err(why) => RunMachine::refuse_resume(from, why.to_string(), now),
            Ok(()) => RunMachine::resume(from, now),
        };
        let outcome = self.drive(machine).await?;
        Ok(Some((run_id, outcome)))
    }

    /// Admits a send: refuses it (writing nothing), answers an existing run for a repeated
    /// send_id (writing nothing), or makes RunStarted durable and answers the new run.
    pub async fn send(&mut self, req: &SendRequest) -> Result<SendReply, ActorError> {
        let catalog = broca_catalog::current();
        let admission =
            broca_core::admission::prepare(req, &self.tool_specs, &catalog, self.provider.check());
        self.send_prepared(admission, None).await
    }

    /// The sends waiting for a step boundary (steers, and ordered sends).
    fn pending_steers(&self) -> Vec<broca_core::machine::Waiting> {
        self.state
            .pending_steers
            .iter()
            .map(|p| broca_core::machine::Waiting {
                seq: p.seq,
                blocks: broca_core::replay::steer_blocks(&p.record),
                order: p.record.order.clone(),
                submission_id: p.record.submission_id.clone(),
            })
            .collect()
    }

    /// The id of what the next record starts (`run`, `imp`): the prefix, the lineage's
    /// first 12 hex digits and the seq the record gets, never used twice by a WAL.
    pub(crate) fn next_id(&self, prefix: &str) -> String {
        let lineage = self.writer.header().lineage_hex();
        assert!(lineage.len() >= 12, "a lineage is 16 bytes in hex");
        format!("{prefix}_{}_{}", &lineage[..12], self.writer.next_seq())
    }

    /// The session's part of admitting a send whose own part ran already ([`prepare`]):
    /// the same answers as [`SessionActor::send`], admission not run twice. `running` is the
    /// run being driven: it lets go of a waiting send the new one's `dedupe_key` replaces.
    ///
    /// [`prepare`]: broca_core::admission::prepare
    pub async fn send_prepared(
        &mut self,
        admission: Result<Prepared, Unprepared>,
        mut running: Option<&mut RunMachine>,
    ) -> Result<SendReply, ActorError> {
        // Queued ordered sends whose time passed end first, so a re-send answers `expired`.
        for ended in broca_core::admission::expired_queued(&self.state, crate::now_unix_ms()) {
            self.append(Record::SendRetracted(ended), false).await?;
        }
        let mut admitted = match admission {
            Ok(mut p) => {
                // A template's `part_tag` slots take the numbers the session's next request
                // shows (its compaction provider's view), handed to admission.
                if p.order.as_ref().is_some_and(|o| o.template.is_some()) {
                    p.shown_parts = broca_ck::provided::shown_numbers(&self.state);
                }
                admit_prepared(p, &self.state, self.next_id("run"), crate::now_unix_ms())
            }
            Err(u) => admit_unprepared(&u, &self.state),
        }
        .map_err(ActorError::Refused)?;
        // The sends a dedupe_key replaces end `superseded` before the send replacing them.
        while let Admitted::Replacing { ended, then } = admitted {
            self.supersede(ended, running.as_deref_mut()).await?;
            admitted = *then;
        }
        self.admitted(admitted).await
    }

    /// Ends the waiting sends a `dedupe_key` replaces: one the running run holds is let go
    /// of first; one it rendered already was delivered, and is never replaced.
    async fn supersede(
        &mut self,
        ended: Vec<broca_wal::runrec::SendRetracted>,
        mut running: Option<&mut RunMachine>,
    ) -> Result<(), ActorError> {
        for record in ended {
            let id = record.submission_id.as_str();
            let held = self
                .state
                .pending_steers
                .iter()
                .any(|p| p.record.submission_id.as_deref() == Some(id));
            if let (true, Some(m)) = (held, running.as_deref_mut()) {
                if !m.withdraw(id) {
                    continue;
                }
            }
            self.append(Record::SendRetracted(record), false).await?;
        }
        Ok(())
    }

    /// What an admitted send writes and answers: a repeat's answer (nothing written), or
    /// its record, durable before the answer.
    async fn admitted(&mut self, admitted: Admitted) -> Result<SendReply, ActorError> {
        let answer = |run_id: String, existing: bool, pending: Option<String>| SendReply {
            run_id,
            existing,
            pending,
            steer: None,
            joins: None,
        };
        let (record, reply) = match admitted {
            Admitted::Replacing { .. } => unreachable!("replaced sends end before"),
            Admitted::Existing { run_index } => {
                let run_id = self.state.runs[run_index].run_id.clone();
                return Ok(answer(run_id, true, None));
            }
            Admitted::Pending { submission_id } => {
                return Ok(answer(String::new(), true, Some(submission_id)))
            }
            Admitted::SteerExisting { seq } => {
                return Ok(SendReply {
                    steer: broca_read::views::steer_answer(&self.state, seq),
                    ..answer(String::new(), true, None)
                });
            }
            Admitted::Ended(ended) => {
                return Ok(SendReply {
                    steer: Some(broca_read::views::ended_answer(&ended)),
                    ..answer(String::new(), true, None)
                });
            }
            Admitted::New(started) => {
                let run_id = started.run_id.clone();
                (Record::RunStarted(started), answer(run_id, false, None))
            }
            Admitted::Queued(queued) => {
                let interrupts =
                    queued.delivery.as_deref() == Some(broca_wire::delivery::INTERRUPT);
                let reply = SendReply {
                    joins: interrupts.then_some(Joins::Interrupt),
                    ..answer(String::new(), false, Some(queued.submission_id.clone()))
                };
                (Record::SendQueued(queued), reply)
            }
            Admitted::Steered(steered) => return self.steered(steered).await,
        };
        assert!(!reply.existing, "a send that writes is not a repeat");
        self.append(record, true).await?;
        Ok(reply)
    }

    /// A steer, durable before its answer: an ordered one waits for the run's boundaries
    /// (`pending` until it goes out), a plain one joins the run at its next step.
    async fn steered(
        &mut self,
        steered: Box<broca_wal::runrec::SendSteered>,
    ) -> Result<SendReply, ActorError> {
        let seq = self.writer.next_seq();
        let blocks = broca_core::replay::steer_blocks(&steered);
        let reply = SendReply {
            run_id: String::new(),
            existing: false,
            pending: None,
            steer: None,
            joins: None,
        };
        if steered.order.is_some() {
            let waiting = broca_core::machine::Waiting {
                seq,
                blocks,
                order: steered.order.clone(),
                submission_id: steered.submission_id.clone(),
            };
            let pending = steered.submission_id.clone();
            self.append(Record::SendSteered(steered), true).await?;
            return Ok(SendReply {
                pending,
                joins: Some(Joins::Ordered(waiting)),
                ..reply
            });
        }
        self.append(Record::SendSteered(steered), true).await?;
        Ok(SendReply {
            steer: broca_read::views::steer_answer(&self.state, seq),
            joins: Some(Joins::Steer { seq, blocks }),
            ..reply
        })
    }

    /// Drives the run just admitted by [`SessionActor::send`] to its end.
    pub async fn run_admitted(&mut self) -> Result<Outcome, ActorError> {
        let Some(open) = self.state.open.clone() else {
            return Err(ActorError::Stalled {
                run_id: "(no admitted run)".into(),
            });
        };
        // Ordered sends queued while no run was open wait for this one's boundaries now.
        for record in broca_core::admission::join_waiting(&self.state, crate::now_unix_ms()) {
            self.append(record, true).await?;
        }
        let run = &self.state.runs[open.index];
        let machine = RunMachine::start_with_steers(
            run.run_id.clone(),
            run.config.clone(),
            self.state.transcript.clone(),
            self.state.compacted.clone(),
            self.pending_steers(),
            crate::now_unix_ms(),
        );
        self.drive(machine).await
    }

    /// Appends a record, applies it to the session state, and honours the crash hooks and
    /// plan. A record nothing waits for is deferred: it shares the fdatasync of the next one
    /// waited for (a tool step's result and the next step's start ride on that step's tool
    /// intent), so a tool step costs one fdatasync.
    pub(crate) async fn append(&mut self, record: Record, wait: bool) -> Result<(), ActorError> {
        let seq_expected = self.writer.next_seq();
        let appended = if wait {
            self.writer.append(&record).await?
        } else {
            self.writer.append_deferred(&record).await?
        };
        assert_eq!(appended.seq, seq_expected, "a record takes the next seq");
        match self.hooks.appended(&record) {
            None | Some(Abort::AfterAction) => {}
            Some(Abort::WhenDurable) => {
                // The hooks asked for the process to die right after this boundary is durable.
                self.writer.wait_durable(appended.end).await?;
                self.hooks.abort(&record);
            }
            Some(Abort::Now) => self.hooks.abort(&record),
        }
        self.watch.appended(crate::watch::Appended {
            seq: appended.seq,
            end: appended.end,
            record: &record,
        });
        if let Some(runner) = self.watch.step_runner() {
            let lineage = self.writer.header().lineage_hex();
            let place = broca_read::step_events::Place {
                runner,
                harness: &self.triple.harness,
                session: &self.triple.session,
                lineage: &lineage,
            };
            if let Some(event) =
                broca_read::step_events::step_finished(&self.state, &place, appended.seq, &record)
            {
                self.watch.step_finished(appended.end, event);
            }
        }
        let path = self.writer.path();
        self.state.apply(appended.seq, record).map_err(|reason| {
            let error = ReplayError {
                seq: appended.seq,
                reason,
            };
            replay_error(path, error)
        })?;
        self.appends += 1;
        self.notice_due();
        let crash_now = self.crash.after_appends == Some(self.appends);
        if wait || (crash_now && self.crash.durable) {
            self.writer.wait_durable(appended.end).await?;
        }
        if crash_now {
            return Err(ActorError::Crashed { seq: appended.seq });
        }
        Ok(())
    }

    /// The run `run_id` (the latest run when `None`), as the WAL tells it.
    pub fn view(&self, run_id: Option<&str>) -> Option<RunView> {
        match run_id {
            Some(id) => self.state.run(id).cloned(),
            None => self.state.runs.last().cloned(),
        }
    }

    /// Records a tool module's late result for a call the session sealed without an
    /// outcome, durably and once (by its event id); any other is not the session's.
    pub async fn record_late(
        &mut self,
        late: broca_tools::late::LateResult,
    ) -> Result<broca_tools::late::LateRecorded, ActorError> {
        use broca_core::late::LateFate;
        use broca_tools::late::LateRecorded;
        if let Some(update) = late.command {
            return self.command_entry(&late.call_key, update).await;
        }
        let (run_id, call_id) = match self.state.late.fate(&late.call_key, &late.event_id) {
            LateFate::Recorded => return Ok(LateRecorded::AlreadyRecorded),
            LateFate::NotAwaited => return Ok(LateRecorded::NotAwaited),
            LateFate::Open => return Ok(LateRecorded::NotYet),
            LateFate::Record { run_id, call_id } => (run_id, call_id),
        };
        let record = broca_wal::runrec::ToolResultLate {
            run_id,
            call_id,
            call_key: late.call_key,
            module: late.module,
            event_id: late.event_id,
            outcome: late.outcome,
            content: late.content,
            is_error: late.is_error,
            settled_at_unix_ms: late.settled_at_unix_ms,
            at_unix_ms: crate::now_unix_ms(),
        };
        self.append(Record::ToolResultLate(Box::new(record)), true)
            .await?;
        Ok(LateRecorded::Recorded)
    }

    /// Waits until everything appended so far is durable; returns the last seq.
    pub async fn barrier(&self) -> Result<u64, ActorError> {
        self.writer.wait_durable(self.writer.log().end()).await?;
        let next = self.writer.next_seq();
        assert!(next > 1, "an open WAL holds its lease record");
        Ok(next - 1)
    }

    /// Closes the WAL, releasing the lease.
    pub async fn close(self) -> Result<(), ActorError> {
        Ok(self.writer.close().await?)
    }
}
