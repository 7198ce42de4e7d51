//! The control lane: each WAL record projected into the units subscribers receive, addressed
//! by the cursor (wal_seq, sub_index): the record's seq and the unit's index within the
//! record's projection. Pure: the same record always projects the same units, so a cursor
//! names the same unit before and after a restart.

use serde_json::{json, Value};

use broca_wal::Record;

pub use broca_wire::Cursor;

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

/// The units of `record`, in sub_index order.
pub fn units(record: &Record) -> Vec<Value> {
    match record {
        Record::LeaseAcquired(_) | Record::Unknown { .. } => Vec::new(),
        Record::RunStarted(r) => {
            let mut out = vec![json!({
                "type": "run_started",
                "run_id": r.run_id,
                "send_id": r.send_id,
                "prompt": r.prompt,
                "model": format!("{}/{}", r.config.provider, r.config.model),
            })];
            for res in &r.resolved_calls {
                out.push(json!({"type": "tool_result", "run_id": r.run_id, "result": val(res)}));
            }
            out
        }
        Record::StepStarted(r) => vec![with_type("step_started", val(r))],
        Record::ModelAttemptFinished(r) => vec![with_type("attempt_failed", val(r))],
        Record::ModelStepFinished(r) => vec![json!({
            "type": "message",
            "run_id": r.run_id,
            "step": r.step,
            "message": {"role": "assistant", "content": val(&r.content)},
            "usage": val(&r.usage),
            "finish_reason": val(&r.finish_reason),
        })],
        Record::ToolDispatchIntent(r) => r
            .calls
            .iter()
            .map(|c| json!({"type": "tool_call", "run_id": r.run_id, "step": r.step, "call": val(c)}))
            .collect(),
        Record::ToolResult(r) => vec![json!({"type": "tool_result", "run_id": r.run_id, "result": val(&r.result)})],
        Record::RunPaused(r) => vec![with_type("run_paused", val(r))],
        Record::RunFinished(r) => vec![with_type("run_finished", val(r))],
        Record::RunResumed(r) => vec![with_type("run_resumed", val(r))],
        Record::CancelRequested(r) => vec![with_type("cancel_requested", val(r))],
        Record::SendQueued(r) => vec![json!({
            "type": "send_queued",
            "submission_id": r.submission_id,
            "send_id": r.send_id,
            "prompt": r.prompt,
            "model": format!("{}/{}", r.config.provider, r.config.model),
        })],
        Record::SendRetracted(r) => vec![with_type("send_retracted", val(r))],
        Record::EpisodeImported(r) => {
            let mut out = vec![json!({
                "type": "episode_imported",
                "import_id": r.import_id,
                "origin": val(&r.origin),
                "messages": r.messages.len(),
                "outcome_unknown": r.outcome_unknown,
                "pending": r.pending,
                "notes": val(&r.notes),
            })];
            for m in &r.messages {
                out.push(json!({"type": "message", "import_id": r.import_id, "message": val(m)}));
            }
            out
        }
    }
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
