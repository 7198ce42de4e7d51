//! The scripted tool provider: a `tool-provider/v1` module behind the daemon serving one tool,
//! `conformance_echo`, outside broca's process. It answers each call with the result the
//! script gave for its arguments, counts every call that reaches it by those arguments (the
//! counts survive broca's restarts: they live here), and holds a call the script marks held
//! until the case releases it. The same consumer connections reach ckbus (`crate::bus`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cortexkit_role_harness::HarnessError;
use cortexkit_role_llm_runner_conformance::{SystemTextDefaultObservation, SCRIPTED_TOOL};
use serde_json::{json, Value};
use subc_protocol::{Frame, FrameType};
use subc_transport::frame_io::read_frame;
use tokio::io::AsyncRead;
use tokio::sync::Notify;

use crate::daemon::{send, Writer};

/// The module id broca's tools config names.
pub const MODULE: &str = "conformance-tools";

#[derive(Default)]
struct State {
    /// Scripted results by the call's arguments (as canonical JSON text), and whether held.
    results: HashMap<String, (Value, bool)>,
    /// Calls received, by arguments.
    calls: HashMap<String, usize>,
    /// The `schema_pin` each call arrived with, by arguments (the last one received).
    pins: HashMap<String, Option<String>>,
    /// Held calls released by the case.
    released: std::collections::HashSet<String>,
    /// What its manifest provides, as the daemon's `catalog.list` answers (the
    /// system-text-default cases set it).
    provides: Vec<String>,
    /// Each `tool.catalog` request's arguments, by the session its route is bound to.
    catalogs: HashMap<String, Vec<Value>>,
}

/// The module, shared by every daemon of the run.
#[derive(Clone, Default)]
pub struct ToolModule {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    /// Its person-only commands (and the second module's).
    pub commands: crate::commands::Commands,
}

fn key(arguments: &Value) -> String {
    arguments.to_string()
}

impl ToolModule {
    /// The script's answer to the call with `arguments`.
    pub fn script(&self, arguments: &Value, result: Value, hold: bool) {
        self.state
            .lock()
            .unwrap()
            .results
            .insert(key(arguments), (result, hold));
    }

    /// How many calls with `arguments` reached the module.
    pub fn invocations(&self, arguments: &Value) -> usize {
        self.state
            .lock()
            .unwrap()
            .calls
            .get(&key(arguments))
            .copied()
            .unwrap_or(0)
    }

    /// Waits (up to 30 s) until a call with `arguments` has reached the module.
    pub async fn await_call(&self, arguments: &Value) -> Result<(), String> {
        let until = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.changed.notified();
            if self.invocations(arguments) > 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return Err(format!(
                    "no call with {arguments} reached the tool within 30 s"
                ));
            }
        }
    }

    /// The `schema_pin` the call with `arguments` arrived with, as the module received it.
    pub fn pin(&self, arguments: &Value) -> Result<Option<String>, String> {
        self.state
            .lock()
            .unwrap()
            .pins
            .get(&key(arguments))
            .cloned()
            .ok_or_else(|| format!("no call with {arguments} reached the tool"))
    }

    /// Lets a held call with `arguments` answer.
    pub fn release(&self, arguments: &Value) {
        self.state.lock().unwrap().released.insert(key(arguments));
        self.changed.notify_waiters();
    }

    fn schema() -> Value {
        // The suite's calls carry arguments of its own choosing: any object.
        json!({"type": "object"})
    }

    /// The text it answers a system-text item with.
    pub const SYSTEM_TEXT: &'static str = "The conformance tools' default text.";

    fn provides(&self) -> Vec<String> {
        self.state.lock().unwrap().provides.clone()
    }

    /// The system-text-default cases' plan: the manifest provides exactly `provides`, and
    /// the plan names the module as its one system-text provider, the case's item as given.
    pub fn default_text_plan(
        &self,
        provides: &[String],
        item: &Value,
    ) -> Result<Value, HarnessError> {
        self.state.lock().unwrap().provides = provides.to_vec();
        let mut text_item = item
            .as_object()
            .cloned()
            .ok_or_else(|| HarnessError::new("the system-text item is not an object"))?;
        text_item.insert("provider".into(), json!(MODULE));
        Ok(json!({"system_text_items": [text_item]}))
    }

    /// What the module saw of `session` (harness `harness`, under the state dir `state`):
    /// every `tool.catalog` request over its routes, the system-text items as they arrived,
    /// and the session's WAL as it is on disk (empty while none exists: any write changes
    /// it).
    pub fn default_text_observation(
        &self,
        state: &std::path::Path,
        harness: &str,
        session: &str,
    ) -> Result<SystemTextDefaultObservation, HarnessError> {
        let requests = self
            .state
            .lock()
            .unwrap()
            .catalogs
            .get(session)
            .cloned()
            .unwrap_or_default();
        let mut seen = SystemTextDefaultObservation::default();
        seen.provider_calls = requests.len();
        seen.provider_items = requests
            .iter()
            .filter_map(|r| r.get("system_text"))
            .map(|item| serde_json::to_vec(item).expect("JSON serializes"))
            .collect();
        let triple =
            broca::wal::SessionTriple::new(broca::daemon::NO_WORKDIR_ROOT, harness, session)
                .map_err(|e| HarnessError::new(format!("the session's triple: {e}")))?;
        let wal = state.join("wal").join(format!("{}.wal", triple.address()));
        seen.durable_state = std::fs::read(wal).unwrap_or_default();
        Ok(seen)
    }

    /// Its answer to a `tool.catalog` request with `args`: the catalog, with the digest of
    /// the request's composition and, when asked, its text composed for its one tool.
    fn catalog_for(&self, session: &str, args: &Value) -> Value {
        use cortexkit_role_tool_provider::catalog::{composition_digest, system_text_digest};
        self.state
            .lock()
            .unwrap()
            .catalogs
            .entry(session.to_string())
            .or_default()
            .push(args.clone());
        let mut answer = Self::catalog();
        let digest = args
            .get("composition")
            .and_then(|c| composition_digest(c).ok());
        if let Some(d) = &digest {
            answer["composition_digest"] = json!(d);
        }
        if args.get("system_text").is_some() {
            answer["system_text"] = json!({
                "text": Self::SYSTEM_TEXT,
                "item_digest": system_text_digest(Self::SYSTEM_TEXT),
                "preflight_digest": system_text_digest("conformance-preflight"),
                "tool_names": [SCRIPTED_TOOL],
            });
            if let Some(d) = digest {
                answer["system_text"]["composition_digest"] = json!(d);
            }
        }
        answer
    }

    fn catalog() -> Value {
        use cortexkit_role_tool_provider::catalog::schema_digest;
        let schema = Self::schema();
        json!({"generation": "g1", "catalog_digest": "c1", "tools": [{
            "name": SCRIPTED_TOOL,
            "schema_digest": schema_digest(&schema).expect("the schema digests"),
            "semantics": 1,
            "capabilities": [],
            "description": "answers each call with its scripted result",
            "input_schema": schema,
            // Its answers are tool-result/v1 bodies on a route that declared the format.
            "result_format": "tool-result/v1",
        }]})
    }

    /// The answer to one call: its scripted result (after its release, when held).
    async fn call(&self, body: &Value) -> (FrameType, Value) {
        let arguments = &body["arguments"];
        let k = key(arguments);
        let scripted = {
            let mut s = self.state.lock().unwrap();
            *s.calls.entry(k.clone()).or_default() += 1;
            s.pins
                .insert(k.clone(), body["schema_pin"].as_str().map(str::to_string));
            s.results.get(&k).cloned()
        };
        self.changed.notify_waiters();
        let Some((result, hold)) = scripted else {
            return (
                FrameType::Error,
                json!({"code": "invalid_arguments", "message": format!("no scripted call has the arguments {arguments}")}),
            );
        };
        while hold {
            let notified = self.changed.notified();
            if self.state.lock().unwrap().released.contains(&k) {
                break;
            }
            notified.await;
        }
        (FrameType::Response, result)
    }
}

/// One consumer connection of broca's: route opens on channel 0, the tool's requests on the
/// routes, each answered in a task of its own (a held call holds only itself).
pub async fn consumer<R: AsyncRead + Unpin>(
    first: Frame,
    mut reader: R,
    writer: Writer,
    tools: ToolModule,
    bus: crate::bus::Bus,
) {
    // Each route, and whether its opener declared `tool-result/v1`.
    let mut routes = std::collections::HashMap::new();
    // Routes to ckbus's management surface (the bus's credential and nonce signatures).
    let mut ckbus_routes = std::collections::HashSet::new();
    let mut next_channel = 10u16;
    let mut frame = Some(first);
    loop {
        let f = match frame.take() {
            Some(f) => f,
            None => match read_frame(&mut reader).await {
                Ok(Some(f)) => f,
                _ => return,
            },
        };
        let h = f.header;
        let body: Value = serde_json::from_slice(&f.body).unwrap_or(Value::Null);
        match (h.channel, h.ty) {
            (0, FrameType::Request) if body["op"] == "catalog.list" => {
                let modules = if body["module_id"] == MODULE {
                    vec![json!({
                        "module_id": MODULE, "ready": true, "roles": [], "control_ops": [],
                        "capabilities": {"provides": tools.provides(), "requires": [],
                            "must_never_reach": []},
                    })]
                } else {
                    Vec::new()
                };
                let answer = json!({"op": "catalog.list", "generation": 1, "modules": modules,
                    "subc_ops": []});
                if send(
                    &writer,
                    FrameType::Response,
                    0,
                    h.epoch,
                    h.corr,
                    &answer,
                    false,
                )
                .await
                .is_err()
                {
                    return;
                }
            }
            (0, FrameType::Request) => {
                let target = &body["target"];
                let module = target["module_id"].as_str().unwrap_or("").to_string();
                let session = body["identity"]["session"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                let (ty, answer, daemon) = if target["kind"] == "tool_provider"
                    && tools.commands.refuses_route(&session)
                {
                    (
                        FrameType::Error,
                        json!({"code": "unknown_module", "message": "the session was cut off"}),
                        true,
                    )
                } else if target["kind"] == "tool_provider"
                    && (module == MODULE || module == crate::commands::SECOND_MODULE)
                {
                    next_channel += 1;
                    let v1 = body["consumer_capabilities"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c == "tool-result/v1"));
                    routes.insert(next_channel, (v1, session, module));
                    (
                        FrameType::Response,
                        json!({"op": "route.open", "route_channel": next_channel, "route_epoch": 1}),
                        false,
                    )
                } else if target["kind"] == "management_surface" && target["module_id"] == "ckbus" {
                    next_channel += 1;
                    ckbus_routes.insert(next_channel);
                    (
                        FrameType::Response,
                        json!({"op": "route.open", "route_channel": next_channel, "route_epoch": 1}),
                        false,
                    )
                } else {
                    (
                        FrameType::Error,
                        json!({"code": "unknown_module", "message": "this daemon serves only the scripted tools"}),
                        true,
                    )
                };
                if send(&writer, ty, 0, h.epoch, h.corr, &answer, daemon)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            (ch, FrameType::Request) if routes.contains_key(&ch) => {
                let (tools, writer) = (tools.clone(), writer.clone());
                let (v1, session, module) = routes[&ch].clone();
                tokio::spawn(async move {
                    let (ty, answer) = match body["name"].as_str() {
                        Some("user_command.invoke") => {
                            match tools.commands.invoke(&session, &body) {
                                crate::commands::Answer::Frame(ty, answer) => (ty, answer),
                                crate::commands::Answer::CloseRoute => {
                                    let _ = send(
                                        &writer,
                                        FrameType::Goodbye,
                                        ch,
                                        h.epoch,
                                        0,
                                        &Value::Null,
                                        false,
                                    )
                                    .await;
                                    return;
                                }
                            }
                        }
                        Some("late_results") => (
                            FrameType::Response,
                            tools.commands.late_results(&body["arguments"]),
                        ),
                        Some("late_results.ack") => (FrameType::Response, json!({})),
                        Some("role.describe") => (
                            FrameType::Response,
                            json!({"majors": [{"version": "tool-provider/v1", "ops": ["role.describe", "tool.catalog"], "stability": "alpha"}],
                                   "implementation_version": "conformance"}),
                        ),
                        Some("tool.catalog") => (
                            FrameType::Response,
                            tools.commands.catalog(
                                &module,
                                &session,
                                tools.catalog_for(&session, &body["arguments"]),
                            ),
                        ),
                        Some(SCRIPTED_TOOL) => match tools.call(&body).await {
                            (FrameType::Response, result) if v1 => {
                                (FrameType::Response, result_v1(result))
                            }
                            other => other,
                        },
                        other => (
                            FrameType::Error,
                            json!({"code": "unknown_tool", "message": format!("no tool {other:?}")}),
                        ),
                    };
                    let _ = send(&writer, ty, ch, h.epoch, h.corr, &answer, false).await;
                });
            }
            (ch, FrameType::Request) if ckbus_routes.contains(&ch) => {
                let (ty, answer) = match bus.ckbus(&body) {
                    Ok(answer) => (FrameType::Response, answer),
                    Err(error) => (FrameType::Error, error),
                };
                if send(&writer, ty, ch, h.epoch, h.corr, &answer, false)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            (ch, FrameType::Request) => {
                let e = json!({"code": "unknown_channel", "message": "no such route"});
                if send(&writer, FrameType::Error, ch, h.epoch, h.corr, &e, true)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            (ch, FrameType::Goodbye) => {
                routes.remove(&ch);
                ckbus_routes.remove(&ch);
            }
            _ => {}
        }
    }
}

/// A scripted result as the tool answers on a route that declared `tool-result/v1`: a body of
/// that format as it is (one with `content`), else the legacy body's text as its one part.
fn result_v1(result: Value) -> Value {
    match result {
        Value::Object(ref o) if o.contains_key("content") => result,
        Value::String(text) => json!({"content": [{"type": "text", "text": text}]}),
        other => json!({"content": [{"type": "text", "text": other.to_string()}]}),
    }
}
