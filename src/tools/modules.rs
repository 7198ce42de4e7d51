//! Tools of the daemon's tool_provider modules (module mode), beside the MCP servers': their
//! catalogs are read at startup (`role.describe` checked, then `tool.catalog`; a module not
//! up then is asked again while broca serves, see broca-host), and
//! each call goes over a route of its session's own (`route.open` with the session's harness
//! and session as the bind identity; kept per module and whole session triple, so two
//! sessions that differ only in their project root never share one), on one consumer
//! connection shared by every shard
//! (broca_subc::link). A call is sent at most once:
//!
//! - not sent (no connection, the route refused, the frame never handed to the socket):
//!   refused before delivery, nothing ran;
//! - the daemon says the route was dead before delivery (`unknown_channel`,
//!   `stale_route_epoch`, `module_reloading`): the route is opened again and the call sent
//!   once more, with the same call key;
//! - answered by the module: its answer, or its refusal as the call's error result;
//! - anything else after the frame was written (the connection lost, the route closed, the
//!   daemon's own error, no answer within the module's call timeout, then a CANCEL):
//!   indeterminate, never sent again.
//!
//! The same connection and routes carry broca's own requests: the fusiform catalog module's
//! `catalog.get` (`catalog_text`).
//!
//! `route.open` refusals the daemon marks retryable are tried again with a doubling backoff
//! (100 ms to 2 s, six tries); any other refusal is final for that call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::ModuleConfig;
use broca_io::net::with_timeout;
use broca_protocol::{ToolCall, ToolSpec};
use broca_subc::frames::FrameIn;
use broca_subc::link::{Link, Written};
use broca_subc::toolprov::{self, Opened, Reply};
use broca_subc::LinkError;

use crate::{ToolOrigin, ToolOutcome};

mod catalog;
mod command;
mod compaction;
mod late;
mod plan;

pub use command::{CommandUpdate, Forwarded, COMMAND_REPLY_DEADLINE};
pub use compaction::Miss as CompactionMiss;

pub use plan::PlanAnswer;

/// `route.open` tries for a refusal the daemon marks retryable.
const OPEN_ATTEMPTS: u32 = 6;
/// How long the daemon gets to answer a `route.open` or a role op.
const CONTROL_DEADLINE: Duration = Duration::from_secs(10);
/// The call timeout of a module the config no longer lists (a run frozen earlier).
const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// Routes kept open at most; past it the least recently used is closed.
const ROUTES_MAX: usize = 4096;

/// A kept route's key: the module and the whole session triple (project root, harness,
/// session), and the provider role it speaks when not tool-provider's.
/// The wait before the first retry of a `route.open` the daemon refused for now, doubled
/// after each to at most [`OPEN_RETRY_MAX`].
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(100);
const OPEN_RETRY_MAX: Duration = Duration::from_secs(2);

type RouteKey = (
    String,
    String,
    String,
    String,
    Option<(&'static str, &'static str)>,
);

/// A call on its way: the module and its call, where it comes from, its body and its
/// deadlines.
struct Sending<'a> {
    module: &'a str,
    call: &'a ToolCall,
    origin: &'a ToolOrigin,
    body: Vec<u8>,
    timeout: Duration,
    silence: Option<Duration>,
}

/// What became of a call sent once: its outcome, or a route found dead before delivery (its
/// code).
enum Delivered {
    Outcome(ToolOutcome),
    RouteDead(String),
}

#[derive(Clone)]
struct Route {
    link: Arc<Link>,
    channel: u16,
    epoch: u32,
    /// When it was last used (a counter): past the cap the least recently used is closed.
    used: u64,
}

/// The tool modules of one broca process, shared by every shard.
pub struct ModuleTools {
    file: PathBuf,
    module_id: String,
    launch_nonce: Option<String>,
    modules: Vec<ModuleConfig>,
    result_bytes_max: usize,
    link: Mutex<Option<Arc<Link>>>,
    routes: Mutex<HashMap<RouteKey, Route>>,
    uses: std::sync::atomic::AtomicU64,
    /// The catalog module's last answer: its version and the catalog text made of it.
    last_catalog: Mutex<Option<(i64, String)>>,
    /// Per module, the tools whose answers are `tool-result/v1` bodies (their catalog entry
    /// opts in), as its catalog said last.
    result_v1: Mutex<HashMap<String, std::collections::HashSet<String>>>,
    /// The modules whose manifest provides `call-keepalive/v1` (the daemon's `catalog.list`,
    /// read with their catalog): their calls are kept while keepalives come.
    keepalive: Mutex<std::collections::HashSet<String>>,
    /// The sessions' scopes, when the daemon admits scoped routes and broca is a supervised
    /// launch (its launch nonce makes it the scopes' owner when it opens routes).
    scopes: Option<broca_subc::scope::Scopes>,
    /// The modules that declare `late_results` (their catalog's session capability): a held
    /// first reply of theirs is waited on (late.rs).
    late_results: Mutex<std::collections::HashSet<String>>,
    late: late::LateBook,
    /// Where late results no call waits for go (the host's sessions).
    late_sink: std::sync::OnceLock<Arc<dyn crate::late::LateSink>>,
}

/// How long a call of a module that sends keepalives may go without any (tool-provider/v1
/// §4.4: three missed 30 s intervals). Debug builds take `BROCA_TEST_KEEPALIVE_SILENCE_MS`
/// instead, for tests; release builds have no such knob.
fn keepalive_silence() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("BROCA_TEST_KEEPALIVE_SILENCE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Duration::from_millis(ms);
    }
    Duration::from_millis(toolprov::KEEPALIVE_SILENCE_MS)
}

/// What the tool modules' catalogs gave.
#[derive(Debug, Default)]
pub struct Catalogs {
    pub specs: Vec<ToolSpec>,
    /// One line per module that did not answer.
    pub problems: Vec<String>,
    /// The modules that did not answer, to ask again.
    pub missing: Vec<String>,
}

/// Whether a `route.open` refusal says the scope it named is not held by the daemon.
fn scope_gone(why: &str) -> bool {
    use broca_subc::protocol::error_codes::{SCOPE_ENDED, SCOPE_NOT_LIVE};
    why.starts_with(SCOPE_NOT_LIVE) || why.starts_with(SCOPE_ENDED)
}

/// Why a call did not go.
enum NotSent {
    /// Nothing reached the module.
    Refused(String),
    /// The module may have the request.
    Indeterminate(String),
}

impl ModuleTools {
    /// The tool modules `modules`, reached through the daemon of connection file `file` as
    /// module `module_id` (with its launch nonce, when the daemon handed one); with `scopes`,
    /// each session's routes are opened under its scope.
    pub fn new(
        file: PathBuf,
        module_id: String,
        launch_nonce: Option<String>,
        modules: Vec<ModuleConfig>,
        result_bytes_max: usize,
        scopes: Option<broca_subc::scope::Scopes>,
    ) -> Arc<ModuleTools> {
        Arc::new(ModuleTools {
            file,
            module_id,
            launch_nonce,
            modules,
            result_bytes_max,
            link: Mutex::new(None),
            routes: Mutex::new(HashMap::new()),
            uses: std::sync::atomic::AtomicU64::new(0),
            last_catalog: Mutex::new(None),
            result_v1: Mutex::new(HashMap::new()),
            keepalive: Mutex::new(Default::default()),
            scopes,
            late_results: Mutex::new(Default::default()),
            late: late::LateBook::default(),
            late_sink: std::sync::OnceLock::new(),
        })
    }

    /// Every module's tools, each with its pinned route; a module that cannot be reached or
    /// whose answers do not hold is reported and listed as missing (its tools are not offered
    /// until it answers). Runs on a glommio executor.
    pub async fn catalogs(&self) -> Catalogs {
        let mut all = Catalogs::default();
        for m in &self.modules {
            match self.catalog_of(&m.module).await {
                Ok(tools) => all.specs.extend(tools),
                Err(e) => {
                    all.problems
                        .push(format!("tool module `{}`: {e}", m.module));
                    all.missing.push(m.module.clone());
                }
            }
        }
        all
    }

    /// `module`'s tools, each with its pinned route, its catalog's notes logged.
    pub async fn catalog_of(&self, module: &str) -> Result<Vec<ToolSpec>, LinkError> {
        let (tools, notes) = self.catalog(module).await?;
        for n in notes {
            tracing::warn!(module = %module, "{n}");
        }
        tracing::info!(module = %module, tools = tools.len(), "tool module ready");
        Ok(tools)
    }

    async fn catalog(&self, module: &str) -> Result<(Vec<ToolSpec>, Vec<String>), LinkError> {
        let session = "tool-catalog";
        let describe = self
            .ask(module, session, toolprov::describe_request())
            .await?;
        toolprov::read_describe(&describe)?;
        let catalog = toolprov::read_catalog(
            module,
            &self
                .ask(module, session, toolprov::catalog_request())
                .await?,
        )?;
        if let Ok(mut v1) = self.result_v1.lock() {
            v1.insert(module.to_string(), catalog.result_v1);
        }
        if let Ok(mut late) = self.late_results.lock() {
            if catalog.late_results {
                late.insert(module.to_string());
            } else {
                late.remove(module);
            }
        }
        // Whether it sends keepalives: its manifest, as the daemon lists it (no answer: no).
        let keepalive = self.provides_keepalive(module).await;
        if let Ok(mut k) = self.keepalive.lock() {
            if keepalive {
                k.insert(module.to_string());
            } else {
                k.remove(module);
            }
        }
        Ok((catalog.specs, catalog.notes))
    }

    /// Whether the daemon lists `module` as providing `call-keepalive/v1`.
    async fn provides_keepalive(&self, module: &str) -> bool {
        self.provides(
            module,
            cortexkit_role_tool_provider::CALL_KEEPALIVE_CAPABILITY,
        )
        .await
    }

    /// Whether calls of `module` are kept alive by its keepalives.
    fn sends_keepalives(&self, module: &str) -> bool {
        self.keepalive.lock().is_ok_and(|k| k.contains(module))
    }

    /// Whether `tool` of `module` answers in `tool-result/v1` bodies.
    fn answers_v1(&self, module: &str, tool: &str) -> bool {
        self.result_v1
            .lock()
            .is_ok_and(|v1| v1.get(module).is_some_and(|tools| tools.contains(tool)))
    }

    /// The shared connection, connected (on the blocking pool) when there is none alive.
    async fn link(&self) -> Result<Arc<Link>, LinkError> {
        if let Some(l) = self.link.lock().ok().and_then(|l| l.clone()) {
            if l.is_alive() {
                return Ok(l);
            }
        }
        let file = self.file.clone();
        let link = broca_io::blocking::run(broca_io::blocking::Kind::ToolRoute, move || {
            Link::connect(&file)
        })
        .await
        .map_err(|e| LinkError::Down(format!("cannot reach the daemon: {e}")))?;
        if let Ok(mut slot) = self.link.lock() {
            match slot.as_ref() {
                // Another shard connected meanwhile: use its connection.
                Some(other) if other.is_alive() => return Ok(other.clone()),
                _ => *slot = Some(link.clone()),
            }
        }
        Ok(link)
    }

    /// The route to `module` for the session (project root, harness, session): the one open,
    /// or a new one, under the session's scope (of epoch `epoch`, the session's creation)
    /// when broca owns scopes. (broca's own requests use an empty project root and no scope.)
    async fn route(
        &self,
        module: &str,
        project_root: &str,
        harness: &str,
        session: &str,
        epoch: Option<u64>,
    ) -> Result<Route, NotSent> {
        self.route_as(None, module, project_root, harness, session, epoch)
            .await
    }

    /// [`ModuleTools::route`] speaking provider role `role` (`role_versions`).
    async fn route_as(
        &self,
        role: Option<(&'static str, &'static str)>,
        module: &str,
        project_root: &str,
        harness: &str,
        session: &str,
        epoch: Option<u64>,
    ) -> Result<Route, NotSent> {
        let key: RouteKey = (
            module.into(),
            project_root.into(),
            harness.into(),
            session.into(),
            role,
        );
        if let Some(r) = self.kept_route(&key) {
            return Ok(r);
        }
        let consumer = self
            .launch_nonce
            .as_deref()
            .map(|n| (self.module_id.as_str(), n));
        // The session's scope, where the daemon has one for it.
        let record = epoch
            .filter(|_| self.scopes.is_some() && !project_root.is_empty())
            .map(|epoch| broca_subc::scope::record(project_root, harness, session, epoch));
        let mut body = self
            .open_body(module, (harness, session), consumer, &record, (false, role))
            .await?;
        let mut delay = OPEN_RETRY_FIRST;
        let mut last = String::new();
        let mut scope_renewed = false;
        for attempt in 1..=OPEN_ATTEMPTS {
            let (link, frame) = self.open_once(module, &body).await?;
            match toolprov::read_open(&frame) {
                Opened::Route { channel, epoch } => {
                    let used = self.next_use();
                    return Ok(self.keep(
                        key,
                        Route {
                            link,
                            channel,
                            epoch,
                            used,
                        },
                    ));
                }
                Opened::Retry(code) => {
                    tracing::info!(module, code, attempt, "route.open refused for now");
                    last = code;
                    if attempt < OPEN_ATTEMPTS {
                        glommio::timer::sleep(delay).await;
                        delay = (delay * 2).min(OPEN_RETRY_MAX);
                    }
                }
                // The daemon no longer holds the session's scope (ended past broca's cap, or
                // expired): it is registered again, once, and the open tried again.
                Opened::Refused(why) if record.is_some() && !scope_renewed && scope_gone(&why) => {
                    scope_renewed = true;
                    body = self
                        .open_body(module, (harness, session), consumer, &record, (true, role))
                        .await?;
                }
                Opened::Refused(why) => {
                    return Err(NotSent::Refused(format!(
                        "the daemon refused a route to tool module `{module}`: {why}"
                    )))
                }
            }
        }
        Err(NotSent::Refused(format!(
            "the daemon kept refusing a route to tool module `{module}` ({last}, {OPEN_ATTEMPTS} tries)"
        )))
    }

    /// The route kept for `key`, while its link lives and the daemon has not closed it (one
    /// that has is let go of).
    fn kept_route(&self, key: &RouteKey) -> Option<Route> {
        let used = self.next_use();
        let kept = self.routes.lock().ok().and_then(|mut r| {
            let route = r.get_mut(key)?;
            route.used = used;
            Some(route.clone())
        })?;
        if kept.link.is_alive() && !kept.link.take_closed(kept.channel) {
            return Some(kept);
        }
        self.evict(key);
        None
    }

    /// The `route.open` body of a session's route, under its scope when `record` is one (made
    /// live first; `fresh`: registered again even if broca thinks it live).
    async fn open_body(
        &self,
        module: &str,
        (harness, session): (&str, &str),
        consumer: Option<(&str, &str)>,
        record: &Option<broca_subc::scope::ScopeRecord>,
        (fresh, role): (bool, Option<(&str, &str)>),
    ) -> Result<Vec<u8>, NotSent> {
        let selector = match (&self.scopes, record) {
            (Some(scopes), Some(record)) => {
                Some(scopes.ensure(record.clone(), fresh).await.map_err(|why| {
                    NotSent::Refused(format!(
                        "no route to tool module `{module}` under the session's scope: {why}"
                    ))
                })?)
            }
            _ => None,
        };
        Ok(toolprov::route_open_as(
            module, harness, session, consumer, selector, role,
        ))
    }

    /// One `route.open` to `module` over the shared connection, and the daemon's answer; a
    /// `route.open` the daemon did not answer in time is given up (nothing was sent on the
    /// route it may have opened after all, which is left to its own cleanup).
    async fn open_once(&self, module: &str, body: &[u8]) -> Result<(Arc<Link>, FrameIn), NotSent> {
        let refused = |e: LinkError| NotSent::Refused(e.to_string());
        let link = self.link().await.map_err(refused)?;
        let sent = link.request(0, 0, body.to_vec()).map_err(refused)?;
        match with_timeout(CONTROL_DEADLINE, sent.reply).await {
            Ok(Ok(Ok(frame))) => Ok((link, frame)),
            Ok(Ok(Err(why))) => Err(NotSent::Refused(why.to_string())),
            Ok(Err(_)) => Err(NotSent::Refused("the daemon connection ended".into())),
            Err(()) => {
                link.cancel(0, 0, sent.corr);
                Err(NotSent::Refused(format!(
                    "the daemon did not answer route.open to `{module}` within {CONTROL_DEADLINE:?}"
                )))
            }
        }
    }

    /// Keeps `route` for `key` and answers the route to use: when a call of the same session
    /// opened one meanwhile (two calls of a step, say), that one, and `route` is closed.
    fn keep(&self, key: RouteKey, route: Route) -> Route {
        let Ok(mut routes) = self.routes.lock() else {
            return route;
        };
        if let Some(kept) = routes.get(&key) {
            if kept.link.is_alive() {
                let kept = kept.clone();
                route.link.close_route(route.channel, route.epoch);
                return kept;
            }
        }
        if routes.len() >= ROUTES_MAX {
            if let Some(oldest) = routes
                .iter()
                .min_by_key(|(_, r)| r.used)
                .map(|(k, _)| k.clone())
            {
                if let Some(r) = routes.remove(&oldest) {
                    r.link.close_route(r.channel, r.epoch);
                }
            }
        }
        debug_assert!(
            routes.len() < ROUTES_MAX,
            "a route is kept within the bound"
        );
        routes.insert(key, route.clone());
        route
    }

    /// Forgets a route that is dead (its link gone, the daemon closed it, or it answered that
    /// it is dead): nothing is sent on it any more.
    fn evict(&self, key: &RouteKey) {
        if let Ok(mut routes) = self.routes.lock() {
            routes.remove(key);
        }
    }

    fn next_use(&self) -> u64 {
        self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn call_timeout(&self, module: &str) -> Duration {
        self.modules
            .iter()
            .find(|m| m.module == module)
            .map_or(CALL_TIMEOUT_DEFAULT, |m| m.call_timeout)
    }

    /// Sends `call` once (twice only when the daemon says the first never reached the module).
    /// A call of a module that serves late results waits for one from before it is sent,
    /// so its answer is never taken for another's.
    pub async fn call(&self, call: &ToolCall, route: &str, origin: &ToolOrigin) -> ToolOutcome {
        let late = toolprov::parse_route(route)
            .map(|(module, _)| module)
            .filter(|m| self.late_results.lock().is_ok_and(|l| l.contains(*m)));
        if let Some(module) = late {
            self.late.wait_for(module, &origin.call_key);
        }
        let outcome = self.call_once(call, route, origin).await;
        if let Some(module) = late {
            self.late.give_up(module, &origin.call_key);
        }
        outcome
    }

    async fn call_once(&self, call: &ToolCall, route: &str, origin: &ToolOrigin) -> ToolOutcome {
        let Some((module, pin)) = toolprov::parse_route(route) else {
            return ToolOutcome::Refused {
                reason: format!(
                    "`{route}` is not a tool module's route (tool `{}`)",
                    call.name
                ),
            };
        };
        let arguments = match serde_json::from_str(call.input.get()) {
            Ok(a) => a,
            Err(e) => {
                return ToolOutcome::Refused {
                    reason: format!("the arguments of `{}` are not JSON: {e}", call.name),
                }
            }
        };
        let (timeout, silence) = self.deadlines(module, origin, &arguments);
        let body = toolprov::call_body(
            &call.name,
            arguments,
            &call.id,
            origin.call_key.clone(),
            pin,
        );
        let mut not_delivered = String::new();
        for _ in 0..2 {
            let sent = Sending {
                module,
                call,
                origin,
                body: body.clone(),
                timeout,
                silence,
            };
            match self.deliver(sent).await {
                Delivered::Outcome(outcome) => return outcome,
                Delivered::RouteDead(code) => not_delivered = code,
            }
        }
        ToolOutcome::Refused {
            reason: format!(
                "tool module `{module}`'s route stayed dead ({not_delivered}); the call was never delivered"
            ),
        }
    }

    /// Sends a call on its session's route: its outcome, or the code of a route found dead
    /// before delivery (let go of, to be opened again).
    async fn deliver(&self, s: Sending<'_>) -> Delivered {
        let (module, call, t) = (s.module, s.call, &s.origin.triple);
        let rkey: RouteKey = (
            module.into(),
            t.project_root.clone(),
            t.harness.clone(),
            t.session.clone(),
            None,
        );
        let epoch = Some(s.origin.scope_epoch);
        let routed = self
            .route(module, &t.project_root, &t.harness, &t.session, epoch)
            .await;
        let r = match routed {
            Ok(r) => r,
            Err(NotSent::Refused(reason)) => {
                return Delivered::Outcome(ToolOutcome::Refused { reason })
            }
            Err(NotSent::Indeterminate(why)) => {
                return Delivered::Outcome(indeterminate(call, &why))
            }
        };
        let frame = match self.send(&r, s.body, s.timeout, s.silence).await {
            Ok(f) => f,
            Err(NotSent::Refused(reason)) => {
                self.evict(&rkey);
                return Delivered::Outcome(ToolOutcome::Refused { reason });
            }
            Err(NotSent::Indeterminate(why)) => {
                self.evict(&rkey);
                return Delivered::Outcome(indeterminate(call, &why));
            }
        };
        match toolprov::read_reply(module, &frame, self.answers_v1(module, &call.name)) {
            Reply::Held { parts, reason } => Delivered::Outcome(
                self.held(module, call, &s.origin.call_key, &reason, &parts)
                    .await,
            ),
            Reply::NotDelivered(code) => {
                tracing::info!(module, code, tool = %call.name, "the route was dead before delivery; opening it again");
                self.evict(&rkey);
                Delivered::RouteDead(code)
            }
            reply => Delivered::Outcome(self.outcome(call, reply)),
        }
    }

    /// A call's reply deadline: the tool's own, as the run froze it, never below the
    /// module's; a module that sends keepalives may take up to the role's ceiling for a tool
    /// without one, while its keepalives come (the silence it may keep between them).
    fn deadlines(
        &self,
        module: &str,
        origin: &ToolOrigin,
        arguments: &serde_json::Value,
    ) -> (Duration, Option<Duration>) {
        let keepalive = self.sends_keepalives(module);
        let timeout = toolprov::reply_deadline_with_keepalive(
            origin.reply.as_ref(),
            arguments,
            self.call_timeout(module),
            keepalive,
        );
        debug_assert!(
            keepalive || timeout >= self.call_timeout(module),
            "a call's deadline is never below its module's unless keepalives bound it"
        );
        (timeout, keepalive.then(keepalive_silence))
    }

    /// A call's answer as its outcome.
    fn outcome(&self, call: &ToolCall, reply: Reply) -> ToolOutcome {
        match reply {
            Reply::Answer { text, is_error } => ToolOutcome::Done {
                content: crate::result::truncate(text, self.result_bytes_max),
                is_error,
            },
            Reply::Parts { parts, is_error } => {
                let parts = parts
                    .into_iter()
                    .map(|p| match p {
                        toolprov::Part::Text(t) => crate::ToolPart::Text(t),
                        toolprov::Part::Image { mime, data } => {
                            crate::ToolPart::Image { mime, data }
                        }
                    })
                    .collect();
                ToolOutcome::Parts { parts, is_error }
            }
            Reply::TooLarge { bytes } => ToolOutcome::TooLarge { bytes },
            Reply::Indeterminate(why) => indeterminate(call, &why),
            Reply::Held { .. } | Reply::NotDelivered(_) => {
                indeterminate(call, "a late result that is not an answer")
            }
        }
    }

    /// A held first reply: its interim content is logged, and the call waits for its late
    /// result (a module that does not serve `late_results` cannot settle it: outcome unknown).
    async fn held(
        &self,
        module: &str,
        call: &ToolCall,
        call_key: &str,
        reason: &str,
        interim: &[toolprov::Part],
    ) -> ToolOutcome {
        if !self.late_results.lock().is_ok_and(|l| l.contains(module)) {
            return indeterminate(
                call,
                &format!("tool module `{module}` held the call but serves no late_results"),
            );
        }
        tracing::info!(
            module,
            tool = %call.name,
            call_id = %call.id,
            reason,
            person_wait = toolprov::late::is_person_wait(reason),
            interim = %toolprov::late::text_of(interim),
            "tool call held; its answer comes as a late result"
        );
        match self.wait_late(module, call_key).await {
            Some(toolprov::late::Settled::Answer(reply)) => self.outcome(call, reply),
            Some(toolprov::late::Settled::NotStarted(why)) => ToolOutcome::Refused {
                reason: format!("tool module `{module}` says the call never ran: {why}"),
            },
            Some(toolprov::late::Settled::Expired) => indeterminate(
                call,
                &format!("tool module `{module}` let the held call's result expire"),
            ),
            Some(toolprov::late::Settled::Note(_)) | None => {
                indeterminate(call, &format!("no late result within {:?}", late::HELD_MAX))
            }
        }
    }

    /// Writes the request and waits for its terminal frame: until `timeout`, and, for a
    /// module that sends keepalives, while no `silence` passes without a PUSH for the call.
    async fn send(
        &self,
        r: &Route,
        body: Vec<u8>,
        timeout: Duration,
        silence: Option<Duration>,
    ) -> Result<FrameIn, NotSent> {
        let sent = r
            .link
            .request(r.channel, r.epoch, body)
            .map_err(|e| NotSent::Refused(e.to_string()))?;
        match sent.written.await {
            Ok(Written::Whole) => {}
            Ok(Written::Nothing) | Err(_) => {
                return Err(NotSent::Refused(
                    "the connection to the daemon failed before the call was written".into(),
                ))
            }
            Ok(Written::Partly) => {
                return Err(NotSent::Indeterminate(
                    "the connection to the daemon failed while the call was written".into(),
                ))
            }
        }
        let started = std::time::Instant::now();
        let mut reply = sent.reply;
        let mut pushes_seen = 0;
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let wait = silence.map_or(left, |s| s.min(left));
            match with_timeout(wait, &mut reply).await {
                Ok(Ok(Ok(frame))) => return Ok(frame),
                Ok(Ok(Err(why))) => {
                    return Err(NotSent::Indeterminate(format!(
                        "{why} after the call was sent"
                    )))
                }
                Ok(Err(_)) => {
                    return Err(NotSent::Indeterminate(
                        "the daemon connection ended after the call was sent".into(),
                    ))
                }
                Err(()) => {}
            }
            let pushes = sent.pushes.load(std::sync::atomic::Ordering::Relaxed);
            let why = if started.elapsed() >= timeout {
                format!("no answer within {timeout:?} (cancelled)")
            } else if pushes == pushes_seen {
                let s = silence.unwrap_or_default();
                format!("no answer and no keepalive for {s:?} (cancelled)")
            } else {
                // A keepalive came within the window: the call is alive.
                pushes_seen = pushes;
                continue;
            };
            r.link.cancel(r.channel, r.epoch, sent.corr);
            return Err(NotSent::Indeterminate(why));
        }
    }

    /// Closes every route and the connection.
    pub fn stop(&self) {
        if let Ok(mut routes) = self.routes.lock() {
            for (_, r) in routes.drain() {
                if r.link.is_alive() {
                    r.link.close_route(r.channel, r.epoch);
                }
            }
        }
        if let Some(l) = self.link.lock().ok().and_then(|mut l| l.take()) {
            l.shutdown();
        }
    }
}

fn indeterminate(call: &ToolCall, why: &str) -> ToolOutcome {
    tracing::warn!(tool = %call.name, call_id = %call.id, "tool call indeterminate: {why}");
    ToolOutcome::Indeterminate
}
