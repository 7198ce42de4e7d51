//! The scripted provider's person-only commands (llm-runner/v1 `user_commands` cases): a
//! session prepared for them gets a plan naming the scripted module (and, for the collision
//! case, a second module declaring one of the same names), whose catalog declares
//! `ctx-status` (answered `done` at once) and `ctx-wrapup` (answered `accepted`, then two
//! progress entries and its result as late entries). Every `user_command.invoke` that
//! reaches a module is recorded as it arrived; a repeat of a call key answers the stored
//! reply. A cut-off session refuses its command route (before the forward) or closes it
//! once the command arrived (after).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cortexkit_role_llm_runner_conformance::{UserCommandFixture, UserCommandObservation};
use serde_json::{json, Map, Value};
use subc_protocol::FrameType;

use crate::tools::MODULE;

/// The second module of the collision case: it declares `ctx-status` too, and no tool.
pub const SECOND_MODULE: &str = "conformance-commands";
const INCARNATION: &str = "conformance-commands-1";

/// Where a session's commands are cut off.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cutoff {
    BeforeForward,
    AfterForward,
}

#[derive(Default)]
struct State {
    fixtures: HashMap<String, UserCommandFixture>,
    cutoffs: HashMap<String, Cutoff>,
    /// Each `user_command.invoke` request as it arrived, by the session of its route.
    calls: HashMap<String, Vec<Value>>,
    /// The first reply given for each call key (a repeat answers it).
    replies: HashMap<String, Value>,
    /// Late entries, in order (the cursor's seq is their index + 1).
    late: Vec<Value>,
}

/// The second module's own tool, outside the command cases.
pub const OTHER_TOOL: &str = "conformance_other";

fn other_tool() -> Value {
    use cortexkit_role_tool_provider::catalog::schema_digest;
    let schema = json!({"type": "object"});
    json!({"name": OTHER_TOOL, "schema_digest": schema_digest(&schema).expect("digests"),
        "semantics": 1, "capabilities": [], "description": "another module's tool",
        "input_schema": schema})
}

/// A `session.refresh` plan whose tool set differs from a plain session's: the second
/// module's one tool.
pub fn refresh_plan() -> (Map<String, Value>, Vec<String>) {
    let plan = json!({"tool_items": [{"provider": SECOND_MODULE, "params": {}}]});
    let Value::Object(plan) = plan else {
        unreachable!("an object")
    };
    (plan, vec![OTHER_TOOL.to_string()])
}

/// What a command request comes to on the wire.
pub enum Answer {
    Frame(FrameType, Value),
    /// The route is closed under the request (the session's cutoff after the forward).
    CloseRoute,
}

/// The commands' fixture, shared by every daemon of the run.
#[derive(Clone, Default)]
pub struct Commands {
    state: Arc<Mutex<State>>,
}

fn declared(module: &str) -> Value {
    if module == SECOND_MODULE {
        return json!([{"name": "ctx-status", "description": "The other module's status"}]);
    }
    json!([
        {"name": "ctx-status", "description": "Show the context's status"},
        {"name": "ctx-wrapup", "description": "Wrap the context up", "argument_hint": "[count]"},
    ])
}

impl Commands {
    /// The plan of a session prepared with `fixture`: the scripted module's tools (and the
    /// second module's, for a collision), `interactive: false` when no person drives it.
    pub fn prepare(&self, session: &str, fixture: &UserCommandFixture) -> Value {
        self.state
            .lock()
            .unwrap()
            .fixtures
            .insert(session.to_string(), fixture.clone());
        let mut items = vec![json!({"provider": MODULE, "params": {}})];
        if fixture.collision {
            items.push(json!({"provider": SECOND_MODULE, "params": {}}));
        }
        let mut plan = json!({"tool_items": items});
        if !fixture.interactive {
            plan["interactive"] = json!(false);
        }
        plan
    }

    /// Cuts the session's next command off at `at`.
    pub fn cut_off(&self, session: &str, at: Cutoff) {
        self.state
            .lock()
            .unwrap()
            .cutoffs
            .insert(session.to_string(), at);
    }

    /// Whether a command route of `session` is refused (its cutoff before the forward).
    pub fn refuses_route(&self, session: &str) -> bool {
        self.state.lock().unwrap().cutoffs.get(session) == Some(&Cutoff::BeforeForward)
    }

    /// `module`'s catalog answer for a route of `session`, given its tool catalog: the
    /// commands when the session was prepared for them (the second module offers no tool).
    pub fn catalog(&self, module: &str, session: &str, mut answer: Value) -> Value {
        if !self.state.lock().unwrap().fixtures.contains_key(session) {
            if module == SECOND_MODULE {
                // Outside the command cases, the second module offers a tool of its own (the
                // session_change cases' changed tool set).
                answer["tools"] = json!([other_tool()]);
                answer["catalog_digest"] = json!("c3");
            }
            return answer;
        }
        if module == SECOND_MODULE {
            answer["tools"] = json!([]);
            answer["catalog_digest"] = json!("c2");
        }
        answer["user_commands"] = declared(module);
        answer["capabilities"] = json!({"late_results": true});
        answer
    }

    /// The answer to a `user_command.invoke` on a route of `session`.
    pub fn invoke(&self, session: &str, body: &Value) -> Answer {
        let mut s = self.state.lock().unwrap();
        s.calls
            .entry(session.to_string())
            .or_default()
            .push(body.clone());
        if s.cutoffs.get(session) == Some(&Cutoff::AfterForward) {
            return Answer::CloseRoute;
        }
        let key = body["call_key"].as_str().unwrap_or("").to_string();
        if let Some(stored) = s.replies.get(&key) {
            return Answer::Frame(FrameType::Response, stored.clone());
        }
        let reply = match body["arguments"]["command"].as_str() {
            Some("ctx-status") => json!({"state": "done", "text": "command-private-reply"}),
            Some("ctx-wrapup") => {
                for (kind, extra) in [
                    ("progress", json!({"text": "command-progress-1"})),
                    ("progress", json!({"text": "command-progress-2"})),
                    (
                        "result",
                        json!({"result": {"state": "done", "text": "command-private-result"}}),
                    ),
                ] {
                    let seq = s.late.len() + 1;
                    let mut entry = json!({"kind": kind, "owner": "broca", "ref": session,
                        "scope_epoch": 1, "custodian": "broca", "call_key": key,
                        "event_id": format!("{key}/{seq}"), "settled_at": 1, "reduced": false});
                    if let (Value::Object(e), Value::Object(x)) = (&mut entry, extra) {
                        e.extend(x);
                    }
                    s.late.push(entry);
                }
                json!({"state": "accepted", "text": "command-accepted", "job": "wrapup-1"})
            }
            other => {
                return Answer::Frame(
                    FrameType::Error,
                    json!({"code": "unknown_user_command", "message": format!("no command {other:?}"),
                        "detail": {"command": other}}),
                )
            }
        };
        s.replies.insert(key, reply.clone());
        Answer::Frame(FrameType::Response, reply)
    }

    /// A `late_results` read: the entries after `since` (all of them after another
    /// incarnation's cursor).
    pub fn late_results(&self, arguments: &Value) -> Value {
        let s = self.state.lock().unwrap();
        let since = match &arguments["since"] {
            Value::Object(c) if c.get("provider_incarnation") == Some(&json!(INCARNATION)) => {
                c.get("seq").and_then(Value::as_u64).unwrap_or(0) as usize
            }
            _ => 0,
        };
        let entries: Vec<Value> = s.late.iter().skip(since).cloned().collect();
        json!({"entries": entries, "more": false,
            "cursor": {"provider_incarnation": INCARNATION, "seq": s.late.len()}})
    }

    /// What the provider saw of `session`, beside the model's requests: broca lists no
    /// command in any host menu, so none is registered.
    pub fn observation(&self, session: &str, model_inputs: Vec<Value>) -> UserCommandObservation {
        let mut seen = UserCommandObservation::default();
        seen.provider_calls = self
            .state
            .lock()
            .unwrap()
            .calls
            .get(session)
            .cloned()
            .unwrap_or_default();
        seen.model_inputs = model_inputs;
        seen
    }

    /// The fields of the prepared session's admission: the send's own and its plan.
    pub fn fields(&self, mut send: Map<String, Value>, plan: Value) -> Map<String, Value> {
        send.insert("plan".into(), plan);
        send
    }
}
