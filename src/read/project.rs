//! The control lane: each WAL record projected into the units subscribers receive, addressed
//! by the cursor (wal_seq, sub_index): the record's seq and the unit's index within the
//! record's projection. Pure: the same record always projects the same units, so a cursor
//! names the same unit before and after a restart.
//!
//! A unit may carry a typed event of llm-runner/v1 `live_events` (§7.1), which the daemon's
//! route puts beside the unit on its frame: `message_started` then `message_finished` for
//! each stored message (the latter on the unit that holds the message), `tool_started` and
//! `tool_finished` for each call, `run_started` (naming its send), `run_finished` and
//! `run_paused`. Each maps onto a record, so a replay from a cursor serves the same events.

use serde_json::{json, Value};

use broca_wal::runrec::ResultBlock;
use broca_wal::Record;
use cortexkit_role_llm_runner::live::{
    LiveEvent, MessageEvent, RunEnded, RunStarted, ToolFinished, ToolStarted,
};

pub use broca_wire::Cursor;

/// One unit of the control lane, and the typed event it carries, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub body: Value,
    pub event: Option<Value>,
}

impl Unit {
    fn plain(body: Value) -> Unit {
        Unit { body, event: None }
    }

    fn with(body: Value, event: LiveEvent) -> Unit {
        Unit {
            body,
            event: Some(serde_json::to_value(event).expect("events serialize")),
        }
    }

    /// A unit saying that message `mid` starts: the event's own unit, naming the run (or
    /// the import) the message is of, as `(member, id)`.
    fn message_started(mid: &str, of: (&str, &str)) -> Unit {
        let mut body = json!({"type": "message_started", "mid": mid});
        body[of.0] = of.1.into();
        Unit::with(body, LiveEvent::MessageStarted(MessageEvent::new(mid)))
    }

    /// The unit holding message `mid`, carrying `message_finished`.
    fn message(mid: &str, body: Value) -> Unit {
        Unit::with(body, LiveEvent::MessageFinished(MessageEvent::new(mid)))
    }
}

fn with_type(kind: &str, value: Value) -> Value {
    let mut v = value;
    if let Value::Object(m) = &mut v {
        m.insert("type".into(), Value::String(kind.into()));
    }
    v
}

fn val<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("records serialize")
}

/// How a call ended, as `tool_finished` names it (`live::tool_outcomes`, open): `ok` or
/// `error` for an answer, `interrupted` for a call closed with its outcome unknown, and
/// `not_executed` for one a stop never sent.
pub fn live_outcome(r: &ResultBlock) -> &'static str {
    use broca_wal::runrec::result_reason as why;
    match r.reason.as_deref() {
        Some(why::OUTCOME_UNKNOWN) => "interrupted",
        Some(why::NOT_DISPATCHED | why::BUDGET_EXHAUSTED | why::CONTEXT_CEILING) => "not_executed",
        _ if r.is_error => "error",
        _ => "ok",
    }
}

/// `tool_finished` of `r`, a call of message `mid` of `of` (as [`Unit::message_started`]
/// names it), with the key and pin its intent recorded, when it has them.
fn tool_finished(
    mid: &str,
    of: (&str, &str),
    r: &ResultBlock,
    at: Option<u64>,
    identity: (Option<&str>, Option<&str>),
) -> Unit {
    let mut event = ToolFinished::new(
        mid,
        r.call_id.clone(),
        live_outcome(r),
        r.content.len() as u64,
        at,
    );
    if let Some(key) = identity.0 {
        event = event.with_call_key(key);
    }
    if let Some(pin) = identity.1 {
        event = event.with_schema_pin(pin);
    }
    let mut body = json!({"type": "tool_finished", "mid": mid, "call_id": r.call_id});
    body[of.0] = of.1.into();
    Unit::with(body, LiveEvent::ToolFinished(event))
}

/// The units of `record`, the record of `seq`, in sub_index order.
pub fn units(seq: u64, record: &Record) -> Vec<Unit> {
    match record {
        Record::LeaseAcquired(_)
        | Record::Unknown { .. }
        | Record::UploadBegun(_)
        | Record::UploadCommitted(_)
        | Record::ContextCompacted(_)
        | Record::ToolResultLate(_)
        | Record::SessionReleased(_)
        | Record::UserCommand(_)
        | Record::SessionChange(_)
        | Record::ViewAccepted(_)
        | Record::ReasoningPruned(_) => Vec::new(),
        Record::RunStarted(r) => run_started(seq, r),
        Record::StepStarted(r) => vec![Unit::plain(with_type("step_started", val(r)))],
        Record::ModelAttemptFinished(r) => vec![Unit::plain(with_type("attempt_failed", val(r)))],
        Record::ModelStepFinished(r) => step_finished(seq, r),
        Record::ToolDispatchIntent(r) => dispatched(r),
        Record::ToolResult(r) => tool_result(seq, r),
        Record::RunPaused(r) => vec![Unit::with(
            with_type("run_paused", val(r)),
            LiveEvent::RunPaused(RunEnded::new(r.run_id.clone(), r.reason.clone())),
        )],
        Record::RunFinished(r) => vec![Unit::with(
            with_type("run_finished", val(r)),
            LiveEvent::RunFinished(RunEnded::new(
                r.run_id.clone(),
                crate::role::finish_state(r.reason),
            )),
        )],
        Record::RunResumed(r) => vec![Unit::plain(with_type("run_resumed", val(r)))],
        Record::CancelRequested(r) => vec![Unit::plain(with_type("cancel_requested", val(r)))],
        Record::SendQueued(r) => vec![Unit::plain(json!({
            "type": "send_queued",
            "submission_id": r.submission_id,
            "send_id": r.send_id,
            "prompt": r.prompt,
            "model": format!("{}/{}", r.config.provider, r.config.model),
        }))],
        Record::SendRetracted(r) => vec![Unit::plain(with_type("send_retracted", val(r)))],
        // Its message's id is this seq; the step that renders it names it in `steers`.
        Record::SendSteered(r) => vec![Unit::plain(json!({
            "type": "send_steered",
            "run_id": r.run_id,
            "send_id": r.send_id,
            "mid": seq.to_string(),
            "prompt": r.prompt,
        }))],
        Record::EpisodeImported(r) => imported(seq, r),
    }
}

/// A model step's units: its message started, then its message.
fn step_finished(seq: u64, r: &broca_wal::runrec::ModelStepFinished) -> Vec<Unit> {
    let mid = broca_core::replay::assistant_mid(seq, r).to_string();
    let body = json!({
        "type": "message",
        "run_id": r.run_id,
        "step": r.step,
        "message": {"role": "assistant", "content": val(&r.content)},
        "usage": val(&r.usage),
        "finish_reason": val(&r.finish_reason),
    });
    vec![
        Unit::message_started(&mid, ("run_id", &r.run_id)),
        Unit::message(&mid, body),
    ]
}

/// A dispatch intent's units: a `tool_call` for each call, with its `tool_started` event
/// where the log names the message holding the calls (older ones do not).
fn dispatched(r: &broca_wal::runrec::ToolDispatchIntent) -> Vec<Unit> {
    r.calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let body =
                json!({"type": "tool_call", "run_id": r.run_id, "step": r.step, "call": val(c)});
            let Some(mid) = r.step_seq.map(|s| s.to_string()) else {
                return Unit::plain(body);
            };
            let args: Value = serde_json::from_str(c.input.get()).unwrap_or(Value::Null);
            let mut event =
                ToolStarted::new(mid, c.id.clone(), c.name.clone(), &args, None, r.at_unix_ms);
            if let Some(key) = r.call_key(i) {
                event = event.with_call_key(key);
            }
            if let Some(pin) = r.schema_pin(i) {
                event = event.with_schema_pin(pin);
            }
            Unit::with(body, LiveEvent::ToolStarted(event))
        })
        .collect()
}

/// A tool result's units: its message started, the call's `tool_finished` (where the log
/// names the message holding the call), then its message.
fn tool_result(seq: u64, r: &broca_wal::runrec::ToolResult) -> Vec<Unit> {
    let mid = seq.to_string();
    let body = json!({"type": "tool_result", "run_id": r.run_id, "result": val(&r.result)});
    let of = ("run_id", r.run_id.as_str());
    let mut out = vec![Unit::message_started(&mid, of)];
    if let Some(holder) = r.step_seq {
        let identity = (r.call_key.as_deref(), r.schema_pin.as_deref());
        out.push(tool_finished(
            &holder.to_string(),
            of,
            &r.result,
            r.at_unix_ms,
            identity,
        ));
    }
    out.push(Unit::message(&mid, body));
    out
}

/// An imported episode's units: the episode, then each message with its tool events.
fn imported(seq: u64, r: &broca_wal::importrec::EpisodeImported) -> Vec<Unit> {
    let mut out = vec![Unit::plain(json!({
        "type": "episode_imported",
        "import_id": r.import_id,
        "origin": val(&r.origin),
        "messages": r.messages.len(),
        "outcome_unknown": r.outcome_unknown,
        "pending": r.pending,
        "notes": val(&r.notes),
    }))];
    let mut holder: Option<String> = None;
    for (i, m) in r.messages.iter().enumerate() {
        let mid = broca_core::entries::imported_mid(seq, i);
        let body = json!({"type": "message", "import_id": r.import_id, "message": val(m)});
        let of = ("import_id", r.import_id.as_str());
        out.push(Unit::message_started(&mid, of));
        out.extend(imported_calls(&mid, of, m, &mut holder));
        out.push(Unit::message(&mid, body));
    }
    out
}

/// The tool events of an imported message `mid`: `tool_started` for each call it makes,
/// `tool_finished` for each result it holds (of a call of the import's last assistant
/// message, `holder`). Another harness recorded no times broca could copy: none are given.
fn imported_calls(
    mid: &str,
    of: (&str, &str),
    m: &broca_protocol::Message,
    holder: &mut Option<String>,
) -> Vec<Unit> {
    use broca_protocol::Block;
    let mut out = Vec::new();
    for b in &m.content {
        match b {
            Block::ToolUse { id, name, input } => {
                let args: Value = serde_json::from_str(input.get()).unwrap_or(Value::Null);
                let event = ToolStarted::new(mid, id.clone(), name.clone(), &args, None, None);
                let mut body = json!({"type": "tool_call", "mid": mid, "call_id": id});
                body[of.0] = of.1.into();
                out.push(Unit::with(body, LiveEvent::ToolStarted(event)));
            }
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let Some(holder) = holder.as_deref() else {
                    continue;
                };
                let result = ResultBlock {
                    call_id: tool_use_id.clone(),
                    content: content.clone(),
                    is_error: *is_error,
                    reason: None,
                    size: None,
                    parts: Vec::new(),
                };
                out.push(tool_finished(holder, of, &result, None, (None, None)));
            }
            _ => {}
        }
    }
    if m.role == broca_protocol::Role::Assistant {
        *holder = Some(mid.to_string());
    }
    out
}

/// A run's start: `run_started` naming its send, then its prompt's message (the results it
/// resolves first, each closing its call).
fn run_started(seq: u64, r: &broca_wal::runrec::RunStarted) -> Vec<Unit> {
    let mut started = RunStarted::new(r.run_id.clone());
    if let Some(send_id) = &r.send_id {
        started = started.with_send_id(send_id.clone());
    }
    let mut out = vec![Unit::with(
        json!({
            "type": "run_started",
            "run_id": r.run_id,
            "send_id": r.send_id,
            "prompt": r.prompt,
            "model": format!("{}/{}", r.config.provider, r.config.model),
        }),
        LiveEvent::RunStarted(started),
    )];
    let mid = seq.to_string();
    let of = ("run_id", r.run_id.as_str());
    out.push(Unit::message_started(&mid, of));
    for res in &r.resolved_calls {
        let body = json!({"type": "tool_result", "run_id": r.run_id, "result": val(res)});
        match &r.resolved_mid {
            Some(holder) => {
                out.push(Unit::plain(body));
                out.push(tool_finished(
                    holder,
                    of,
                    res,
                    Some(r.at_unix_ms),
                    (None, None),
                ));
            }
            None => out.push(Unit::plain(body)),
        }
    }
    let body = json!({"type": "message", "run_id": r.run_id, "message": {"role": "user", "text": r.prompt}});
    out.push(Unit::message(&mid, body));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_parse_print_and_order() {
        let c = Cursor::parse("42.3").unwrap();
        assert_eq!(c, Cursor { seq: 42, sub: 3 });
        assert_eq!(c.to_string(), "42.3");
        assert!(Cursor::parse("42").is_none() && Cursor::parse("x.1").is_none());
        assert!(Cursor { seq: 42, sub: 3 } < Cursor { seq: 43, sub: 0 });
        assert!(Cursor::end_of(42) < Cursor { seq: 43, sub: 0 });
    }
}
