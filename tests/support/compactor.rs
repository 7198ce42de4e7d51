//! The daemon stand-in's compaction provider (cortexkit-role-compaction's
//! `compaction-provider/v2`): the ToolModule answers `compaction.*` ops with it. It records
//! every Setup, notice and ride, answers Setup `ready` and notices `received`, and answers a
//! ride with the view set for it (once), else `nothing`. As the compaction contract has it
//! (A10), it is also the session's `pre_user` step transform (`step-transform-provider/v2`):
//! it declares the hook (`pass`, 1,500 ms), records each hook call and answers it with the
//! answer set for it (each once, in order; `Silence` never answers), else a prepend of the
//! gap marker `[+0s] `.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use subc_protocol::FrameType;

use super::Reply;

#[derive(Clone, Default)]
pub struct Compactor {
    pub setups: Arc<Mutex<Vec<Value>>>,
    pub notices: Arc<Mutex<Vec<Value>>>,
    pub rides: Arc<Mutex<Vec<Value>>>,
    /// How long the next Setup's answer takes, in ms (then none).
    pub slow_setup_ms: Arc<Mutex<u64>>,
    /// Rides left unanswered (a provider gone silent) before one is answered.
    pub silent_rides: Arc<Mutex<u32>>,
    /// For each ride, the ordinals the notices answered before it had told.
    pub told_before_ride: Arc<Mutex<Vec<Vec<u64>>>>,
    /// The view the next ride is answered with.
    pub ride_view: Arc<Mutex<Option<Value>>>,
    /// Notices answered `setup_required` before one is `received` (a provider that restarted).
    pub forget: Arc<Mutex<u32>>,
    /// Every `transform.hook` call's params, in order.
    pub hooks: Arc<Mutex<Vec<Value>>>,
    /// The answers the next hook calls get, in order (`None`: no answer at all).
    pub hook_answers: Arc<Mutex<std::collections::VecDeque<Option<Value>>>>,
    /// Every `transform.declare` request's params.
    pub declares: Arc<Mutex<Vec<Value>>>,
}

pub(super) fn answer(c: &Compactor, body: &Value) -> Reply {
    let params = body["params"].clone();
    let answer = match body["method"].as_str() {
        Some("compaction.setup") => {
            c.setups.lock().unwrap().push(params);
            let slow = std::mem::take(&mut *c.slow_setup_ms.lock().unwrap());
            if slow > 0 {
                let later = std::time::Duration::from_millis(slow);
                return Reply::Later(later, FrameType::Response, json!({"answer": "ready"}));
            }
            json!({"answer": "ready"})
        }
        Some("compaction.notice") => {
            c.notices.lock().unwrap().push(params);
            let mut forget = c.forget.lock().unwrap();
            if *forget > 0 {
                *forget -= 1;
                json!({"answer": "setup_required"})
            } else {
                json!({"answer": "received"})
            }
        }
        Some("transform.declare") => {
            c.declares.lock().unwrap().push(params);
            json!({"subscriptions": [{"hook": "pre_user", "ops": ["prepend", "append", "replace"],
                                      "on_unavailable": "pass", "budget_ms": 1500}]})
        }
        Some("transform.hook") => {
            c.hooks.lock().unwrap().push(params);
            match c.hook_answers.lock().unwrap().pop_front() {
                Some(Some(answer)) => answer,
                Some(None) => return Reply::Silence,
                None => json!({"answer": "ops",
                               "ops": [{"op": "prepend", "block": 0, "text": "[+0s] ",
                                        "note": "gap since the last message"}]}),
            }
        }
        Some("compaction.ride") => {
            let told = c
                .notices
                .lock()
                .unwrap()
                .iter()
                .flat_map(|n| n["entries"].as_array().cloned().unwrap_or_default())
                .filter_map(|e| e["ordinal"].as_u64())
                .collect();
            c.told_before_ride.lock().unwrap().push(told);
            c.rides.lock().unwrap().push(params);
            let mut silent = c.silent_rides.lock().unwrap();
            if *silent > 0 {
                *silent -= 1;
                return Reply::Silence;
            }
            match c.ride_view.lock().unwrap().take() {
                Some(view) => json!({"answer": "view", "view": view}),
                None => json!({"answer": "nothing"}),
            }
        }
        other => {
            return Reply::Frame(
                FrameType::Error,
                json!({"code": "unknown_method", "message": format!("{other:?}"),
                       "detail": {"method": other}}),
                false,
            )
        }
    };
    Reply::Frame(FrameType::Response, answer, false)
}
