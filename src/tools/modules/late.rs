//! Held calls and late results of tool modules (tool-provider/v1 §4.1 `held-reply/v1`, §7).
//! A module that declares the `late_results` session capability may answer a call with a
//! held first reply (interim content: a person must consent, or the work goes on); the
//! call then waits for its answer, the terminal `late_results` entry of its call key, which
//! broca pulls on its own route to the module while any call of it waits (every
//! [`LATE_POLL`]), at most [`HELD_MAX`] (the role's retention of an unacked result).
//!
//! One waiting call polls at a time for the whole module; each terminal entry is handed to
//! the call that waits for it. Entries are taken once (deduplicated on their event id). The
//! read is acked through its cursor once every terminal entry in it went to a waiting call;
//! an entry nobody waits for (its call was sealed indeterminate by a restart) is kept
//! unacked in the module, which keeps it 24 h, and counted.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use broca_subc::toolprov::late::{self, LateCursor, Read, Settled};

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
    /// Terminal entries for calls nobody waits for (unacked).
    unclaimed: usize,
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
        self.with(module, |b| b.polling = false);
    }

    pub(super) fn cursor(&self, module: &str) -> Option<LateCursor> {
        self.with(module, |b| b.cursor.clone()).flatten()
    }

    /// Takes one read's entries: each new terminal one to its waiting call. Answers whether
    /// the read may be acked (every terminal entry in it went to a waiting call).
    pub(super) fn take_read(&self, module: &str, reply: &late::LateRead) -> bool {
        self.with(module, |b| {
            let mut ackable = b.unclaimed == 0;
            for e in &reply.entries {
                if b.seen.len() >= SEEN_MAX {
                    b.seen.clear();
                }
                if !b.seen.insert(e.event_id.clone()) {
                    continue;
                }
                match late::settle(module, e) {
                    Settled::Note(note) => {
                        tracing::info!(module, call_key = %e.call_key, "late entry: {note}");
                    }
                    settled if b.waiting.contains(&e.call_key) => {
                        b.answers.insert(e.call_key.clone(), settled);
                    }
                    _ => {
                        b.unclaimed += 1;
                        ackable = false;
                        tracing::warn!(
                            module,
                            call_key = %e.call_key,
                            "a late result for a call broca no longer waits for; left unacked"
                        );
                    }
                }
            }
            b.cursor = Some(reply.cursor.clone());
            ackable
        })
        .unwrap_or(false)
    }

    /// The cursor was refused: read from the start (the event ids deduplicate).
    pub(super) fn from_start(&self, module: &str) {
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
                    let ackable = self.late.take_read(module, &reply);
                    if ackable && !reply.entries.is_empty() {
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
                    self.late.from_start(module);
                }
                Read::FromStart => return,
                Read::Failed(why) => {
                    tracing::warn!(module, "{why}");
                    return;
                }
            }
        }
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
