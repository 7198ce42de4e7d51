//! The llm-runner/v1 role's answers over a replayed session: `session.read` pages and
//! `session.head` (`Session::with_entries`), `run.result` and `run.status`, with the role
//! crate's own types. broca never
//! rewrites a session's history (its WAL is append-only and a recovery only drops a torn
//! tail nobody was answered from), so a session record's history version is fixed: the first
//! record's is [`HISTORY_VERSION`], one made after a record expired (its retention, handed in
//! by the caller) the next; the incarnation is the WAL's lineage, new whenever the log is made
//! anew.

use cortexkit_role_llm_runner::read::{
    HeadMeta, LastRunError, LastRunState, ReadMessage, ReadMode, ReadPage, ReadRequest,
    RetryAfterSecs, RunAttribution, ToolCallAttribution, ToolTime,
};

use cortexkit_role_llm_runner::finish::Finish;
use cortexkit_role_llm_runner::run::{
    BudgetExhaustedDetail, FinalMessage, RunError, RunResult, RunStatus,
};
use cortexkit_role_llm_runner::session_retention::{
    Keep, Released, RetentionPolicy, RetentionSource, RetentionState,
};

use broca_core::replay::{RunState, RunView, Session};
use broca_protocol::FinishReason;
use broca_wal::runrec::FinishKind;

/// The history version of a session's first record.
pub const HISTORY_VERSION: u64 = 1;
/// `session.read`'s byte cap: the default and the largest honoured (below the 4 MiB frame),
/// as `role.describe` states them.
pub const READ_MAX_BYTES_DEFAULT: u64 = broca_wire::role::READ_MAX_BYTES.0;
pub const READ_MAX_BYTES_MAX: u64 = broca_wire::role::READ_MAX_BYTES.1;
/// `session.read`'s message count: the default and the largest honoured.
pub const READ_LIMIT_DEFAULT: u64 = 200;
pub const READ_LIMIT_MAX: u64 = 500;

/// Why a read was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadRefusal {
    /// `invalid_params` naming `field`.
    Invalid { field: &'static str, why: String },
    /// `history_changed`: the request names another history version.
    HistoryChanged(u64),
    /// `unknown_mid`.
    UnknownMid(String),
}

/// The role's name for the terminal state a run that ended `kind` is in.
pub fn finish_state(kind: FinishKind) -> &'static str {
    match kind {
        // broca's total-token or cost budget: a budget the run exhausted, or one it could
        // not measure.
        FinishKind::BudgetExhausted | FinishKind::BudgetUnmeasured => {
            cortexkit_role_llm_runner::run::states::BUDGET_EXHAUSTED
        }
        FinishKind::ContextLimit => cortexkit_role_llm_runner::run::states::CONTEXT_CEILING,
        other => other.as_str(),
    }
}

/// A run's state as the role names it, and its reason when it has one.
pub fn run_state(run: &RunView) -> (&'static str, Option<String>) {
    match run.state {
        RunState::Active => ("active", None),
        RunState::Paused => ("paused", run.detail.clone()),
        RunState::Finished(FinishKind::Interrupted) => ("interrupted", run.interrupt_cause.clone()),
        RunState::Finished(kind) => (finish_state(kind), None),
    }
}

/// Whether the run has its terminal record (a paused run waits for its caller).
fn ended(run: &RunView) -> bool {
    matches!(run.state, RunState::Finished(_))
}

/// The session's entries (none for a session replayed without them).
pub(crate) fn entries_of(s: &Session) -> &[broca_core::entries::Entry] {
    s.entries.as_ref().map_or(&[], |e| e.list.as_slice())
}

/// What a read entry carries beside the role's envelope.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Facts {
    /// `include_display_facts`: the send's client id and each call's times.
    pub display: bool,
    /// How media and large payloads are served (`media`).
    pub media: cortexkit_role_llm_runner::read::MediaMode,
    /// The runner declares `archive_prunes_reasoning`: an entry served without digests
    /// names its parts' keys (`part_keys`).
    pub part_keys: bool,
}

/// What a descriptors read leaves for the entry around its message (its envelope): fixed, so
/// the same message is always described the same way.
const ENVELOPE_ALLOWANCE: usize = 64 * 1024;

/// The read entry at `index` (ordinal `index + 1`).
pub(crate) fn entry(
    s: &Session,
    index: usize,
    last_of_run: &[Option<usize>],
    facts: Facts,
) -> ReadMessage {
    let e = &entries_of(s)[index];
    let stored = e.body.to_json();
    let keys = facts.part_keys.then(|| crate::media::part_keys(&stored));
    let (message, digests) = crate::media::render(stored.clone(), facts.media, ENVELOPE_ALLOWANCE)
        .unwrap_or_else(|_| (crate::media::with_markers(stored, "not_requested"), None));
    let mut m = ReadMessage::new(index as u64 + 1, e.mid.clone(), message).with_role(e.role);
    match digests {
        Some((digest, mut rows)) => {
            // A pruned message keeps its write-time digests (its parts' keys are their
            // indexes).
            if let Some(p) = s.prunes.messages.get(&e.mid) {
                m.digest = Some(p.digest.clone());
                for part in &p.parts {
                    if let Some(row) = rows.get_mut(part.index as usize) {
                        row.digest = part.sha256.clone();
                    }
                }
            } else {
                m.digest = Some(digest);
            }
            m.part_digests = Some(rows);
        }
        None => {
            if let Some(keys) = keys {
                m = m.with_part_keys(keys);
            }
        }
    }
    if let Some(at) = e.written_at {
        m = m.with_written_at(at);
    }
    if let Some(run) = e.run.and_then(|r| s.runs.get(r).map(|v| (r, v))) {
        let (r, view) = run;
        m = m.with_run(RunAttribution {
            run_id: view.run_id.clone(),
            episode: view.run_id.clone(),
            is_final: ended(view) && last_of_run.get(r).copied().flatten() == Some(index),
        });
    }
    if !e.calls.is_empty() {
        m = m.with_tool_calls(e.calls.iter().map(attribution).collect());
    }
    if let Some((mode, call_key)) = &e.delivered_as {
        let mut d = cortexkit_role_llm_runner::delivery_order::EntryDelivery::new(mode_of(mode));
        if let Some(key) = call_key {
            d = d.with_call_key(key.clone());
        }
        m = m.with_delivered_as(d);
    }
    if facts.display {
        if let Some(id) = &e.client_message_id {
            m = m.with_client_message_id(id.clone());
        }
        if !e.calls.is_empty() {
            m = m.with_tool_times(e.calls.iter().map(tool_time).collect());
        }
    }
    m
}

/// A recorded mode's name as the role's mode (an unknown one, never written, reads as
/// `steer`: every mode but `turn_system` is at user authority).
fn mode_of(mode: &str) -> cortexkit_role_llm_runner::delivery_order::Mode {
    use cortexkit_role_llm_runner::delivery_order::{modes, Mode};
    match mode {
        modes::TOOL_RESULT => Mode::ToolResult,
        modes::TURN_SYSTEM => Mode::TurnSystem,
        modes::IDLE_START => Mode::IdleStart,
        _ => Mode::Steer,
    }
}

/// A call's `dispatch_attribution`.
fn attribution(c: &broca_core::entries::CallFacts) -> ToolCallAttribution {
    let mut a = ToolCallAttribution::new(c.id.clone()).with_indeterminate(c.indeterminate());
    if let Some(key) = &c.call_key {
        a = a.with_call_key(key.clone());
    }
    if let Some(module) = &c.dispatched_to {
        a = a.with_dispatched_to(module.clone());
    }
    a
}

/// A call's stored times and unanswered outcome (`include_display_facts`).
fn tool_time(c: &broca_core::entries::CallFacts) -> ToolTime {
    let mut t = ToolTime::new(c.id.clone());
    if let Some(at) = c.started_at {
        t = t.with_started_at(at);
    }
    if let Some(at) = c.result.as_ref().and_then(|r| r.finished_at) {
        t = t.with_finished_at(at);
    }
    if let Some(why) = c.unanswered() {
        t = t.with_unanswered(why);
    }
    if let Some(key) = &c.call_key {
        t = t.with_call_key(key.clone());
    }
    if let Some(pin) = &c.schema_pin {
        t = t.with_schema_pin(pin.clone());
    }
    t
}

/// The index of each run's last entry.
pub(crate) fn last_entries(s: &Session) -> Vec<Option<usize>> {
    let mut last = vec![None; s.runs.len()];
    if let Some(entries) = &s.entries {
        for (i, e) in entries.list.iter().enumerate() {
            if let Some(slot) = e.run.and_then(|r| last.get_mut(r)) {
                *slot = Some(i);
            }
        }
    }
    last
}

pub(crate) fn size(m: &ReadMessage) -> u64 {
    serde_json::to_vec(m).map_or(0, |b| b.len() as u64)
}

/// A `session.read` page of `s` (replayed with its entries; `None` for a session never
/// written) under `incarnation`.
pub fn read_page(
    s: Option<&Session>,
    version: u64,
    incarnation: &str,
    req: &ReadRequest,
    part_keys: bool,
) -> Result<ReadPage, ReadRefusal> {
    let mode = req.mode().map_err(|field| ReadRefusal::Invalid {
        field,
        why: match field {
            "from_ordinal" => "`after_mid` and `from_ordinal` exclude each other".into(),
            _ => "`after_mid` needs the `history_version` it came from".into(),
        },
    })?;
    if let Some(v) = req.history_version.filter(|v| *v != version) {
        return Err(ReadRefusal::HistoryChanged(v));
    }
    let bounds = page_bounds(req.limit, req.max_bytes).map_err(|e| ReadRefusal::Invalid {
        field: "limit",
        why: e.to_string(),
    })?;
    let facts = Facts {
        display: req.include_display_facts,
        media: req.media.unwrap_or_default(),
        part_keys,
    };
    let total = s
        .and_then(|s| s.entries.as_ref())
        .map_or(0, |e| e.list.len());
    let start = match mode {
        ReadMode::Range { from_ordinal } => {
            from_ordinal.saturating_sub(1).min(total as u64) as usize
        }
        ReadMode::After { mid, .. } => {
            let found = s
                .and_then(|s| s.entries.as_ref())
                .and_then(|e| e.position(mid));
            found.ok_or_else(|| ReadRefusal::UnknownMid(mid.to_string()))? + 1
        }
        ReadMode::Tail => {
            return Ok(match s {
                Some(s) => tail_page(s, version, incarnation, total, bounds, facts),
                None => ReadPage::empty(version, incarnation),
            })
        }
    };
    Ok(match s {
        Some(s) => forward_page(s, version, incarnation, start, total, bounds, facts),
        None => ReadPage::empty(version, incarnation),
    })
}

/// A page's bounds: at most this many messages, and this many bytes (a page holds at least
/// one message whatever its size).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    limit: usize,
    bytes_max: u64,
}

impl Bounds {
    /// Whether a page of `messages` and `bytes` has room for one more of `n` bytes.
    pub(crate) fn room(&self, messages: usize, bytes: u64, n: u64) -> bool {
        messages == 0 || (messages < self.limit && bytes + n <= self.bytes_max)
    }

    /// Whether a page of `messages` and `bytes` keeps the bounds: at most the limit, and
    /// within the bytes unless it is one message (a page always holds the first).
    pub(crate) fn holds(&self, messages: usize, bytes: u64) -> bool {
        messages <= self.limit && (messages <= 1 || bytes <= self.bytes_max)
    }
}

/// A page asked for with a `limit` of 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZeroLimit;

impl std::fmt::Display for ZeroLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("`limit` must be at least 1")
    }
}

/// The bounds a page asks for (`limit` messages, `max_bytes`), within the role's limits; the
/// refusal of a `limit` of 0.
pub(crate) fn page_bounds(limit: Option<u64>, max_bytes: Option<u64>) -> Result<Bounds, ZeroLimit> {
    let limit = match limit {
        Some(0) => return Err(ZeroLimit),
        Some(n) => n.min(READ_LIMIT_MAX),
        None => READ_LIMIT_DEFAULT,
    } as usize;
    let bytes_max = max_bytes
        .unwrap_or(READ_MAX_BYTES_DEFAULT)
        .min(READ_MAX_BYTES_MAX);
    assert!(limit >= 1 && limit <= READ_LIMIT_MAX as usize);
    Ok(Bounds { limit, bytes_max })
}

/// The newest entries that fit, gathered backwards; the oldest of them first.
fn tail_page(
    s: &Session,
    version: u64,
    incarnation: &str,
    total: usize,
    bounds: Bounds,
    facts: Facts,
) -> ReadPage {
    let last = last_entries(s);
    let mut messages = Vec::new();
    let mut bytes = 0;
    for i in (0..total).rev() {
        let m = entry(s, i, &last, facts);
        let n = size(&m);
        if !bounds.room(messages.len(), bytes, n) {
            break;
        }
        bytes += n;
        messages.push(m);
    }
    assert!(
        bounds.holds(messages.len(), bytes),
        "a page keeps its bounds"
    );
    messages.reverse();
    pruned_page(s, ReadPage::new(version, incarnation, messages))
}

/// The rows of the pruned parts `mids`' messages serve (`pruned_reasoning`).
pub(crate) fn pruned_rows<'a>(
    s: &Session,
    mids: impl Iterator<Item = &'a str>,
) -> Vec<cortexkit_role_llm_runner::archive_prunes_reasoning::PrunedReasoning> {
    if s.prunes.messages.is_empty() {
        return Vec::new();
    }
    mids.flat_map(|mid| s.prunes.rows(mid)).collect()
}

/// `page` with what the session's prunes left: the rows of the pruned parts it serves, and
/// the session's prune state.
fn pruned_page(s: &Session, page: ReadPage) -> ReadPage {
    let rows = pruned_rows(s, page.messages.iter().map(|m| m.mid.as_str()));
    let page = match s.prunes.state {
        Some(state) => page.with_reasoning_pruned(state),
        None => page,
    };
    if rows.is_empty() {
        page
    } else {
        page.with_pruned_reasoning(rows)
    }
}

/// The entries from index `start` that fit, and where the next page starts.
fn forward_page(
    s: &Session,
    version: u64,
    incarnation: &str,
    start: usize,
    total: usize,
    bounds: Bounds,
    facts: Facts,
) -> ReadPage {
    let last = last_entries(s);
    let mut messages = Vec::new();
    let mut bytes = 0;
    let mut next = start;
    while next < total {
        let m = entry(s, next, &last, facts);
        let n = size(&m);
        if !bounds.room(messages.len(), bytes, n) {
            break;
        }
        bytes += n;
        messages.push(m);
        next += 1;
    }
    assert!(
        bounds.holds(messages.len(), bytes),
        "a page keeps its bounds"
    );
    debug_assert_eq!(
        next,
        start + messages.len(),
        "the next page starts after this one"
    );
    let page = pruned_page(s, ReadPage::new(version, incarnation, messages));
    if next < total {
        page.with_next_from_ordinal(next as u64 + 1)
    } else {
        page
    }
}

/// `session.head` of `s` (replayed with its entries; `None` for a session never written).
pub fn head(s: Option<&Session>, version: u64, incarnation: &str) -> HeadMeta {
    let Some(s) = s else {
        return HeadMeta::empty(version, incarnation);
    };
    let Some(updated_at) = s.entries.as_ref().and_then(|e| e.updated_at) else {
        return HeadMeta::empty(version, incarnation);
    };
    let mut head = HeadMeta::new(version, incarnation, 1, updated_at);
    let entries = entries_of(s);
    debug_assert!(
        version >= 1,
        "a written session's history version starts at 1"
    );
    if !entries.is_empty() {
        head = head.with_last_ordinal(entries.len() as u64);
    }
    head.usage = s.usage.clone();
    if let Some(run) = s.runs.last() {
        let (state, reason) = run_state(run);
        head.last_run_state = Some(LastRunState {
            run_id: run.run_id.clone(),
            state: state.to_string(),
            reason,
        });
        if state == "error" {
            // The same figures as the run's `run.status` error, from the same record.
            head.last_run_error = run.error.as_ref().map(|e| {
                let error = LastRunError::new(e.class.as_str());
                match e
                    .retry_after_ms
                    .and_then(|ms| RetryAfterSecs::new(ms as f64 / 1000.0))
                {
                    Some(secs) => error.with_retry_after_secs(secs),
                    None => error,
                }
            });
        }
        head.input = Some(head_input(&run.config));
    }
    let (policy, state) = retention_state(s);
    head = head.with_retention_policy(policy, state);
    if let (Some(r), Some(delete_after_ms)) = (&s.released, s.release_deadline()) {
        head = head.with_released(Released::new(r.at_unix_ms, delete_after_ms));
    }
    if let Some(state) = s.prunes.state {
        head = head.with_reasoning_pruned(state);
    }
    head
}

/// The session's storage policy as `session.head` states it (llm-runner/v1
/// `session_retention`): the one its sends froze (`starter`), else the runner's own, kept
/// forever (`runner`). broca keeps no request dumps, so one asked for is flagged.
pub fn retention_state(s: &Session) -> (RetentionPolicy, RetentionState) {
    let (policy, state) = match &s.policy {
        Some(p) => (p.clone(), RetentionState::new(RetentionSource::starter())),
        None => (
            RetentionPolicy::new(Keep::forever(), 0, false, false),
            RetentionState::new(RetentionSource::runner()),
        ),
    };
    let state = if policy.request_dumps {
        state.with_request_dumps_unsupported()
    } else {
        state
    };
    (policy, state)
}

/// What a send naming no model can carry (`session.head.input`): the latest run's model, as
/// its frozen catalog entry and its wire family say. A family that renders no media says
/// `no`; so does a catalog that states modalities without any media broca carries.
pub fn head_input(
    config: &broca_wal::runrec::FrozenConfig,
) -> cortexkit_role_llm_runner::read::HeadInput {
    use cortexkit_role_llm_runner::read::{attachments, HeadInput};
    let facts = config.input_facts();
    let mimes = facts.mimes(config.family());
    let mut input = HeadInput::new(if mimes.is_empty() {
        attachments::NO
    } else {
        attachments::YES
    });
    if let Some(m) = facts.modalities {
        input = input.with_modalities(m);
    }
    if !mimes.is_empty() {
        input = input.with_mime_types(mimes);
    }
    input
}

/// The normalized finish of the run's last model step (absent when no step ran).
pub fn finish(run: &RunView) -> Option<Finish> {
    let (reason, asked_tools) = run.last_finish.as_ref()?;
    Some(match reason {
        FinishReason::EndTurn | FinishReason::StopSequence if *asked_tools => Finish::ToolCalls,
        FinishReason::EndTurn | FinishReason::StopSequence => Finish::Stop,
        FinishReason::ToolUse => Finish::ToolCalls,
        FinishReason::MaxTokens => Finish::Length,
        FinishReason::Other(raw) => match raw.as_str() {
            "refusal" | "content_filter" | "SAFETY" | "content_filtered" => Finish::ContentFilter,
            "model_context_window_exceeded" | "length" | "MAX_TOKENS" => Finish::Length,
            _ => Finish::Other,
        },
    })
}

/// A run error as the role carries it: broca's class, also as the `provider_code` (the
/// role's codes name provider refusals broca classifies by class).
fn run_error(e: &broca_protocol::ClassifiedError) -> RunError {
    let mut error = RunError::new(e.class.as_str(), e.message.clone(), e.class.as_str());
    if let Some(ms) = e.retry_after_ms {
        error = error.with_retry_after_secs(ms as f64 / 1000.0);
    }
    error
}

/// `run.result` of `run`.
pub fn run_result(run: &RunView) -> RunResult {
    let (state, reason) = run_state(run);
    let mut r = RunResult::new(run.run_id.clone(), state);
    r.reason = reason;
    r.error = run
        .error
        .as_ref()
        .filter(|_| state == "error")
        .map(run_error);
    if ended(run) {
        r.final_message = run
            .last_assistant
            .as_ref()
            .map(|&(ordinal, seq, has_text)| FinalMessage {
                ordinal,
                mid: seq.to_string(),
                // The last assistant message's text parts, joined as they came: the run's
                // final text when it has any (the last message with text), else none.
                text: if has_text {
                    run.final_text.clone().unwrap_or_default()
                } else {
                    String::new()
                },
            });
        r.finish = finish(run);
        r.directives = directives(run, r.final_message.as_ref());
        r.structured_output = run
            .structured_output
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
    }
    // A budget's stop: its limit, what was measured as spent, and why; the budget it was
    // (the session's input cap, or the run's token or cost budget) is the reason.
    if let Some(b) = run
        .budget
        .as_ref()
        .filter(|_| state == cortexkit_role_llm_runner::run::states::BUDGET_EXHAUSTED)
    {
        r.detail = Some(BudgetExhaustedDetail::new(
            b.limit,
            b.spent,
            b.cause.clone(),
        ));
        r.reason = Some(b.measure.clone());
    }
    r.usage = Some(run.step_usage.clone());
    r
}

/// The directives a completed run's final reply ends with, when the run was admitted asking
/// for them (llm-runner/v1 `turn_directives`): read from the final text exactly as
/// `run.result` states it, never edited; absent when none is found.
fn directives(
    run: &RunView,
    final_message: Option<&FinalMessage>,
) -> Option<Vec<cortexkit_role_llm_runner::directives::Directive>> {
    if run.state != RunState::Finished(FinishKind::Completed)
        || !run.config.directives.iter().any(|d| d == "wake")
    {
        return None;
    }
    let wake = cortexkit_role_llm_runner::directives::parse_trailing(&final_message?.text)?;
    Some(vec![wake.into()])
}

/// `run.status` of `run`.
pub fn run_status(run: &RunView) -> RunStatus {
    let result = run_result(run);
    let mut s = RunStatus::new(result.state);
    s.reason = result.reason.map(Into::into);
    s.error = result.error;
    s.finish = result.finish;
    s.usage = result.usage;
    s.detail = result.detail;
    s.directives = result.directives;
    s.structured_output = result.structured_output;
    // broca tracks every steer a run accepts: an ended run always lists those it did not
    // render (none: an empty list).
    if ended(run) {
        s = s.with_undelivered_steers(
            run.steers
                .iter()
                .filter(|st| !st.rendered)
                .filter_map(|st| st.send_id.clone())
                .collect(),
        );
    }
    s
}
