//! The daemon stand-in's tool_provider module (tests/support/daemon.rs): its catalog, what
//! each of its tools answers, and what it saw.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use subc_protocol::FrameType;

use super::Reply;

#[path = "compactor.rs"]
mod compactor;
pub use compactor::Compactor;

/// A tool_provider module behind the daemon: `echo` (answers its message), `record` (answers
/// what it recorded), `hang` (never answers), `die` (the module dies with the call: the
/// connection ends), `wait` (answers after its `ms` argument, and declares a reply deadline
/// of that hold plus 1 s, up to 10 s), `consent` (a held first reply: a person must consent;
/// a `held` update, then its result `approved: NOTE` after `ms`, come as late results). It
/// counts every call that reaches it, by call key.
#[derive(Clone)]
pub struct ToolModule {
    pub module_id: String,
    /// Codes to refuse the next route.opens with, in order.
    pub refuse_opens: Arc<Mutex<Vec<String>>>,
    /// When set, the next call is answered `stale_route_epoch` by the daemon (never delivered).
    pub stale_next: Arc<std::sync::atomic::AtomicBool>,
    /// When set, the daemon's `catalog.list` says the module provides `call-keepalive/v1`,
    /// and `long` sends keepalives while it works.
    pub keepalive: Arc<std::sync::atomic::AtomicBool>,
    /// When set, the daemon's `catalog.list` says the module provides
    /// `system-text-default/v1` (it serves a default text for a preset-less item).
    pub default_text: Arc<std::sync::atomic::AtomicBool>,
    /// When set, a `tool.catalog` request carrying a composition (a plan's fetch) is never
    /// answered.
    pub hang_plan_catalogs: Arc<std::sync::atomic::AtomicBool>,
    /// When set, its catalog declares the person-only commands `status` (answered `done`
    /// with its input), `wrapup` (answered `accepted`; a progress entry, then its result
    /// 300 ms later, come as late results) and `crash` (the module dies with it).
    pub commands: Arc<std::sync::atomic::AtomicBool>,
    pub log: ToolLog,
    /// What it answers as a compaction provider (`compaction.*` ops).
    pub compactor: Compactor,
}

/// What the tool module saw.
#[derive(Clone, Default)]
pub struct ToolLog {
    /// Every route.open body (tool routes only).
    pub opens: Arc<Mutex<Vec<Value>>>,
    /// Every call delivered to the module: (call body, channel).
    pub calls: Arc<Mutex<Vec<(Value, u16)>>>,
    /// CANCELs received: (channel, corr).
    pub cancels: Arc<Mutex<Vec<(u16, u64)>>>,
    /// The scope stamp each tool route's bind carries, by channel (`Null`: unscoped).
    pub stamps: Arc<Mutex<std::collections::HashMap<u16, Value>>>,
    /// Its late results (`late_results`, tool-provider/v1 §7): each entry with its seq and
    /// when it becomes visible.
    pub late: Arc<Mutex<Vec<(u64, std::time::Instant, Value)>>>,
    /// The `late_results` reads (their arguments) and acks (their `through` cursors).
    pub late_reads: Arc<Mutex<Vec<Value>>>,
    pub acks: Arc<Mutex<Vec<Value>>>,
    /// Every `tool.catalog` request's arguments.
    pub catalogs: Arc<Mutex<Vec<Value>>>,
}

/// The stand-in module's provider incarnation (its late results' cursors carry it).
const INCARNATION: &str = "tools-inc-1";

impl ToolModule {
    pub fn new(module_id: &str) -> ToolModule {
        ToolModule {
            module_id: module_id.into(),
            refuse_opens: Arc::default(),
            stale_next: Arc::default(),
            keepalive: Arc::default(),
            default_text: Arc::default(),
            hang_plan_catalogs: Arc::default(),
            commands: Arc::default(),
            log: ToolLog::default(),
            compactor: Compactor::default(),
        }
    }

    /// How many times the call with this model call id reached the module.
    pub fn times(&self, call_id: &str) -> usize {
        self.log
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c["tool_call_id"] == call_id)
            .count()
    }

    fn tools() -> Vec<(&'static str, Value)> {
        let text = |field: &str| serde_json::json!({"type": "object", "properties": {field: {"type": "string"}}, "required": [field]});
        vec![
            ("echo", text("message")),
            ("record", text("note")),
            (
                "hang",
                serde_json::json!({"type": "object", "properties": {}}),
            ),
            (
                "die",
                serde_json::json!({"type": "object", "properties": {}}),
            ),
            (
                "wait",
                serde_json::json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
            ),
            (
                "long",
                serde_json::json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
            ),
            (
                "consent",
                serde_json::json!({"type": "object", "properties": {"note": {"type": "string"}, "ms": {"type": "integer"}}}),
            ),
        ]
    }

    /// The system text it answers a `system_text` item with.
    pub const SYSTEM_TEXT: &'static str = "Use the record tool to note things down.";

    /// Its answer to a `tool.catalog` request with `args`: with the request's composition's
    /// digest and, when asked, its system text composed for every tool it offers.
    fn catalog_for(args: &Value) -> Value {
        use cortexkit_role_tool_provider::catalog::{composition_digest, system_text_digest};
        let mut answer = Self::catalog();
        let digest = args
            .get("composition")
            .map(|c| composition_digest(c).unwrap());
        if let Some(d) = &digest {
            answer["composition_digest"] = serde_json::json!(d);
        }
        if args.get("system_text").is_some() {
            let mut names: Vec<&str> = Self::tools().into_iter().map(|(n, _)| n).collect();
            names.sort_unstable();
            answer["system_text"] = serde_json::json!({
                "text": Self::SYSTEM_TEXT,
                "item_digest": system_text_digest(Self::SYSTEM_TEXT),
                "preflight_digest": system_text_digest("preflight"),
                "composition_digest": digest,
                "tool_names": names,
            });
        }
        answer
    }

    fn catalog() -> Value {
        use cortexkit_role_tool_provider::catalog::schema_digest;
        let tools: Vec<Value> = Self::tools()
            .into_iter()
            .map(|(name, schema)| {
                let mut tool = serde_json::json!({
                    "name": name, "schema_digest": schema_digest(&schema).unwrap(),
                    "semantics": 1, "capabilities": [], "description": format!("the {name} tool"),
                    "input_schema": schema,
                });
                if name == "consent" {
                    tool["result_format"] = serde_json::json!("tool-result/v1");
                }
                if name == "wait" {
                    tool["reply"] = serde_json::json!({"max_ms": 10_000,
                        "hold_argument": {"name": "ms", "default_ms": 2_500, "grace_ms": 1_000}});
                }
                tool
            })
            .collect();
        serde_json::json!({"generation": "g1", "catalog_digest": "c1", "tools": tools,
            "capabilities": {"late_results": true}})
    }

    fn pin_of(name: &str) -> Option<String> {
        use cortexkit_role_tool_provider::call::SchemaPin;
        use cortexkit_role_tool_provider::catalog::schema_digest;
        let (_, schema) = Self::tools().into_iter().find(|(n, _)| *n == name)?;
        SchemaPin::new(name, schema_digest(&schema).unwrap(), 1)
            .encode()
            .ok()
    }
}

pub(super) fn tool_answer(t: &ToolModule, body: &Value, channel: u16) -> Reply {
    if body["method"]
        .as_str()
        .is_some_and(|m| m.starts_with("compaction.") || m.starts_with("transform."))
    {
        return compactor::answer(&t.compactor, body);
    }
    let name = body["name"].as_str().unwrap_or("");
    match name {
        "role.describe" => {
            return Reply::Frame(
                FrameType::Response,
                serde_json::json!({"majors": [{"version": "tool-provider/v1", "ops": ["role.describe", "tool.catalog"], "stability": "alpha"}],
                                   "implementation_version": "test"}),
                false,
            )
        }
        "tool.catalog" => {
            let args = body.get("arguments").cloned().unwrap_or_default();
            t.log.catalogs.lock().unwrap().push(args.clone());
            if args.get("composition").is_some() && t.hang_plan_catalogs.load(Ordering::SeqCst) {
                return Reply::Silence;
            }
            let mut answer = ToolModule::catalog_for(&args);
            if t.commands.load(Ordering::SeqCst) {
                answer["user_commands"] = serde_json::json!([
                    {"name": "status", "description": "Show the status"},
                    {"name": "wrapup", "description": "Wrap up", "argument_hint": "[count]"},
                    {"name": "crash", "description": "Take the module down with it"},
                ]);
            }
            return Reply::Frame(FrameType::Response, answer, false);
        }
        "user_command.invoke" => {
            t.log.calls.lock().unwrap().push((body.clone(), channel));
            return user_command(t, body, channel);
        }
        "late_results" => return late_read(t, &body["arguments"]),
        "late_results.ack" => {
            t.log
                .acks
                .lock()
                .unwrap()
                .push(body["arguments"]["through"].clone());
            return Reply::Frame(FrameType::Response, serde_json::json!({}), false);
        }
        _ => {}
    }
    if t.stale_next.swap(false, Ordering::SeqCst) {
        return Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "stale_route_epoch", "message": "the route moved"}),
            true,
        );
    }
    t.log.calls.lock().unwrap().push((body.clone(), channel));
    if body["schema_pin"].as_str() != ToolModule::pin_of(name).as_deref() {
        return Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "tool_schema_changed", "message": "pinned against another schema"}),
            false,
        );
    }
    let args = &body["arguments"];
    match name {
        "echo" => Reply::Frame(
            FrameType::Response,
            Value::String(format!("echo: {}", args["message"].as_str().unwrap_or(""))),
            false,
        ),
        "record" => Reply::Frame(
            FrameType::Response,
            serde_json::json!({"recorded": args["note"]}),
            false,
        ),
        "consent" => {
            let stamp = t.log.stamps.lock().unwrap().get(&channel).cloned();
            let stamp = stamp.unwrap_or(Value::Null);
            let common = serde_json::json!({"owner": "reserved:ck-broca",
                "ref": stamp["ref"].as_str().unwrap_or("unscoped"),
                "scope_epoch": stamp["scope_epoch"].as_u64().unwrap_or(0),
                "custodian": "reserved:ck-broca", "call_key": body["call_key"], "settled_at": 1});
            let entry = |kind: &str, extra: Value| {
                let mut e = common.clone();
                e["kind"] = kind.into();
                e["event_id"] =
                    format!("{}:{kind}", body["call_key"].as_str().unwrap_or("")).into();
                e.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                e
            };
            let now = std::time::Instant::now();
            let later = now + Duration::from_millis(args["ms"].as_u64().unwrap_or(0));
            let mut late = t.log.late.lock().unwrap();
            let seq = late.len() as u64;
            late.push((
                seq + 1,
                now,
                entry("held", serde_json::json!({"held": {"reason": "running"}})),
            ));
            let text = format!("approved: {}", args["note"].as_str().unwrap_or(""));
            late.push((
                seq + 2,
                later,
                entry(
                    "result",
                    serde_json::json!({"result":
                {"content": [{"type": "text", "text": text}]}}),
                ),
            ));
            Reply::Frame(
                FrameType::Response,
                serde_json::json!({"content": [{"type": "text", "text": "Please approve the consent card."}],
                    "held": {"reason": "consent"}}),
                false,
            )
        }
        "hang" => Reply::Silence,
        "die" => Reply::Die,
        "wait" => Reply::Later(
            Duration::from_millis(args["ms"].as_u64().unwrap_or(0)),
            FrameType::Response,
            serde_json::json!({"waited_ms": args["ms"]}),
        ),
        "long" => Reply::Working(
            Duration::from_millis(200),
            t.keepalive.load(Ordering::SeqCst),
            Duration::from_millis(args["ms"].as_u64().unwrap_or(0)),
            FrameType::Response,
            serde_json::json!({"worked_ms": args["ms"]}),
        ),
        other => Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "unknown_tool", "message": format!("no tool {other}"), "detail": {"tool": other}}),
            false,
        ),
    }
}

/// The answer to a person-only command (see [`ToolModule::commands`]).
fn user_command(t: &ToolModule, body: &Value, channel: u16) -> Reply {
    let args = &body["arguments"];
    let input = args["input"].as_str().unwrap_or("");
    match args["command"].as_str().unwrap_or("") {
        "status" => Reply::Frame(
            FrameType::Response,
            serde_json::json!({"state": "done", "text": format!("status of {input}")}),
            false,
        ),
        "wrapup" => {
            let stamp = t.log.stamps.lock().unwrap().get(&channel).cloned();
            let stamp = stamp.unwrap_or(Value::Null);
            let key = body["call_key"].as_str().unwrap_or("");
            let entry = |kind: &str, extra: Value| {
                let mut e = serde_json::json!({"owner": "reserved:ck-broca",
                    "ref": stamp["ref"].as_str().unwrap_or("unscoped"),
                    "scope_epoch": stamp["scope_epoch"].as_u64().unwrap_or(0),
                    "custodian": "reserved:ck-broca", "call_key": key, "settled_at": 1,
                    "kind": kind, "event_id": format!("{key}:{kind}")});
                e.as_object_mut()
                    .unwrap()
                    .extend(extra.as_object().unwrap().clone());
                e
            };
            let now = std::time::Instant::now();
            let mut late = t.log.late.lock().unwrap();
            let seq = late.len() as u64;
            let progress = serde_json::json!({"text": "halfway"});
            late.push((seq + 1, now, entry("progress", progress)));
            let result = serde_json::json!({"result": {"state": "done", "text": "wrapped up"}});
            late.push((
                seq + 2,
                now + Duration::from_millis(300),
                entry("result", result),
            ));
            Reply::Frame(
                FrameType::Response,
                serde_json::json!({"state": "accepted", "text": "working on it", "job": "w1"}),
                false,
            )
        }
        "crash" => Reply::Die,
        other => Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "unknown_user_command", "message": format!("no command {other}"),
                "detail": {"command": other}}),
            false,
        ),
    }
}

/// A `late_results` read: the visible entries after `since` (a cursor of another incarnation
/// is refused as the role says).
fn late_read(t: &ToolModule, args: &Value) -> Reply {
    t.log.late_reads.lock().unwrap().push(args.clone());
    let since = &args["since"];
    if !since.is_null() && since["provider_incarnation"] != INCARNATION {
        return Reply::Frame(
            FrameType::Error,
            serde_json::json!({"code": "cursor_incarnation_changed", "message": "re-read from null"}),
            false,
        );
    }
    let after = since["seq"].as_u64().unwrap_or(0);
    let now = std::time::Instant::now();
    let late = t.log.late.lock().unwrap();
    let mut seq = after;
    let mut entries = Vec::new();
    for (s, visible, e) in late.iter() {
        if *s <= after {
            continue;
        }
        if *visible > now {
            break;
        }
        seq = *s;
        entries.push(e.clone());
    }
    Reply::Frame(
        FrameType::Response,
        serde_json::json!({"entries": entries, "more": false,
            "cursor": {"provider_incarnation": INCARNATION, "seq": seq}}),
        false,
    )
}

/// The daemon's `catalog.list` answer for `body`'s module: the tool module's manifest, its
/// `provides` as its switches say, when it is the module asked for.
pub(super) fn catalog_list(tools: Option<&ToolModule>, body: &Value) -> Reply {
    use std::sync::atomic::Ordering;
    let module = body["module_id"].as_str().unwrap_or("");
    let modules = match tools.filter(|t| t.module_id == module) {
        Some(t) => {
            let mut provides: Vec<&str> = Vec::new();
            if t.keepalive.load(Ordering::SeqCst) {
                provides.push(cortexkit_role_tool_provider::CALL_KEEPALIVE_CAPABILITY);
            }
            if t.default_text.load(Ordering::SeqCst) {
                provides.push(cortexkit_role_llm_runner::SYSTEM_TEXT_DEFAULT_PROVIDER_CAPABILITY);
            }
            vec![serde_json::json!({
                "module_id": module, "ready": true, "roles": [], "control_ops": [],
                "capabilities": {"provides": provides, "requires": [], "must_never_reach": []},
            })]
        }
        None => Vec::new(),
    };
    Reply::Frame(
        FrameType::Response,
        serde_json::json!({"op": "catalog.list", "generation": 1, "modules": modules, "subc_ops": []}),
        false,
    )
}
