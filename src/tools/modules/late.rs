//! Held calls and late results of tool modules (tool-provider/v1 §4.1 `held-reply/v1`, §7).
//! A module that declares the `late_results` session capability may answer a call with a
//! held first reply (interim content: a person must consent, or the work goes on); the
//! call then waits for its answer, the terminal `late_results` entry of its call key, which
//! broca pulls on its own route to the module while any call of it waits (every
//! [`LATE_POLL`]), at most [`HELD_MAX`] (the role's retention of an unacked result).
//!
//! One poller at a time for the whole module (a waiting call, or shard 0's sweep every
//! `late_poll` of the tools config); each terminal entry is handed to the call that waits
//! for it (a call of a module that serves late results waits from before it is sent, so an
//! answer that comes before the held reply is kept for it). An entry no call waits for (its
//! call was sealed without an outcome by a restart) goes to the host's [`LateSink`], which
//! records it in its session durably. Entries are taken once (deduplicated on their event
//! id). A read is acked through its cursor once each of its entries went to a call or was
//! recorded; when one could not be recorded, the cursor stays and the read comes again.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use broca_subc::toolprov::late::{self, LateCursor, Read, Settled};
use broca_subc::toolprov::Reply;

use crate::late::{LateResult, LateSink};

/// How often a waiting call's module is asked for late results.
pub const LATE_POLL: Duration = Duration::from_millis(500);
/// How long a held call waits for its late result at most.
pub const HELD_MAX: Duration = Duration::from_secs(24 * 3600);
/// Event ids remembered per module for deduplication; past it the set starts over (an entry
/// seen again after that is dropped by its call no longer waiting).
const SEEN_MAX: usize = 100_000;
/// Reads of one poll at most (each up to `late::READ_LIMIT` entries).
const READS_MAX: usize = 16;

/// The late-result state of every module.
#[derive(Default)]
pub(super) struct LateBook {
    modules: Mutex<HashMap<String, Book>>,
}

#[derive(Default)]
struct Book {
    waiting: HashSet<String>,
    answers: HashMap<String, Settled>,
    cursor: Option<LateCursor>,
    seen: HashSet<String>,
    polling: bool,
}

impl LateBook {
    fn with<T>(&self, module: &str, f: impl FnOnce(&mut Book) -> T) -> Option<T> {
        let mut m = self.modules.lock().ok()?;
        Some(f(m.entry(module.to_string()).or_default()))
    }

    pub(super) fn wait_for(&self, module: &str, call_key: &str) {
        self.with(module, |b| b.waiting.insert(call_key.to_string()));
    }

    /// The call's answer, when it came (the call no longer waits).
    pub(super) fn take(&self, module: &str, call_key: &str) -> Option<Settled> {
        self.with(module, |b| {
            debug_assert!(
                b.answers.keys().all(|k| b.waiting.contains(k)),
                "an answer is kept only for a call that waits"
            );
            let got = b.answers.remove(call_key);
            if got.is_some() {
                b.waiting.remove(call_key);
            }
            got
        })
        .flatten()
    }

    pub(super) fn give_up(&self, module: &str, call_key: &str) {
        self.with(module, |b| {
            b.waiting.remove(call_key);
            b.answers.remove(call_key);
        });
    }

    /// Whether this caller is the module's poller now (then it calls `polled` after).
    pub(super) fn try_poll(&self, module: &str) -> bool {
        self.with(module, |b| !std::mem::replace(&mut b.polling, true))
            .unwrap_or(false)
    }

    pub(super) fn polled(&self, module: &str) {
        self.with(module, |b| {
            debug_assert!(b.polling, "only the module's poller ends its poll");
            b.polling = false;
        });
    }

    pub(super) fn cursor(&self, module: &str) -> Option<LateCursor> {
        self.with(module, |b| b.cursor.clone()).flatten()
    }

    /// Takes one read's new entries: each terminal one to its waiting call; answers those
    /// no call waits for.
    pub(super) fn take_read(&self, module: &str, reply: &late::LateRead) -> Vec<LateResult> {
        self.with(module, |b| {
            let mut unclaimed = Vec::new();
            for e in &reply.entries {
                debug_assert!(
                    b.seen.len() <= SEEN_MAX,
                    "the ids seen stay within their bound"
                );
                if b.seen.len() >= SEEN_MAX {
                    b.seen.clear();
                }
                if !b.seen.insert(e.event_id.clone()) {
                    continue;
                }
                if broca_wal::cmdrec::is_command_key(&e.call_key) {
                    // A person-only command's progress or result: its session records it
                    // for the command, durably before the entry is acked.
                    if let Some(update) = super::command::update(e) {
                        unclaimed.push(command_entry(module, e, update));
                    }
                    continue;
                }
                match late::settle(module, e) {
                    Settled::Note(note) => {
                        tracing::info!(module, call_key = %e.call_key, "late entry: {note}");
                    }
                    settled if b.waiting.contains(&e.call_key) => {
                        b.answers.insert(e.call_key.clone(), settled);
                    }
                    settled => unclaimed.push(late_result(module, e, settled)),
                }
            }
            unclaimed
        })
        .unwrap_or_default()
    }

    /// The read went through: the next starts after it.
    pub(super) fn advance(&self, module: &str, cursor: &LateCursor) {
        self.with(module, |b| b.cursor = Some(cursor.clone()));
    }

    /// These entries were not recorded: taken again when they come again.
    pub(super) fn unsee(&self, module: &str, event_ids: &[String]) {
        self.with(module, |b| {
            for id in event_ids {
                b.seen.remove(id);
            }
        });
    }

    /// The cursor was refused: read from the start (the event ids deduplicate).
    pub(super) fn read_from_start(&self, module: &str) {
        self.with(module, |b| b.cursor = None);
    }
}

impl super::ModuleTools {
    /// One poll of `module`'s late results: reads until none are waiting (at most
    /// `READS_MAX` reads), each acked when it may be.
    pub(super) async fn poll_late(&self, module: &str) {
        let mut restarted = false;
        for _ in 0..READS_MAX {
            let since = self.late.cursor(module);
            let frame = match self
                .ask(module, "late-results", late::read_request(since.as_ref()))
                .await
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(module, "late_results: {e}");
                    return;
                }
            };
            match late::read_answer(module, &frame) {
                Read::Entries(reply) => {
                    let unclaimed = self.late.take_read(module, &reply);
                    let failed = self.record_unclaimed(unclaimed).await;
                    if !failed.is_empty() {
                        // The cursor stays: the read comes again, and these with it.
                        self.late.unsee(module, &failed);
                        return;
                    }
                    self.late.advance(module, &reply.cursor);
                    if !reply.entries.is_empty() {
                        let ack = late::ack_request(&reply.cursor);
                        if let Err(e) = self.ask(module, "late-results", ack).await {
                            tracing::warn!(module, "late_results.ack: {e}");
                        }
                    }
                    if !reply.more {
                        return;
                    }
                }
                Read::FromStart if !restarted => {
                    restarted = true;
                    self.late.read_from_start(module);
                }
                Read::FromStart => return,
                Read::Failed(why) => {
                    tracing::warn!(module, "{why}");
                    return;
                }
            }
        }
    }

    /// Has each late result no call waits for recorded in its session; answers the event ids
    /// of those that could not be.
    async fn record_unclaimed(&self, unclaimed: Vec<LateResult>) -> Vec<String> {
        let mut failed = Vec::new();
        for late in unclaimed {
            let event_id = late.event_id.clone();
            let Some(sink) = self.late_sink.get() else {
                failed.push(event_id);
                continue;
            };
            let call_key = late.call_key.clone();
            match sink.record(late).await {
                Ok(crate::late::LateRecorded::NotYet) => failed.push(event_id),
                Ok(fate) => tracing::info!(
                    call_key = %call_key,
                    event_id = %event_id,
                    ?fate,
                    "a late result no call waited for"
                ),
                Err(why) => {
                    tracing::warn!(call_key = %call_key, "a late result could not be recorded: {why}");
                    failed.push(event_id);
                }
            }
        }
        failed
    }

    /// Reads the late results of every module that serves them (shard 0, every `late_poll`),
    /// unless a call of the module polls it already.
    pub async fn sweep_late(&self) {
        let modules: Vec<String> = self
            .late_results
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default();
        for module in modules {
            if self.late.try_poll(&module) {
                self.poll_late(&module).await;
                self.late.polled(&module);
            }
        }
    }

    /// Sets where late results no call waits for go (the host, once it runs).
    pub fn set_late_sink(&self, sink: std::sync::Arc<dyn LateSink>) {
        let _ = self.late_sink.set(sink);
    }

    /// Waits for the late result of a call answered with a held first reply.
    pub(super) async fn wait_late(&self, module: &str, call_key: &str) -> Option<Settled> {
        self.late.wait_for(module, call_key);
        let until = Instant::now() + HELD_MAX;
        loop {
            if let Some(s) = self.late.take(module, call_key) {
                return Some(s);
            }
            if Instant::now() >= until {
                self.late.give_up(module, call_key);
                return None;
            }
            if self.late.try_poll(module) {
                self.poll_late(module).await;
                self.late.polled(module);
                if let Some(s) = self.late.take(module, call_key) {
                    return Some(s);
                }
            }
            glommio::timer::sleep(LATE_POLL).await;
        }
    }
}

/// A terminal entry no call waits for, as the sink records it.
fn late_result(module: &str, e: &late::LateEntry, settled: Settled) -> LateResult {
    let (outcome, content, is_error) = match settled {
        Settled::Answer(Reply::Answer { text, is_error }) => ("result", text, is_error),
        Settled::Answer(Reply::Parts { parts, is_error }) => {
            ("result", late::text_of(&parts), is_error)
        }
        Settled::Answer(other) => ("result", format!("{other:?}"), true),
        Settled::NotStarted(reason) => ("not_started", reason, true),
        Settled::Expired => ("expired", String::new(), true),
        Settled::Note(note) => ("note", note, false),
    };
    entry_result(module, e, (outcome, content, is_error), None)
}

/// The late result of entry `e` of `module`: its outcome, content and error flag, and the
/// command update it is, for a person-only command's entry.
fn entry_result(
    module: &str,
    e: &late::LateEntry,
    (outcome, content, is_error): (&str, String, bool),
    command: Option<super::CommandUpdate>,
) -> LateResult {
    LateResult {
        module: module.to_string(),
        scope_ref: e.scope_ref.clone(),
        call_key: e.call_key.clone(),
        event_id: e.event_id.clone(),
        outcome: outcome.to_string(),
        content,
        is_error,
        settled_at_unix_ms: e.settled_at,
        command,
    }
}

/// A person-only command's entry, as the sink hands it to its session.
fn command_entry(module: &str, e: &late::LateEntry, update: super::CommandUpdate) -> LateResult {
    let outcome = match &update {
        super::CommandUpdate::Progress { .. } => "command_progress",
        super::CommandUpdate::Result { .. } => "command_result",
    };
    entry_result(module, e, (outcome, String::new(), false), Some(update))
}
