//! Replay: the WAL read as episodes. Each RunStarted opens one; earlier episodes are an
//! immutable prefix. Replay rebuilds the conversation, every run's state, the send_id index,
//! and, for a run without a terminal record, the point where it resumes.

use std::collections::HashMap;
use std::sync::Arc;

use broca_protocol::{user_blocks, Block, ClassifiedError, Message, Role, ToolCall};
use broca_wal::runrec::{FinishKind, FrozenConfig};
use broca_wal::Record;

use super::spend::Spend;
use point::{push_result, LastStep, ResumePoint};

/// A run as the WAL tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
    pub run_id: String,
    pub send_id: Option<String>,
    pub inputs_digest: String,
    /// The digest of the run's prompt ([`prompt_digest`]).
    pub prompt_digest: String,
    /// The caller's id for the run's prompt message (`client_message_id`).
    pub client_message_id: Option<String>,
    /// Who sent it: the attested principal and its scope's owner (RunStarted's).
    pub principal: Option<String>,
    pub scope_owner: Option<String>,
    /// The role's view of the run's usage: each completed step as its provider reported it.
    pub step_usage: cortexkit_role_llm_runner::usage::RunUsage,
    /// The run's last assistant message: its entry's ordinal, its record's seq (its mid),
    /// and whether it has text (then its text is `final_text`).
    pub last_assistant: Option<(u64, u64, bool)>,
    /// How its last model step finished, and whether it asked for tools.
    pub last_finish: Option<(broca_protocol::FinishReason, bool)>,
    /// Why it was sealed interrupted (RunFinished's `cause`), when it was.
    pub interrupt_cause: Option<String>,
    /// The queued send it delivered, when it waited for its turn.
    pub submission_id: Option<String>,
    pub config: FrozenConfig,
    pub state: RunState,
    pub detail: Option<String>,
    pub error: Option<ClassifiedError>,
    pub indeterminate_tool_calls: Vec<String>,
    /// What the run spent, from its step records (totals, unmeasured steps, cost).
    pub spend: Spend,
    /// Model steps started.
    pub steps: u32,
    /// The text of the run's last assistant message.
    pub final_text: Option<String>,
    /// Seq of the run's RunStarted record.
    pub started_seq: u64,
    /// The provider's quota as its latest answer said it (ChatGPT).
    pub quota: Option<broca_protocol::Quota>,
    /// For a run a budget stopped: which budget, its limit, what was spent, and why.
    pub budget: Option<broca_wal::runrec::BudgetStop>,
    /// The structured output its terminal record carries (`StructuredOutputResult`).
    pub structured_output: Option<serde_json::Value>,
    /// Its send's delivery as its identity compares it, when not `queue`: `steer`,
    /// `interrupt`, or a list's identity (`broca_protocol::delivery::delivery_identity`).
    pub delivery: Option<String>,
    /// The steered sends it accepted, in order, and whether it rendered each.
    pub steers: Vec<RunSteer>,
}

impl RunView {
    /// The run `r` starts, at record `seq`: nothing spent, no step yet.
    fn started(seq: u64, r: broca_wal::runrec::RunStarted) -> RunView {
        RunView {
            prompt_digest: prompt_digest(&r.prompt),
            run_id: r.run_id,
            send_id: r.send_id,
            inputs_digest: r.inputs_digest,
            principal: r.principal,
            scope_owner: r.scope_owner,
            client_message_id: r.client_message_id,
            step_usage: Default::default(),
            last_assistant: None,
            last_finish: None,
            interrupt_cause: None,
            submission_id: r.submission_id,
            config: r.config,
            state: RunState::Active,
            detail: None,
            error: None,
            indeterminate_tool_calls: Vec::new(),
            spend: Spend::default(),
            steps: 0,
            final_text: None,
            started_seq: seq,
            quota: None,
            budget: None,
            structured_output: None,
            delivery: broca_protocol::delivery::delivery_identity(
                r.delivery.as_deref(),
                r.order.as_ref(),
            ),
            steers: Vec::new(),
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Active,
    Paused,
    Finished(FinishKind),
}

impl RunState {
    /// The state's wire name (run.status).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Active => "active",
            RunState::Paused => "paused",
            RunState::Finished(k) => k.as_str(),
        }
    }
}

/// The run without a terminal record, and where it resumes.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRun {
    /// Index into [`Session::runs`].
    pub index: usize,
    pub step: u32,
    pub point: ResumePoint,
    pub cancel_requested: bool,
    /// The run's last completed model step.
    pub last_step: Option<LastStep>,
    /// The seq of the current step's StepStarted record (its message's id).
    pub step_seq: Option<u64>,
    /// When the current step began, as its StepStarted record says.
    pub step_started_at: Option<u64>,
}

/// A session's state, rebuilt from its WAL.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Session {
    /// Shared with the active run's machine and its requests.
    pub transcript: Vec<Arc<Message>>,
    pub runs: Vec<RunView>,
    /// Every run a keyed send started, by its key.
    pub by_send_id: HashMap<SendKey, usize>,
    pub by_run_id: HashMap<String, usize>,
    pub open: Option<OpenRun>,
    /// Tool calls in the transcript without a result (left by an interrupted run): the next
    /// send resolves them with an outcome_unknown result.
    pub unresolved_calls: Vec<String>,
    /// Every source imported, in the order first imported.
    pub imports: Vec<ImportedSource>,
    /// The calls the latest import left without a result (of those unresolved, the ones
    /// another harness, not broca, stopped in).
    pub imported_pending: Vec<String>,
    /// The role's entries, kept when the replay asked for them (`with_entries`).
    pub entries: Option<super::entries::Entries>,
    /// How many entries the session has (counted whether or not they are kept).
    pub entry_count: u64,
    /// Sends waiting for the active run to end, in the order they came.
    pub queued: Vec<broca_wal::runrec::SendQueued>,
    /// Queued sends withdrawn before they started, or ordered sends that ended undelivered
    /// (with why), by send_id.
    pub retracted: HashMap<
        SendKey,
        (
            broca_wal::runrec::SendQueued,
            Option<broca_wal::runrec::SendEnded>,
        ),
    >,
    /// The id (`mid`) of the last assistant message: the calls an interrupted run left open
    /// are this message's.
    pub last_assistant_mid: Option<String>,
    /// The session's input-token cap: the lowest any accepted send asked for (a started run,
    /// or a queued send, even one later retracted: the cap is lower-only).
    pub input_cap: Option<u64>,
    /// The input the session's completed steps consumed (the cap's measure).
    pub input: super::spend::InputTally,
    /// The session's spend (llm-runner/v1 `session_usage`): every completed step of every run
    /// since the first, kept as each step record is applied (never by going over history
    /// again); absent before the first run.
    pub usage: Option<cortexkit_role_llm_runner::usage::SessionUsage>,
    /// Steered sends accepted and not yet rendered, in the order accepted.
    pub pending_steers: Vec<PendingSteer>,
    /// Every keyed steered send by its key: what a re-send of it answers.
    pub steer_sends: HashMap<SendKey, SteerSend>,
    /// The session's uploads by id (`attachments`).
    pub uploads: uploads::Uploads,
    /// The process the session lives in (its start time, set by the actor): an upload begun
    /// by another and never committed is gone.
    pub boot: u64,
    /// The latest summary standing in for the conversation's older turns (`ContextCompacted`):
    /// what the model's requests carry in their place.
    pub compacted: Option<super::compaction::Compacted>,
    /// The calls a late result may still settle, and the late results recorded.
    pub late: super::late::LateCalls,
    /// The session's retention in seconds (llm-runner/v1 `retention`), as its latest send
    /// left it; `None`: kept forever.
    pub retention: Option<u64>,
    /// The time of its newest send, step or terminal record (the retention clock's last
    /// activity; the same time `session.head` names `updated_at`).
    pub activity_ms: Option<u64>,
    /// The storage policy its first send naming one froze (llm-runner/v1
    /// `session_retention`); `None`: the runner's (kept forever).
    pub policy: Option<cortexkit_role_llm_runner::session_retention::RetentionPolicy>,
    /// Its owner released it (`session.release`): when, and who.
    pub released: Option<broca_wal::runrec::SessionReleased>,
    /// What the archive's prunes of its reasoning left (`archive_prunes_reasoning`).
    pub prunes: prunes::Prunes,
    /// The fetch plan its admission froze (llm-runner/v1 `plans`), for life.
    pub plan: Option<Box<broca_wal::planrec::FrozenPlan>>,
    /// The person-only commands relayed for its owner (llm-runner/v1 `user_commands`).
    pub commands: broca_fetch_plan::commands::UserCommands,
    /// The refreshes its owner made (llm-runner/v1 `session_change`); `plan` is the one in
    /// effect.
    pub change: broca_fetch_plan::change::Changes,
    /// Whether its host started it, and who adopted it (llm-runner/v1 `adopt`).
    pub hosting: hosting::Hosting,
    /// The latest view its compaction provider handed over and it accepted
    /// (cortexkit-role-compaction W5.5): its requests are rendered through it.
    pub view: Option<Arc<cortexkit_role_compaction::view::View>>,
}

impl Session {
    /// Lowers the session's input cap to `config`'s, if it has one.
    fn note_input_cap(&mut self, config: &broca_wal::runrec::FrozenConfig, started: bool) {
        if let Some(cap) = config.stop.input_cap {
            self.input_cap = Some(self.input_cap.map_or(cap.limit, |c| c.min(cap.limit)));
        }
        // Admission only ever shortens it: the latest send's is the session's.
        if config.retention.is_some() {
            self.retention = config.retention;
        }
        self.note_policy(config.retention_policy.as_ref());
        if let Some(plan) = broca_fetch_plan::plan::replayed(config, self.plan.as_deref(), started)
        {
            self.plan = Some(plan);
        }
    }
}

/// A source imported into the session (its latest import), and where the transcript stood
/// after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedSource {
    pub format: String,
    pub source_session: String,
    /// The latest import of it.
    pub import_id: String,
    /// What it covers of the source: its first `bytes` bytes, of digest `blake3`.
    pub bytes: u64,
    pub blake3: String,
    pub last_line: u64,
    /// The transcript's length right after it: anything beyond came later.
    pub transcript_len: usize,
}

impl Session {
    /// The latest import of the source (`format`, `source_session`).
    pub fn imported(&self, format: &str, source_session: &str) -> Option<&ImportedSource> {
        self.imports
            .iter()
            .find(|i| i.format == format && i.source_session == source_session)
    }
}

/// The digest of a prompt, as runs keep it.
pub fn prompt_digest(prompt: &str) -> String {
    blake3::hash(prompt.as_bytes()).to_hex()[..32].to_string()
}

mod keep;
mod misfit;
pub use misfit::{Misfit, ReplayError};
mod sends;
pub use sends::{Found, SendKey};
pub mod hosting;
pub mod point;
pub mod prunes;
mod steer;
pub mod uploads;
mod view;
pub use keep::{policy_acts, Expiry};
pub use steer::{push_steer, steer_blocks, PendingSteer, RunSteer, SteerDelivered, SteerSend};

impl Session {
    /// Replays `records` (seq and record, in log order).
    pub fn replay(
        records: impl IntoIterator<Item = (u64, Record)>,
    ) -> Result<Session, ReplayError> {
        let records = records.into_iter();
        let mut s = Session::default();
        s.transcript.reserve(records.size_hint().0 / 2);
        for (seq, record) in records {
            s.apply(seq, record)
                .map_err(|reason| ReplayError { seq, reason })?;
        }
        s.unresolved_calls = unresolved(&s.transcript);
        Ok(s)
    }

    /// Replays the records of a scanned WAL, decoding on worker threads while the records
    /// already decoded are applied here.
    pub fn replay_scan(scan: &broca_wal::Scan, bytes: &[u8]) -> Result<Session, ReplayError> {
        Session::default().replay_scan_into(scan, bytes)
    }

    /// A session that keeps the role's entries as records are applied (readers of
    /// `session.read` and `session.head`).
    pub fn with_entries() -> Session {
        Session {
            entries: Some(Default::default()),
            ..Session::default()
        }
    }

    /// [`Session::replay_scan`] into this (empty) session.
    pub fn replay_scan_into(
        mut self,
        scan: &broca_wal::Scan,
        bytes: &[u8],
    ) -> Result<Session, ReplayError> {
        let mut s = std::mem::take(&mut self);
        s.transcript.reserve(scan.frames.len() / 2);
        scan.decode_chunks(
            bytes,
            |records| {
                for (seq, record) in records {
                    s.apply(seq, record)
                        .map_err(|reason| ReplayError { seq, reason })?;
                }
                Ok(())
            },
            |offset, reason| ReplayError {
                seq: 0,
                reason: Misfit::Undecodable { offset, reason },
            },
        )?;
        s.unresolved_calls = unresolved(&s.transcript);
        Ok(s)
    }

    /// The run with `run_id`.
    pub fn run(&self, run_id: &str) -> Option<&RunView> {
        self.by_run_id.get(run_id).map(|&i| &self.runs[i])
    }

    fn open_mut(&mut self, run_id: &str) -> Result<(&mut OpenRun, &mut RunView), Misfit> {
        let open = self.open.as_mut().ok_or_else(|| Misfit::NoOpenRun {
            run_id: run_id.to_string(),
        })?;
        let run = &mut self.runs[open.index];
        if run.run_id != run_id {
            return Err(Misfit::NotTheOpenRun {
                run_id: run_id.to_string(),
                open: run.run_id.clone(),
            });
        }
        Ok((open, run))
    }

    /// Applies one record; the live actor calls this too, so replay and live agree.
    pub fn apply(&mut self, seq: u64, record: Record) -> Result<(), Misfit> {
        if let Some(t) = super::entries::activity_at(&record) {
            self.activity_ms = Some(self.activity_ms.map_or(t, |a| a.max(t)));
        }
        let entries_before = self.entry_count;
        let Some(mut entries) = self.entries.take() else {
            let applied = self.apply_record(seq, record);
            assert!(
                self.entry_count >= entries_before,
                "the entry count never goes down"
            );
            return applied;
        };
        let open = self.open.as_ref().map(|o| {
            let c = &self.runs[o.index].config;
            (o.index, format!("{}/{}", c.provider, c.model))
        });
        let note = match &record {
            Record::StepStarted(r) if !r.steers.is_empty() => self.steered_note(r),
            _ => super::entries::Note::of(seq, &record, self.runs.len(), open),
        };
        let before = self.transcript.len();
        let applied = self.apply_record(seq, record);
        if applied.is_ok() {
            entries.add(
                seq,
                note,
                &self.transcript[before.min(self.transcript.len())..],
            );
        }
        self.entries = Some(entries);
        assert!(
            self.entry_count >= entries_before,
            "the entry count never goes down"
        );
        applied
    }

    fn apply_record(&mut self, seq: u64, record: Record) -> Result<(), Misfit> {
        match record {
            Record::LeaseAcquired(_) | Record::Unknown { .. } | Record::RunResumed(_) => {}
            Record::SendQueued(q) => {
                self.note_input_cap(&q.config, false);
                self.note_interrupt(&q);
                self.queued.push(*q);
            }
            Record::SendSteered(r) => self.apply_steered(seq, r)?,
            Record::SendRetracted(r) => self.apply_retracted(r)?,
            Record::RunStarted(r) => self.apply_started(seq, *r)?,
            Record::StepStarted(r) => self.apply_step_started(seq, r)?,
            Record::ModelAttemptFinished(r) => self.apply_attempt(&r)?,
            Record::ModelStepFinished(r) => self.apply_step_finished(seq, *r)?,
            Record::ToolDispatchIntent(r) => {
                let (open, _) = self.open_mut(&r.run_id)?;
                let missing: Vec<String> =
                    r.calls.iter().map(|c: &ToolCall| c.id.clone()).collect();
                assert_eq!(missing.len(), r.calls.len(), "each call is awaited");
                open.point = ResumePoint::IntentOpen { missing };
                self.late.intent(&r);
            }
            Record::ToolResult(r) => self.apply_result(r)?,
            Record::CancelRequested(r) => {
                let (open, _) = self.open_mut(&r.run_id)?;
                open.cancel_requested = true;
            }
            Record::EpisodeImported(r) => self.apply_import(seq, *r)?,
            Record::RunPaused(r) => self.apply_paused(r)?,
            Record::RunFinished(r) => self.apply_finished(r)?,
            Record::UploadBegun(r) => self.apply_upload_begun(r)?,
            Record::UploadCommitted(r) => self.apply_upload_committed(r)?,
            Record::ContextCompacted(r) => self.apply_compacted(*r)?,
            // About a run already over: the session's conversation is as the run left it.
            Record::ToolResultLate(r) => self.late.recorded(&r),
            Record::SessionReleased(r) => {
                // The first release stands: a repeat is answered, never recorded again.
                if self.released.is_none() {
                    self.released = Some(r);
                }
            }
            Record::ReasoningPruned(r) => self.prunes.apply(&r),
            // Never a message: reads and the model's requests do not see it.
            Record::UserCommand(r) => self.commands.apply(&r),
            Record::SessionChange(r) => {
                self.change.apply(&r);
                self.apply_hosting(&r);
            }
            Record::ViewAccepted(r) => self.apply_view(*r)?,
        }
        Ok(())
    }

    /// A step's start: the open run's next step, its steers rendered.
    fn apply_step_started(
        &mut self,
        seq: u64,
        r: broca_wal::runrec::StepStarted,
    ) -> Result<(), Misfit> {
        let (open, run) = self.open_mut(&r.run_id)?;
        if open.step.checked_add(1) != Some(r.step) {
            return Err(Misfit::StepOutOfOrder {
                run_id: r.run_id,
                step: r.step,
                previous: open.step,
            });
        }
        open.step = r.step;
        open.point = ResumePoint::BeforeStep;
        open.step_seq = Some(seq);
        open.step_started_at = r.at_unix_ms;
        run.steps = run.steps.max(r.step);
        self.apply_step_steers(&r)
    }

    /// A failed model attempt: metered as the machine meters it (reported usage, or an
    /// answer begun).
    fn apply_attempt(&mut self, r: &broca_wal::runrec::ModelAttemptFinished) -> Result<(), Misfit> {
        let (_, run) = self.open_mut(&r.run_id)?;
        if r.usage.is_some() || r.answered {
            let prices = run.config.catalog.as_ref().and_then(|e| e.prices.as_ref());
            run.spend.add(r.step, r.attempt, r.usage.as_ref(), prices);
        }
        Ok(())
    }

    /// A run paused: waiting for its caller, its text and error as it left them.
    fn apply_paused(&mut self, r: broca_wal::runrec::RunPaused) -> Result<(), Misfit> {
        let text = final_text(&self.transcript);
        let (_, run) = self.open_mut(&r.run_id)?;
        run.state = RunState::Paused;
        run.final_text = text;
        run.error = r.error;
        run.detail = Some(r.reason);
        self.open = None;
        Ok(())
    }

    /// A summary stands in for older turns from here on: it covers more than the one before
    /// and ends where an assistant message starts, as the machine cuts.
    fn apply_compacted(&mut self, r: broca_wal::runrec::ContextCompacted) -> Result<(), Misfit> {
        let before = self.compacted.as_ref().map_or(0, |c| c.replaced);
        let len = self.transcript.len();
        let misfit = |why: &'static str| Misfit::CompactionMisfit {
            run_id: r.run_id.clone(),
            replaced: r.replaced,
            why,
        };
        let replaced = usize::try_from(r.replaced).unwrap_or(usize::MAX);
        if replaced <= before {
            return Err(misfit("it covers no more than the summary before it"));
        }
        if replaced >= len {
            return Err(misfit("it covers the whole conversation"));
        }
        if self.transcript[replaced].role != Role::Assistant {
            return Err(misfit(
                "the turns it keeps do not start at an assistant message",
            ));
        }
        let (open, run) = self.open_mut(&r.run_id)?;
        // The next request is estimated afresh, as the machine does once a summary is in.
        open.last_step = None;
        let prices = run.config.catalog.as_ref().and_then(|e| e.prices.as_ref());
        run.spend.add(r.step, 0, r.usage.as_ref(), prices);
        self.compacted = Some(super::compaction::Compacted {
            replaced,
            summary: Arc::new(super::compaction::summary_message(&r.summary)),
        });
        Ok(())
    }

    /// A run starts: its prompt (after the results of calls an interrupted run left open)
    /// joins the transcript, and it is the open run.
    fn apply_started(&mut self, seq: u64, r: broca_wal::runrec::RunStarted) -> Result<(), Misfit> {
        if let Some(open) = &self.open {
            return Err(Misfit::StartedWhileOpen {
                run_id: r.run_id.clone(),
                open: self.runs[open.index].run_id.clone(),
            });
        }
        if self.by_run_id.contains_key(&r.run_id) {
            return Err(Misfit::RunIdReused { run_id: r.run_id });
        }
        if let Some(sub) = &r.submission_id {
            let Some(i) = self.queued.iter().position(|q| &q.submission_id == sub) else {
                return Err(Misfit::SubmissionNotQueued {
                    run_id: r.run_id.clone(),
                    submission_id: sub.clone(),
                });
            };
            self.queued.remove(i);
        }
        self.apply_steer_turn(&r, self.runs.len())?;
        self.late.started();
        self.imported_pending.clear();
        self.entry_count += 1;
        self.note_input_cap(&r.config, true);
        let mut content: Vec<Block> = r
            .resolved_calls
            .iter()
            .map(|b| Block::ToolResult {
                tool_use_id: b.call_id.clone(),
                content: b.content.clone(),
                is_error: b.is_error,
            })
            .collect();
        content.extend(user_blocks(&r.prompt, &r.media));
        self.transcript.push(Arc::new(Message {
            role: Role::User,
            content,
        }));
        let index = self.runs.len();
        if self.usage.is_none() {
            self.usage = Some(cortexkit_role_llm_runner::usage::SessionUsage::new(
                r.run_id.clone(),
            ));
        }
        self.by_run_id.insert(r.run_id.clone(), index);
        let keyed = r.send_id.clone().map(|id| (r.principal.clone(), id));
        self.runs.push(RunView::started(seq, r));
        if let Some((principal, send_id)) = keyed {
            // After the push: a session's first run names its owners.
            let key = self.send_key(principal.as_deref(), &send_id);
            self.by_send_id.insert(key, index);
        }
        assert_eq!(self.runs.len(), index + 1);
        assert_eq!(
            self.by_run_id.len(),
            self.runs.len(),
            "every run is found by its id"
        );
        self.open = Some(OpenRun {
            index,
            step: 0,
            point: ResumePoint::ToolsDone,
            cancel_requested: false,
            last_step: None,
            step_seq: None,
            step_started_at: None,
        });
        Ok(())
    }

    /// A model step's answer: the assistant message joins the transcript, the run's usage
    /// and spend count it, and the run resumes after it.
    fn apply_step_finished(
        &mut self,
        seq: u64,
        r: broca_wal::runrec::ModelStepFinished,
    ) -> Result<(), Misfit> {
        self.entry_count += 1;
        let ordinal = self.entry_count;
        self.last_assistant_mid = Some(assistant_mid(seq, &r).to_string());
        let total = self.usage.as_mut();
        let open = self.open.as_mut().ok_or_else(|| Misfit::NoOpenRun {
            run_id: r.run_id.clone(),
        })?;
        let run = &mut self.runs[open.index];
        if run.run_id != r.run_id {
            return Err(Misfit::NotTheOpenRun {
                run_id: r.run_id.clone(),
                open: run.run_id.clone(),
            });
        }
        let asked_tools = r.content.iter().any(|b| matches!(b, Block::ToolUse { .. }));
        run.last_finish = Some((r.finish_reason.clone(), asked_tools));
        let step = super::spend::step_usage(&r.usage);
        if let Some(total) = total {
            total.record_step(&run.config.provider, &run.config.model, None, step.clone());
        }
        run.step_usage
            .record_step(&run.config.provider, &run.config.model, None, step);
        let has_text = r
            .content
            .iter()
            .any(|b| matches!(b, Block::Text { text } if !text.is_empty()));
        run.last_assistant = Some((ordinal, assistant_mid(seq, &r), has_text));
        let prices = run.config.catalog.as_ref().and_then(|e| e.prices.as_ref());
        run.spend.add(r.step, r.attempt, Some(&r.usage), prices);
        if r.quota.is_some() {
            run.quota = r.quota.clone();
        }
        open.point = ResumePoint::AfterStep {
            usage: r.usage,
            finish_reason: r.finish_reason.clone(),
        };
        let message = Message {
            role: Role::Assistant,
            content: r.content,
        };
        let text = message.text();
        if !text.is_empty() {
            run.final_text = Some(text);
        }
        self.input.add(&r.usage);
        self.transcript.push(Arc::new(message));
        let transcript_len = self.transcript.len();
        if let Some(open) = self.open.as_mut() {
            open.last_step = Some(LastStep {
                usage: r.usage,
                transcript_len,
            });
        }
        Ok(())
    }

    /// A tool call's result: the intent waits for one call less.
    fn apply_result(&mut self, r: broca_wal::runrec::ToolResult) -> Result<(), Misfit> {
        self.entry_count += 1;
        let (open, _) = self.open_mut(&r.run_id)?;
        if let ResumePoint::IntentOpen { missing } = &mut open.point {
            let Some(i) = missing.iter().position(|id| *id == r.result.call_id) else {
                return Err(Misfit::StrayResult {
                    call_id: r.result.call_id,
                    batch_id: r.batch_id,
                });
            };
            let waiting = missing.len();
            missing.remove(i);
            assert_eq!(missing.len() + 1, waiting, "a result answers one call");
            if missing.is_empty() {
                open.point = ResumePoint::ToolsDone;
            }
        }
        push_result(&mut self.transcript, r.result);
        Ok(())
    }

    /// A run's terminal record: the run is over and no run is open.
    fn apply_finished(&mut self, r: broca_wal::runrec::RunFinished) -> Result<(), Misfit> {
        let text = final_text(&self.transcript);
        let (_, run) = self.open_mut(&r.run_id)?;
        run.state = RunState::Finished(r.reason);
        run.final_text = text;
        run.detail = r.detail;
        run.error = r.error;
        run.indeterminate_tool_calls = r.indeterminate_tool_calls.clone();
        run.interrupt_cause = r.cause;
        run.budget = r.budget;
        run.structured_output = r.structured_output;
        self.late.finished(&r.run_id, &r.indeterminate_tool_calls);
        self.open = None;
        Ok(())
    }

    /// An imported episode: its messages join the transcript; the source's import is noted.
    fn apply_import(
        &mut self,
        seq: u64,
        r: broca_wal::importrec::EpisodeImported,
    ) -> Result<(), Misfit> {
        if let Some(open) = &self.open {
            return Err(Misfit::ImportWhileOpen {
                import_id: r.import_id,
                open: self.runs[open.index].run_id.clone(),
            });
        }
        self.entry_count += r.messages.len() as u64;
        if let Some(i) = r.messages.iter().rposition(|m| m.role == Role::Assistant) {
            self.last_assistant_mid = Some(super::entries::imported_mid(seq, i));
        }
        let before = self.transcript.len();
        let added = r.messages.len();
        self.transcript.extend(r.messages.into_iter().map(Arc::new));
        assert_eq!(
            self.transcript.len(),
            before + added,
            "every imported message joins"
        );
        self.imported_pending = r.pending;
        let o = r.origin;
        let entry = ImportedSource {
            format: o.format,
            source_session: o.source_session,
            import_id: r.import_id,
            bytes: o.bytes,
            blake3: o.blake3,
            last_line: o.last_line,
            transcript_len: self.transcript.len(),
        };
        match self
            .imports
            .iter_mut()
            .find(|i| i.format == entry.format && i.source_session == entry.source_session)
        {
            Some(prior) => *prior = entry,
            None => self.imports.push(entry),
        }
        self.unresolved_calls = unresolved(&self.transcript);
        Ok(())
    }

    /// Recomputes the unresolved calls (after live appends).
    pub fn refresh_unresolved(&mut self) {
        self.unresolved_calls = unresolved(&self.transcript);
    }
}

pub use crate::entries::assistant_mid;

/// The text of the last assistant message that has text.
fn final_text(transcript: &[Arc<Message>]) -> Option<String> {
    transcript
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.text())
        .find(|t| !t.is_empty())
}

/// Ids of the tool calls of the last assistant message that no later message answers.
fn unresolved(transcript: &[Arc<Message>]) -> Vec<String> {
    unanswered_calls(transcript)
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// The tool calls of the last assistant message that no later message answers.
pub(crate) fn unanswered_calls(transcript: &[Arc<Message>]) -> Vec<ToolCall> {
    let Some(last_assistant) = transcript.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let answered: Vec<&str> = transcript[last_assistant + 1..]
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
        .collect();
    transcript[last_assistant]
        .tool_calls()
        .filter(|c| !answered.contains(&c.id.as_str()))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
