//! broca-crash-points: the kill points of crash tests, as the process's session hooks
//! ([`KillPoints`], a `broca_session::Hooks`). The crash hook for crash tests: `BROCA_CRASH_AT=<point>:<nth>` aborts the process right
//! after the nth time (counted across the process, from 1) it passes a named durable boundary:
//!
//! - `admitted`: a RunStarted is durable (before the send is answered);
//! - `step_started`: a StepStarted is appended;
//! - `step`: a ModelStepFinished is durable;
//! - `intent`: a ToolDispatchIntent is durable (before any of its calls leaves);
//! - `tool_result`: a ToolResult is durable;
//! - `terminal`: a RunFinished or RunPaused is durable;
//! - `imported`: an imported episode is durable (before the import is answered);
//! - `steered`: a steer's SendSteered is durable (before it is answered or rendered);
//! - `queued`: a queued or interrupting send's SendQueued is durable (before it is answered,
//!   and for an interrupt before the run hears of it);
//! - `user_command_forwarded`: a person-only command's module answered (or its reply was
//!   lost after it was sent), before its reply is recorded;
//! - `session_changed`: a `session.refresh`, `refresh_policy`, `flush_prefix`,
//!   `host_start` or `adopt` is durable, before it is answered;
//! - `view_accepted`: a compaction provider's view is durable, before `accepted` is answered;
//! - `mid_write`: the nth batch write of the process reached the file only in part (the
//!   sectors of its first half; the rest of the batch zero, as never written), before its
//!   fdatasync.
//!
//! `BROCA_CRASH_ARM=<file>` arms a plan later: the file's content, once it exists (see
//! `armed_plan`).
//!
//! The abort is `std::process::abort`: no destructor, flush or close runs, as after a crash.
//! Unset (the normal case), the hook costs one load of a cached value per record.
//!
//! With `BROCA_POWER_LOSS=<ledger file>` the process also runs in the power-loss mode
//! (`broca_io::power_loss`: writes held until their fdatasync, new files listed until their
//! directory's fsync), and a kill point aborts without waiting for durability: at once, or
//! for `admitted` and `intent` right after the action the record guards (the send answered,
//! a dispatched call run). A kill then loses what a power cut would. With
//! `BROCA_POWER_LOSS_KILLS=durable` too, kill points wait for durability as without the mode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use broca_session::{Abort, Hooks};
use broca_wal::Record;

/// The kill points as a session actor's hooks: every record appended is looked at, and a
/// dispatched call's answer too. Unset (the normal case), each costs one load of a cached
/// value.
#[derive(Debug, Clone, Copy, Default)]
pub struct KillPoints;

impl Hooks for KillPoints {
    fn appended(&self, record: &Record) -> Option<Abort> {
        due(record)
    }

    fn abort(&self, record: &Record) -> ! {
        abort_now(record)
    }

    fn tool_answered(&self) {
        tool_answered()
    }
}

/// The points a crash can be asked at.
pub const POINTS: &[&str] = &[
    "admitted",
    "step_started",
    "step",
    "intent",
    "tool_result",
    "terminal",
    "imported",
    "steered",
    "queued",
    "upload_begun",
    "upload_committed",
    "context_compacted",
    "tool_result_late",
    "retention_tombstoned",
    "release_pending",
    "user_command_forwarded",
    "session_changed",
    "view_accepted",
    "mid_write",
];

struct Plan {
    point: &'static str,
    nth: u64,
    seen: AtomicU64,
}

fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let text = std::env::var("BROCA_CRASH_AT").ok()?;
        parse_plan("BROCA_CRASH_AT", &text)
    })
    .as_ref()
    .or_else(armed_plan)
}

/// `<point>[:<nth>]`, as `BROCA_CRASH_AT` and the arm file spell a plan.
fn parse_plan(source: &str, text: &str) -> Option<Plan> {
    let (point, nth) = text.split_once(':').unwrap_or((text, "1"));
    if point.starts_with("archive_") {
        return None; // broca-archive's own points (broca_archive::CRASH_POINTS)
    }
    let Some(point) = POINTS.iter().find(|p| **p == point) else {
        tracing::error!(
            "{source}={text}: unknown point (known: {})",
            POINTS.join(", ")
        );
        return None;
    };
    let Ok(nth) = nth.parse::<u64>() else {
        tracing::error!("{source}={text}: `{nth}` is not a count");
        return None;
    };
    tracing::warn!("{source}={text}: this process aborts at that point");
    Some(Plan {
        point,
        nth: nth.max(1),
        seen: AtomicU64::new(0),
    })
}

/// The plan armed while the process runs: with `BROCA_CRASH_ARM=<file>`, the file's content
/// (`<point>[:<nth>]`) once it exists, its passes counted from the first boundary after it
/// was read. A harness arms a point on a module it started earlier (the conformance suite's
/// `kill_at`). The file is looked for at each boundary until it is found; unset, this is one
/// load of a cached value.
fn armed_plan() -> Option<&'static Plan> {
    static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    static ARMED_PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    if let Some(plan) = ARMED_PLAN.get() {
        return plan.as_ref();
    }
    let file = FILE
        .get_or_init(|| std::env::var_os("BROCA_CRASH_ARM").map(Into::into))
        .as_ref()?;
    let text = std::fs::read_to_string(file).ok()?;
    ARMED_PLAN
        .get_or_init(|| parse_plan("BROCA_CRASH_ARM", text.trim()))
        .as_ref()
}

/// The point `record` is, if any.
fn point_of(record: &Record) -> Option<&'static str> {
    Some(match record {
        Record::RunStarted(_) => "admitted",
        Record::StepStarted(_) => "step_started",
        Record::ModelStepFinished(_) => "step",
        Record::ToolDispatchIntent(_) => "intent",
        Record::ToolResult(_) => "tool_result",
        Record::RunFinished(_) | Record::RunPaused(_) => "terminal",
        Record::EpisodeImported(_) => "imported",
        Record::SendSteered(_) => "steered",
        Record::SendQueued(_) => "queued",
        Record::UploadBegun(_) => "upload_begun",
        Record::UploadCommitted(_) => "upload_committed",
        Record::ContextCompacted(_) => "context_compacted",
        Record::ToolResultLate(_) => "tool_result_late",
        Record::SessionChange(_) => "session_changed",
        Record::ViewAccepted(_) => "view_accepted",
        _ => return None,
    })
}

/// The log configuration for this process: the default, with the `mid_write` tear installed
/// when the crash hook asks for it.
pub fn log_config() -> broca_io::LogConfig {
    let mut cfg = broca_io::LogConfig {
        power_loss: power_loss().cloned(),
        ..broca_io::LogConfig::default()
    };
    if plan().is_some_and(|p| p.point == "mid_write") {
        cfg.faults = Some(broca_io::FaultHook(std::sync::Arc::new(|point| {
            if let broca_io::FaultPoint::Written { fd, pos, len } = point {
                let plan = plan().expect("the plan that installed this hook");
                if plan.seen.fetch_add(1, Ordering::Relaxed) + 1 == plan.nth {
                    tear(fd, pos, len);
                }
            }
            None
        })));
    }
    cfg
}

/// Zeroes the second half of the write of `len` bytes at `pos` (from a sector boundary, past
/// the first sector, which holds the acknowledged tail), then aborts before any sync.
fn tear(fd: i32, pos: u64, len: usize) -> ! {
    const SECTOR: usize = 512;
    let keep = (len / 2 / SECTOR * SECTOR).max(SECTOR).min(len);
    let n = len - keep;
    if n > 0 {
        // O_DIRECT needs an aligned buffer.
        let layout = std::alloc::Layout::from_size_align(n, 4096).expect("a valid layout");
        // SAFETY: a non-zero size; freed below.
        let buf = unsafe { std::alloc::alloc_zeroed(layout) };
        if !buf.is_null() {
            // SAFETY: `fd` is the log's open descriptor; `buf` holds `n` zeroed bytes.
            let _ = unsafe { libc::pwrite(fd, buf.cast(), n, (pos + keep as u64) as libc::off_t) };
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(buf, layout) };
        }
    }
    broca_io::errln!(
        "broca: BROCA_CRASH_AT: aborting in the middle of a write ({keep} of {len} bytes)"
    );
    std::process::abort()
}

/// Whether the process must abort for `record`, and when.
pub fn due(record: &Record) -> Option<Abort> {
    let plan = plan()?;
    if point_of(record) != Some(plan.point)
        || plan.seen.fetch_add(1, Ordering::Relaxed) + 1 != plan.nth
    {
        return None;
    }
    if power_loss().is_none() || kills_at_durable() {
        return Some(Abort::WhenDurable);
    }
    match plan.point {
        "admitted" | "intent" => {
            ARMED.store(true, Ordering::Release);
            Some(Abort::AfterAction)
        }
        _ => Some(Abort::Now),
    }
}

/// Whether this process's crash plan is for `point` (false outside crash tests).
pub fn planned(point: &str) -> bool {
    plan().is_some_and(|p| p.point == point)
}

/// A boundary that is no record was passed (`retention_tombstoned`: an expired session's
/// tombstone is durable, its content not yet deleted): abort if the plan is for it.
pub fn reached(point: &'static str) {
    let Some(plan) = plan() else {
        return;
    };
    if plan.point != point || plan.seen.fetch_add(1, Ordering::Relaxed) + 1 != plan.nth {
        return;
    }
    broca_io::errln!("broca: BROCA_CRASH_AT: aborting after {point}");
    std::process::abort()
}

/// Set when an `AfterAction` abort waits for its action.
static ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether an `AfterAction` abort waits for its action (one load; false outside crash tests).
pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// The send `admitted` guards was answered: abort if the plan waits for that.
pub fn send_answered() {
    if ARMED.load(Ordering::Acquire) && plan().is_some_and(|p| p.point == "admitted") {
        broca_io::errln!("broca: BROCA_CRASH_AT: aborting after the send was answered");
        std::process::abort()
    }
}

/// A tool call of the intent `intent` guards has run: abort if the plan waits for that.
pub fn tool_answered() {
    if ARMED.load(Ordering::Acquire) && plan().is_some_and(|p| p.point == "intent") {
        broca_io::errln!("broca: BROCA_CRASH_AT: aborting after a dispatched call ran");
        std::process::abort()
    }
}

/// The power-loss mode of this process, when `BROCA_POWER_LOSS=<ledger file>` asks for it
/// (`BROCA_POWER_LOSS_SYNC_MS` holds each fdatasync that long, default 0). See
/// `broca_io::power_loss`, which keeps it.
pub fn power_loss() -> Option<&'static broca_io::power_loss::PowerLoss> {
    broca_io::power_loss::mode()
}

/// `BROCA_POWER_LOSS_KILLS=durable`: in the power-loss mode, a kill point still waits until
/// its record is durable, as without it. The mode then only keeps unsynced bytes out of the
/// files, so a reader of a WAL sees exactly what is durable (the conformance suite's bus
/// reads it when a step hint arrives).
fn kills_at_durable() -> bool {
    static DURABLE: OnceLock<bool> = OnceLock::new();
    *DURABLE.get_or_init(|| std::env::var("BROCA_POWER_LOSS_KILLS").is_ok_and(|v| v == "durable"))
}

/// Aborts the process, saying where (on stderr, unbuffered).
pub fn abort_now(record: &Record) -> ! {
    broca_io::errln!(
        "broca: BROCA_CRASH_AT: aborting after {}",
        point_of(record).unwrap_or("a record")
    );
    std::process::abort()
}
