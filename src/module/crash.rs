//! The crash hook for crash tests: `BROCA_CRASH_AT=<point>:<nth>` aborts the process right
//! after the nth time (counted across the process, from 1) it passes a named durable boundary:
//!
//! - `admitted`: a RunStarted is durable (before the send is answered);
//! - `step_started`: a StepStarted is appended;
//! - `step`: a ModelStepFinished is durable;
//! - `intent`: a ToolDispatchIntent is durable (before any of its calls leaves);
//! - `tool_result`: a ToolResult is durable;
//! - `terminal`: a RunFinished or RunPaused is durable.
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
    eprintln!(
        "broca: BROCA_CRASH_AT: aborting after {}",
        point_of(record).unwrap_or("a record")
    );
    std::process::abort()
}
