//! The crash hook for crash tests: `BROCA_CRASH_AT=<point>:<nth>` aborts the process right
//! after the nth time (counted across the process, from 1) it passes a named durable boundary:
//!
//! - `admitted`: a RunStarted is durable (before the send is answered);
//! - `step_started`: a StepStarted is appended;
//! - `step`: a ModelStepFinished is durable;
//! - `intent`: a ToolDispatchIntent is durable (before any of its calls leaves);
//! - `tool_result`: a ToolResult is durable;
//! - `terminal`: a RunFinished or RunPaused is durable;
//! - `mid_write`: the nth batch write of the process reached the file only in part (the
//!   sectors of its first half; the rest of the batch zero, as never written), before its
//!   fdatasync.
//!
//! The abort is `std::process::abort`: no destructor, flush or close runs, as after a crash.
//! Unset (the normal case), the hook costs one load of a cached value per record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::wal::Record;

/// The points a crash can be asked at.
pub const POINTS: &[&str] = &[
    "admitted",
    "step_started",
    "step",
    "intent",
    "tool_result",
    "terminal",
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
        let (point, nth) = text.split_once(':').unwrap_or((text.as_str(), "1"));
        let Some(point) = POINTS.iter().find(|p| **p == point) else {
            tracing::error!(
                "BROCA_CRASH_AT={text}: unknown point (known: {})",
                POINTS.join(", ")
            );
            return None;
        };
        let Ok(nth) = nth.parse::<u64>() else {
            tracing::error!("BROCA_CRASH_AT={text}: `{nth}` is not a count");
            return None;
        };
        tracing::warn!("BROCA_CRASH_AT={text}: this process aborts at that point");
        Some(Plan {
            point,
            nth: nth.max(1),
            seen: AtomicU64::new(0),
        })
    })
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
        _ => return None,
    })
}

/// The log configuration for this process: the default, with the `mid_write` tear installed
/// when the crash hook asks for it.
pub fn log_config() -> broca_io::LogConfig {
    let mut cfg = broca_io::LogConfig::default();
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
    crate::errln!("broca: BROCA_CRASH_AT: aborting in the middle of a write ({keep} of {len} bytes)");
    std::process::abort()
}

/// Whether the process must abort after `record` is durable.
pub fn due(record: &Record) -> bool {
    let Some(plan) = plan() else {
        return false;
    };
    point_of(record) == Some(plan.point)
        && plan.seen.fetch_add(1, Ordering::Relaxed) + 1 == plan.nth
}

/// Aborts the process, saying where (on stderr, unbuffered).
pub fn abort_now(record: &Record) -> ! {
    crate::errln!(
        "broca: BROCA_CRASH_AT: aborting after {}",
        point_of(record).unwrap_or("a record")
    );
    std::process::abort()
}
