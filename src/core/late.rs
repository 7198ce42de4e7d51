//! Late results of a session's tool calls (tool-provider/v1 §7), as replay keeps them: the
//! calls a run sealed without an outcome (a restart cut them while their module held them),
//! by call key, and the late results recorded, by event id. A tool module's terminal entry
//! for such a call is recorded once (`ToolResultLate`); any other is not the session's to
//! record.

use std::collections::{HashMap, HashSet};

use broca_wal::runrec::{ToolDispatchIntent, ToolResultLate};

/// What a late result is for this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LateFate {
    /// A call the session sealed without an outcome: record it (its run and call).
    Record { run_id: String, call_id: String },
    /// Its event is recorded already.
    Recorded,
    /// Its call is the open run's: the run has not sealed it yet (read it again later).
    Open,
    /// No call of the session waits for it (answered, or never the session's).
    NotAwaited,
}

/// The session's calls a late result may settle, and those recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LateCalls {
    /// The open run's calls: (call id, call key).
    open: Vec<(String, String)>,
    /// Calls sealed without an outcome, by call key: (run id, call id).
    awaiting: HashMap<String, (String, String)>,
    /// The event ids of the late results recorded.
    recorded: HashSet<String>,
}

impl LateCalls {
    /// A run started: the calls kept are its own from now on.
    pub fn started(&mut self) {
        self.open.clear();
    }

    /// The open run's intent: its keyed calls.
    pub fn intent(&mut self, r: &ToolDispatchIntent) {
        for (i, c) in r.calls.iter().enumerate() {
            if let Some(key) = r.call_key(i) {
                self.open.push((c.id.clone(), key.to_string()));
            }
        }
    }

    /// The open run ended, sealing `indeterminate` without an outcome.
    pub fn finished(&mut self, run_id: &str, indeterminate: &[String]) {
        for id in indeterminate {
            if let Some((_, key)) = self.open.iter().find(|(c, _)| c == id) {
                self.awaiting
                    .insert(key.clone(), (run_id.to_string(), id.clone()));
            }
        }
        self.open.clear();
    }

    pub fn recorded(&mut self, r: &ToolResultLate) {
        self.recorded.insert(r.event_id.clone());
        self.awaiting.remove(&r.call_key);
    }

    /// What a late result of `call_key` (its entry's `event_id`) is for this session.
    pub fn fate(&self, call_key: &str, event_id: &str) -> LateFate {
        if self.recorded.contains(event_id) {
            return LateFate::Recorded;
        }
        match self.awaiting.get(call_key) {
            Some((run_id, call_id)) => LateFate::Record {
                run_id: run_id.clone(),
                call_id: call_id.clone(),
            },
            None if self.open.iter().any(|(_, k)| k == call_key) => LateFate::Open,
            None => LateFate::NotAwaited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use broca_protocol::ToolCall;

    fn intent(run: &str, ids: &[&str]) -> ToolDispatchIntent {
        ToolDispatchIntent {
            run_id: run.into(),
            step: 1,
            batch_id: "b".into(),
            calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: (*id).into(),
                    name: "consent".into(),
                    input: broca_protocol::Json::from_text("{}".into()).unwrap(),
                })
                .collect(),
            call_keys: ids.iter().map(|id| format!("key-{id}")).collect(),
            dispatched_to: Vec::new(),
            schema_pins: Vec::new(),
            step_seq: None,
            at_unix_ms: None,
        }
    }

    fn late(key: &str, event: &str) -> ToolResultLate {
        ToolResultLate {
            run_id: "r1".into(),
            call_id: "c1".into(),
            call_key: key.into(),
            module: "m".into(),
            event_id: event.into(),
            outcome: "result".into(),
            content: "ok".into(),
            is_error: false,
            settled_at_unix_ms: 1,
            at_unix_ms: 2,
        }
    }

    #[test]
    fn only_a_call_sealed_without_an_outcome_takes_a_late_result_once() {
        let mut l = LateCalls::default();
        l.started();
        l.intent(&intent("r1", &["c1", "c2"]));
        // While the run is open its calls are not settled by a late result yet.
        assert_eq!(l.fate("key-c1", "e1"), LateFate::Open);
        // c1 sealed without an outcome; c2 answered.
        l.finished("r1", &["c1".into()]);
        assert_eq!(
            l.fate("key-c1", "e1"),
            LateFate::Record {
                run_id: "r1".into(),
                call_id: "c1".into()
            }
        );
        assert_eq!(l.fate("key-c2", "e2"), LateFate::NotAwaited);
        assert_eq!(l.fate("key-other", "e3"), LateFate::NotAwaited);
        l.recorded(&late("key-c1", "e1"));
        assert_eq!(l.fate("key-c1", "e1"), LateFate::Recorded);
        // Another entry for the same call (a later event) is not recorded either.
        assert_eq!(l.fate("key-c1", "e9"), LateFate::NotAwaited);
        // A later run's calls start over.
        l.started();
        assert_eq!(l.fate("key-c1", "e9"), LateFate::NotAwaited);
    }
}
