//! `run.tool_calls` (llm-runner/v1 `run_tool_calls`): every tool call a run made, in
//! dispatch order (the order the model asked for them across the run's steps), from the
//! run's durable records through the session's entries: each call's key, module, outcome,
//! stored result size, and where its request and its result stand in `session.read`.
//!
//! A page's `next` is `tc1.<run_id>.<index>`, the index of the next call in the run's list;
//! an `after` naming another run, or a place past the list, was never given for the run.

use cortexkit_role_llm_runner::tool_calls::{RunToolCall, ToolCallsPage, ToolCallsRequest};
use serde_json::Value;

use crate::role::entries_of;
use broca_core::entries::CallFacts;
use broca_core::replay::Session;

/// Calls a page holds when the request names no `limit`, and at most.
pub const TOOL_CALLS_LIMIT_DEFAULT: u64 = 100;
pub const TOOL_CALLS_LIMIT_MAX: u64 = 500;

/// Why a `run.tool_calls` request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCallsRefusal {
    /// `unknown_run`.
    UnknownRun(String),
    /// `invalid_params` naming `after`: a cursor never given for this run.
    BadAfter,
}

/// One call of the run: its facts, the ordinal of the message asking for it, and its place
/// among that message's calls.
type Listed<'a> = (&'a CallFacts, u64, u32);

/// The run's calls in dispatch order.
fn calls_of<'a>(s: &'a Session, run: usize) -> Vec<Listed<'a>> {
    entries_of(s)
        .iter()
        .enumerate()
        .filter(|(_, e)| e.run == Some(run) && e.role == "assistant")
        .flat_map(|(i, e)| {
            e.calls
                .iter()
                .enumerate()
                .map(move |(p, c)| (c, i as u64 + 1, p as u32))
        })
        .collect()
}

/// A call as the role lists it.
fn listed(&(c, ordinal, position): &Listed<'_>) -> RunToolCall {
    let args: Value = serde_json::from_str(c.args.get()).unwrap_or(Value::Null);
    let mut r = RunToolCall::new(c.id.clone(), c.name.clone(), args, c.outcome(), ordinal)
        .with_position(position);
    if let Some(key) = &c.call_key {
        r = r.with_call_key(key.clone());
    }
    if let Some(module) = &c.dispatched_to {
        r = r.with_dispatched_to(module.clone());
    }
    if let Some(result) = &c.result {
        r = r
            .with_result_bytes(result.bytes)
            .with_result_ordinal(result.entry as u64 + 1);
    }
    r
}

/// The page of `s`'s run `req.run_id` that `req` asks for.
pub fn tool_calls_page(
    s: Option<&Session>,
    req: &ToolCallsRequest,
) -> Result<ToolCallsPage, ToolCallsRefusal> {
    let unknown = || ToolCallsRefusal::UnknownRun(req.run_id.clone());
    let s = s.ok_or_else(unknown)?;
    let run = *s.by_run_id.get(&req.run_id).ok_or_else(unknown)?;
    let calls = calls_of(s, run);
    let prefix = format!("tc1.{}.", req.run_id);
    let start = match &req.after {
        None => 0,
        Some(after) => after
            .strip_prefix(&prefix)
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= calls.len())
            .ok_or(ToolCallsRefusal::BadAfter)?,
    };
    let limit = req
        .limit
        .unwrap_or(TOOL_CALLS_LIMIT_DEFAULT)
        .min(TOOL_CALLS_LIMIT_MAX) as usize;
    let bytes_max = crate::role::READ_MAX_BYTES_DEFAULT;
    let mut page = Vec::new();
    let mut bytes = 0u64;
    let mut next = start;
    while next < calls.len() && page.len() < limit {
        let call = listed(&calls[next]);
        let n = serde_json::to_vec(&call).map_or(0, |b| b.len() as u64);
        // A call larger than the cap comes alone on its page, never cut.
        if !page.is_empty() && bytes + n > bytes_max {
            break;
        }
        bytes += n;
        page.push(call);
        next += 1;
    }
    assert!(page.len() <= limit, "a page holds at most its limit");
    let out = ToolCallsPage::new(req.run_id.clone(), page);
    Ok(if next < calls.len() {
        out.with_next(format!("{prefix}{next}"))
    } else {
        out
    })
}
