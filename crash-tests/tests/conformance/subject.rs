//! broca as the suite's `LlmRunnerSubject`: each module is the real `broca module` process
//! (the `ck-broca` entry) under the stand-in daemon, on the state root the suite hands it; a
//! kill arms a crash point in the running process (`BROCA_CRASH_ARM`) and waits for it to
//! abort; a restart starts broca again on the same root, as the supervisor would.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cortexkit_role_harness::{
    Harness, HarnessError, KillMechanism, KillPoint, KillReport, PointDeclaration, RouteStamp,
    Trigger,
};
use cortexkit_role_llm_runner_conformance::{
    ArchivePruningPart, AttributionFixture, Capability, LlmRunnerSubject, ModelRequestObservation,
    PlanSenderIdentity, RefreshPlan, RefreshVariant, Reply, RunnerRoute, Script,
    SystemTextDefaultObservation, ToolResultLimitObservation, ToolResultObservation,
    UserCommandFixture, UserCommandObservation, SCRIPTED_TOOL,
};
use serde_json::{json, Map, Value};

use crate::daemon::{Daemon, Link};
use crate::kills::POINTS;
use crate::model::Model;
pub use crate::route::Route;
use crate::tools::{ToolModule, MODULE};

/// The harness every route's session lives under.
pub(crate) const HARNESS: &str = "conformance";
/// How long a subscription may be silent before the suite's replay is taken as complete.
pub(crate) const QUIET: Duration = Duration::from_millis(300);
/// How long a request waits for broca's answer.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(60);

pub struct Subject {
    pub(crate) model: Model,
    pub(crate) tools: ToolModule,
    pub(crate) bus: crate::bus::Bus,
    support: crate::structured::Support,
    /// The live modules' connections (the retention clock, the prune hook).
    pub(crate) live: crate::retention::Live,
}

/// A live broca module: its process, the daemon it is connected to, and the connection.
pub struct Module {
    pub(crate) root: PathBuf,
    pub(crate) child: Mutex<Option<tokio::process::Child>>,
    /// The daemon, the process and its connection: replaced by a restart in place
    /// (`restart_attachments`).
    pub(crate) daemon: Mutex<Option<Daemon>>,
    pub(crate) link: Mutex<Arc<Link>>,
}

/// Dropping a module stops it as its supervisor would: SIGTERM (admission closes, active runs
/// get the grace period, the rest are sealed interrupted), then its exit is awaited, so the
/// next module on the same root finds the state dir free. One that has not exited within
/// 15 s is killed.
impl Drop for Module {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Module {
    fn stop(&self) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        if let Some(pid) = child.id() {
            // SAFETY: a signal to the process this handle started and has not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let until = std::time::Instant::now() + Duration::from_secs(15);
        while std::time::Instant::now() < until {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.start_kill();
        while matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The principal of every session's owner.
pub(crate) const OWNER: &str = "reserved:conformance-owner";
/// The module a session's plan names in `senders` (delivery_order's cases).
const SENDER: &str = "conformance-sender";
/// The two senders of the cases that name a pair (succession, a refresh's sender list).
const SENDER_A: &str = "conformance-sender-a";
const SENDER_B: &str = "conformance-sender-b";

impl Subject {
    pub async fn new() -> Subject {
        Subject {
            model: Model::start().await,
            tools: ToolModule::default(),
            bus: crate::bus::Bus::start().await,
            support: Default::default(),
            live: Default::default(),
        }
    }
}

#[async_trait]
impl Harness for Subject {
    type Handle = Module;
    type Route = Route;

    fn declared_points(&self) -> Vec<PointDeclaration> {
        POINTS
            .iter()
            .map(|(point, _, note)| PointDeclaration {
                point: KillPoint::new(*point),
                mechanisms: vec![KillMechanism::FaultHookThenProcessKill],
                note: format!("{note}; BROCA_CRASH_ARM aborts the process right after it"),
            })
            .collect()
    }

    async fn spawn(&self, state_root: &Path) -> Result<Module, HarnessError> {
        self.start(state_root).await
    }

    async fn route(&self, handle: &Module, stamp: &RouteStamp) -> Result<Route, HarnessError> {
        self.session_route(handle, "cf-harness-route", stamp).await
    }

    async fn kill_at(
        &self,
        handle: Module,
        point: &KillPoint,
        trigger: Trigger<'_>,
    ) -> Result<KillReport, HarnessError> {
        let Some((_, hook, _)) = POINTS.iter().find(|(p, _, _)| *p == point.as_str()) else {
            return Err(HarnessError::new(format!("{point} is not declared")));
        };
        // Written whole, then renamed: broca never reads half a plan.
        let arm = crate::start::arm_file(&handle.root);
        let staged = arm.with_extension("staged");
        std::fs::write(&staged, format!("{hook}:1"))
            .and_then(|()| std::fs::rename(&staged, &arm))
            .map_err(|e| HarnessError::new(format!("arming {point}: {e}")))?;
        let mut child = handle
            .child
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| HarnessError::new("the module has no process"))?;
        let status = tokio::select! {
            status = child.wait() => status,
            () = trigger => {
                match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                    Ok(status) => status,
                    Err(_) => return Err(HarnessError::new(format!(
                        "the trigger finished and broca did not reach {point} ({hook}) within 10 s"
                    ))),
                }
            }
        }
        .map_err(|e| HarnessError::new(format!("waiting for broca: {e}")))?;
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(libc::SIGABRT) {
            return Err(HarnessError::new(format!(
                "broca ended {status} instead of aborting at {point} ({hook})"
            )));
        }
        Ok(KillReport {
            point: point.clone(),
            mechanism: KillMechanism::FaultHookThenProcessKill,
        })
    }

    async fn restart(&self, state_root: &Path) -> Result<Module, HarnessError> {
        self.start(state_root).await
    }
}

#[async_trait]
impl LlmRunnerSubject for Subject {
    fn runner_id(&self) -> &str {
        "ck-broca"
    }

    fn capabilities(&self) -> BTreeSet<Capability> {
        let mut declared: BTreeSet<Capability> = broca::wire::role::GROUPS
            .iter()
            .filter_map(|g| Capability::from_group(g))
            .collect();
        declared.insert(Capability::HoldToolCalls);
        // Module mode publishes step hints on the daemon's bus (`role.describe` says so).
        declared.extend(Capability::from_group("step_events"));
        // The scripted model records the texts each request carried (`rendered_texts`).
        declared.insert(Capability::RenderedModelInput);
        // The debug build's `broca.debug.advance_clock` (retention.rs).
        declared.insert(Capability::RetentionClock);
        // The module's config sets `prune_reasoning` (`role.describe` declares it then).
        declared.insert(Capability::ArchivePrunesReasoning);
        // ... and `plans`, with `system_text_default`.
        declared.insert(Capability::Plans);
        declared.insert(Capability::SystemTextDefault);
        declared.insert(Capability::UserCommands);
        declared.insert(Capability::SessionChange);
        declared.insert(Capability::DeliveryOrder);
        declared.insert(Capability::SenderSuccession);
        declared.insert(Capability::Adopt);
        declared
    }

    fn owner_stamp(&self) -> RouteStamp {
        RouteStamp {
            principal: OWNER.into(),
            scope: None,
        }
    }

    fn stranger_stamp(&self) -> RouteStamp {
        RouteStamp {
            principal: "reserved:conformance-stranger".into(),
            scope: None,
        }
    }

    async fn session_route(
        &self,
        handle: &Module,
        session: &str,
        stamp: &RouteStamp,
    ) -> Result<Route, HarnessError> {
        let link = handle.link.lock().unwrap().clone();
        let channel = link
            .bind(HARNESS, session, stamp)
            .await
            .map_err(HarnessError::new)?;
        Ok(Route { link, channel })
    }

    fn retention_scope_stamps(&self) -> Option<(RouteStamp, RouteStamp)> {
        Some(crate::retention::scope_stamps())
    }

    async fn prepare_runner_retention(
        &self,
        handle: &Module,
        session: &str,
    ) -> Result<bool, HarnessError> {
        // A session broca hosts without a starter's send: another harness's log taken in
        // (`session.import`), which carries the runner's own policy.
        self.seed_host_history(handle, session, 2, false).await?;
        Ok(true)
    }

    fn request_dumps_unsupported(&self) -> bool {
        // broca keeps no request dumps: `request_dumps: true` is flagged on head.
        true
    }

    fn supports_model_failure_fixture(&self) -> bool {
        // The scripted model answers a failing turn with its wire's error status and body
        // (and `retry-after-ms`); broca's transport classifies it as a real one.
        true
    }

    fn session_usage_fixtures(&self) -> bool {
        // The scripted model reports each turn's usage at face value; broca keeps no host
        // of its own that could rewind a session (that case stays not applicable).
        true
    }

    fn model_finish_reason_source(&self) -> Option<&'static str> {
        Some("anthropic.messages")
    }

    fn send_fields(&self, session: &str, first: bool) -> Map<String, Value> {
        let mut fields = Map::new();
        let provider = self.support.provider(session, self.model.provider(session));
        fields.insert("model".into(), json!(format!("{provider}/{session}")));
        if first {
            // Module mode requires a storage policy on a session's first send, as every
            // starter sends one (llm-runner/v1 `session_retention`).
            fields.insert(
                "retention_policy".into(),
                json!({"keep": "forever", "archive_after_days": 0, "backup": false,
                    "request_dumps": false}),
            );
        }
        fields
    }

    fn send_fields_with_plan(
        &self,
        session: &str,
        first: bool,
        members: &Map<String, Value>,
    ) -> Option<Map<String, Value>> {
        // These members (its senders) beside the module's tools, which the scripted model
        // calls.
        let mut plan = members.clone();
        plan.insert(
            "tool_items".into(),
            json!([{"provider": MODULE, "params": {}}]),
        );
        crate::numbers::with_provider(session, &mut plan);
        let mut fields = self.send_fields(session, first);
        fields.insert("plan".into(), Value::Object(plan));
        Some(fields)
    }

    fn plan_sender(&self) -> Option<PlanSenderIdentity> {
        // The plan names the module; the daemon attests its routes as `reserved:<module>`.
        let stamp = RouteStamp {
            principal: format!("reserved:{SENDER}"),
            scope: None,
        };
        Some(PlanSenderIdentity::new(stamp, SENDER))
    }

    fn host_plan(&self, _session: &str, alternate: bool) -> Option<Map<String, Value>> {
        Some(Subject::installation_plan(alternate))
    }

    async fn start_host_session(
        &self,
        handle: &Module,
        session: &str,
        plan: &Map<String, Value>,
        prompt: Option<&str>,
    ) -> Result<(), HarnessError> {
        self.host_start(handle, session, plan, prompt).await
    }

    fn head_sender_identities(&self) -> Option<[PlanSenderIdentity; 2]> {
        // Two more modules, each attested by the daemon as `reserved:<module>`.
        let identity = |module: &str| {
            let stamp = RouteStamp {
                principal: format!("reserved:{module}"),
                scope: None,
            };
            PlanSenderIdentity::new(stamp, module)
        };
        Some([identity(SENDER_A), identity(SENDER_B)])
    }

    fn send_fields_with_tools(
        &self,
        session: &str,
        first: bool,
        tools: &[&str],
    ) -> Option<Map<String, Value>> {
        // broca admits the tools a send names, of those its tool modules serve.
        let mut fields = self.send_fields(session, first);
        fields.insert("tools".into(), json!(tools));
        Some(fields)
    }

    fn attachment_model_fields(&self, session: &str, accepts: bool) -> Option<Map<String, Value>> {
        // The session's sends (this one and every later one) name a provider whose catalog
        // row says its models take PNG images and PDFs, or text alone.
        self.support.set_media(session, accepts);
        Some(self.send_fields(session, true))
    }

    fn attachment_tool_result(&self, png: &[u8]) -> Option<Value> {
        Some(crate::media::attachment_tool_result(png))
    }

    fn media_tool_result(&self, bytes: &[u8], nested: bool, scenario: &str) -> Option<Value> {
        crate::media::media_tool_result(bytes, nested, scenario)
    }

    async fn restart_attachments(
        &self,
        handle: &Module,
        session: &str,
    ) -> Result<Route, HarnessError> {
        // Stopped as its supervisor would stop it, then started again on the same root; the
        // new process lives as long as the suite's handle.
        handle.stop();
        let next = self.start(&handle.root).await?;
        *handle.child.lock().unwrap() = next.child.lock().unwrap().take();
        *handle.daemon.lock().unwrap() = next.daemon.lock().unwrap().take();
        *handle.link.lock().unwrap() = next.link.lock().unwrap().clone();
        self.session_route(handle, session, &self.owner_stamp())
            .await
    }

    async fn set_structured_output_support(
        &self,
        session: &str,
        supported: Option<bool>,
    ) -> Result<(), HarnessError> {
        // The session's sends name a provider whose catalog row says so (broca is its own
        // host: it can always send a schema in a constrained form).
        self.support.set(session, supported);
        Ok(())
    }

    fn tool_provider_module(&self) -> String {
        MODULE.to_string()
    }

    async fn prepare_system_text_default(
        &self,
        session: &str,
        provides: &[String],
        item: &Value,
    ) -> Result<Map<String, Value>, HarnessError> {
        let plan = self.tools.default_text_plan(provides, item)?;
        let mut fields = self.send_fields(session, true);
        fields.insert("plan".into(), plan);
        Ok(fields)
    }

    async fn system_text_default_observation(
        &self,
        handle: &Self::Handle,
        session: &str,
    ) -> Result<SystemTextDefaultObservation, HarnessError> {
        self.tools
            .default_text_observation(&handle.root.join("state"), HARNESS, session)
    }

    async fn prepare_user_commands(
        &self,
        session: &str,
        fixture: &UserCommandFixture,
    ) -> Result<(String, Map<String, Value>), HarnessError> {
        let plan = self.tools.commands.prepare(session, fixture);
        let fields = self.send_fields(session, true);
        Ok((
            session.to_string(),
            self.tools.commands.fields(fields, plan),
        ))
    }

    async fn user_command_observation(
        &self,
        session: &str,
    ) -> Result<UserCommandObservation, HarnessError> {
        let inputs = self.model.requests(session);
        Ok(self.tools.commands.observation(session, inputs))
    }

    async fn cut_off_user_command(
        &self,
        _handle: &Module,
        session: &str,
        after_forward: bool,
    ) -> Result<(), HarnessError> {
        use crate::commands::Cutoff;
        let at = if after_forward {
            Cutoff::AfterForward
        } else {
            Cutoff::BeforeForward
        };
        self.tools.commands.cut_off(session, at);
        Ok(())
    }

    fn refresh_plan(&self, _session: &str, variant: RefreshVariant) -> Option<RefreshPlan> {
        // broca's host fixes no tool set at start: only a changed tool set is a question.
        let RefreshVariant::ChangedTools = variant else {
            return None;
        };
        let (plan, tools) = crate::commands::refresh_plan();
        Some(RefreshPlan::new(plan, tools))
    }

    async fn install_script(&self, session: &str, script: Script) -> Result<(), HarnessError> {
        for call in script.tool_calls() {
            if call.tool == SCRIPTED_TOOL {
                self.tools
                    .script(&call.arguments, call.result.clone(), call.hold);
            }
        }
        self.model.install(session, script);
        Ok(())
    }

    async fn install_attribution_fixture(
        &self,
        handle: &Module,
        session: &str,
    ) -> Result<AttributionFixture, HarnessError> {
        // A message whose run cannot be told: one imported from another harness's log
        // (`session.import`, a real write path), which no broca run produced.
        let route = self
            .session_route(handle, session, &self.owner_stamp())
            .await?;
        let head = route
            .request("session.head", json!({}))
            .await
            .map_err(|e| HarnessError::new(format!("session.head: {}", e.message)))?;
        let Reply::Response(head) = head else {
            return Err(HarnessError::new(format!("session.head refused: {head:?}")));
        };
        let last = head["last_ordinal"].as_u64().unwrap_or(0);
        let marker = format!("{session}-imported-marker");
        let lines = vec![
            json!({"role": "user", "content": marker}),
            json!({"role": "assistant", "model": "m", "content": [{"type": "text", "text": "noted"}]}),
        ];
        self.import(handle, session, "attribution", lines).await?;
        Ok(AttributionFixture::Installed {
            ordinal: last + 1,
            marker,
        })
    }

    async fn seed_host_history(
        &self,
        handle: &Module,
        session: &str,
        count: u64,
        cut: bool,
    ) -> Result<(), HarnessError> {
        if cut {
            return Err(HarnessError::new(
                "broca keeps no native marker that hides entries from the model",
            ));
        }
        // Entries broca took in before the session's first send: another harness's log,
        // imported (`session.import`), user and assistant in turn (a log's consecutive lines
        // of one role are one message). The scripted model is told how many assistant
        // messages they hold, so its turns still start at the script's first.
        let lines: Vec<Value> = (0..count)
            .map(|n| {
                let text = format!("{session}-host-entry-{n}");
                if n % 2 == 0 {
                    json!({"role": "user", "content": text})
                } else {
                    json!({"role": "assistant", "model": "m", "content": [{"type": "text", "text": text}]})
                }
            })
            .collect();
        self.model.seeded(session, count as usize / 2);
        self.import(handle, session, "host", lines).await
    }

    async fn seed_untimed_tool_call(
        &self,
        handle: &Module,
        session: &str,
        call: &cortexkit_role_llm_runner_conformance::ScriptedToolCall,
    ) -> Result<(), HarnessError> {
        // A finished call from another harness's log: it recorded no times broca could keep.
        let lines = vec![
            json!({"role": "assistant", "model": "m", "content": [{"type": "tool_use",
                "id": call.tool_call_id, "name": call.tool, "input": call.arguments}]}),
            json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": call.tool_call_id, "content": "seeded result"}]}),
        ];
        self.import(handle, session, "untimed", lines).await
    }

    fn shown_part_number(&self, session: &str, mid: &str, part: &str) -> Option<u64> {
        self.number_shown(session, mid, part)
    }

    async fn model_requests(
        &self,
        session: &str,
    ) -> Result<Vec<ModelRequestObservation>, HarnessError> {
        Ok(self
            .model
            .requests(session)
            .iter()
            .map(|body| {
                // Anthropic's tools name themselves; the chat wire's are functions.
                let tools = body["tools"]
                    .as_array()
                    .map(|t| {
                        t.iter()
                            .filter_map(|t| {
                                t["name"]
                                    .as_str()
                                    .or(t["function"]["name"].as_str())
                                    .map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let mut seen = ModelRequestObservation::new(tools);
                let max = body["max_tokens"]
                    .as_u64()
                    .or(body["max_completion_tokens"].as_u64());
                if let Some(max) = max {
                    seen = seen.with_max_output_tokens(max);
                }
                crate::structured::observe(
                    body,
                    seen.with_rendered(crate::model::rendered_texts(body)),
                )
            })
            .collect())
    }

    async fn hold_next_model_step(&self, session: &str) -> Result<(), HarnessError> {
        self.model.hold(session, 0);
        Ok(())
    }

    async fn hold_next_model_stream(
        &self,
        session: &str,
        parts: usize,
    ) -> Result<(), HarnessError> {
        self.model.hold(session, parts);
        Ok(())
    }

    async fn await_model_step(&self, session: &str) -> Result<(), HarnessError> {
        self.model
            .await_held(session)
            .await
            .map_err(HarnessError::new)
    }

    async fn release_model_step(&self, session: &str) -> Result<(), HarnessError> {
        self.model.release(session);
        Ok(())
    }

    async fn model_invocations(&self, session: &str) -> Result<usize, HarnessError> {
        Ok(self.model.requests(session).len())
    }

    fn oversized_tool_result(
        &self,
        message: &Value,
        tool_call_id: &str,
    ) -> Option<ToolResultLimitObservation> {
        // broca's tool entry: {role: "tool", tool_use_id, content, is_error?, reason?, bytes?,
        // limit?}, as its ToolResult record holds it.
        if message["role"] != "tool" || message["tool_use_id"] != tool_call_id {
            return None;
        }
        Some(ToolResultLimitObservation::new(
            message["reason"].as_str()?,
            message["bytes"].as_u64()?,
            message["limit"].as_u64()?,
            message["content"].as_str()?,
            message["is_error"] == true,
        ))
    }

    fn not_executed_tool_result(
        &self,
        message: &Value,
        tool_call_id: &str,
    ) -> Option<ToolResultObservation> {
        if message["role"] != "tool" || message["tool_use_id"] != tool_call_id {
            return None;
        }
        let reason = message["reason"].as_str()?;
        // Results broca wrote for a call it never sent; `outcome_unknown` may have run.
        let executed = !matches!(
            reason,
            "not_dispatched"
                | "budget_exhausted"
                | "context_ceiling"
                | "unknown_tool"
                | "invalid_arguments"
                | "refused_before_delivery"
                | "skipped_after_submit"
        );
        Some(ToolResultObservation::new(executed, reason))
    }

    async fn step_event_observation(
        &self,
        handle: &Module,
        session: &str,
    ) -> Result<
        cortexkit_role_llm_runner_conformance::step_events::StepEventObservation,
        HarnessError,
    > {
        let wal_dir = handle.root.join("state").join("wal");
        crate::bus::observation(&self.bus, &wal_dir, self.runner_id(), HARNESS, session)
            .await
            .map_err(HarnessError::new)
    }

    async fn dispatched_schema_pin(
        &self,
        arguments: &Value,
    ) -> Result<Option<String>, HarnessError> {
        self.tools.pin(arguments).map_err(HarnessError::new)
    }

    async fn tool_invocations(&self, arguments: &Value) -> usize {
        self.tools.invocations(arguments)
    }

    async fn await_tool_call(&self, arguments: &Value) -> Result<(), HarnessError> {
        self.tools
            .await_call(arguments)
            .await
            .map_err(HarnessError::new)
    }

    async fn release_tool_call(&self, arguments: &Value) -> Result<(), HarnessError> {
        self.tools.release(arguments);
        Ok(())
    }

    async fn advance_retention_clock(&self, _session: &str, ms: u64) -> Result<(), HarnessError> {
        self.live.advance(HARNESS, ms).await
    }

    async fn retention_deletion_finished(
        &self,
        handle: &Module,
        session: &str,
    ) -> Result<bool, HarnessError> {
        crate::retention::deletion_finished(&handle.root, HARNESS, session)
    }

    async fn archive_pruning_fixture(
        &self,
        session: &str,
        with_compaction_provider: bool,
    ) -> Result<Vec<ArchivePruningPart>, HarnessError> {
        crate::pruning::fixture(self, session, with_compaction_provider).await
    }

    async fn prune_archived_session(&self, session: &str) -> Result<(), HarnessError> {
        crate::pruning::prune(self, session).await
    }

    fn retention_probe_params(
        &self,
        _session: &str,
        method: &str,
    ) -> Result<Option<Vec<Value>>, HarnessError> {
        // broca advertises the role's ops alone: none is an export or listing of its own.
        Err(HarnessError::new(format!(
            "{method}: broca advertises no op of its own to probe"
        )))
    }

    async fn pause(&self) {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
