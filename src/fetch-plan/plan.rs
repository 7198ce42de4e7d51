//! llm-runner/v1 `plans` (§10.1), sans-IO: a send's fetch plan read and checked before
//! anything is fetched or written ([`Plan::read`]), the `tool.catalog` request each of its
//! providers is asked ([`Plan::fetches`]), the answers checked into the plan the session
//! freezes ([`Plan::admit`]), and a run's config made from a frozen plan ([`apply`]).
//!
//! The plan's members broca reads: `tool_items` and `system_text_items` (`{provider, preset?,
//! params, optional?}`), `composition` (an opaque object passed to every provider as sent,
//! checked against each answer's `composition_digest`; its `providers[].tools`, when given,
//! against the names each provider offered) and `compaction_item` (`preset` required).
//! `step_transform_items` are read by [`crate::pre_user`] (the `pre_user` hook alone). Members
//! broca does not serve (a reader list, a tool item's `upfront` or `output_refs`) are refused
//! by name rather than ignored.

use std::collections::BTreeMap;

use broca_protocol::ToolSpec;
use broca_wal::planrec::{FrozenCommand, FrozenPlan, PlanItem, ProviderCapabilities};
use broca_wire::Refusal;
use cortexkit_role_tool_provider::catalog::{
    composition_digest, system_text_digest, CatalogAnswer, CatalogRequest, SystemTextItem,
};
use serde_json::{json, Map, Value};

/// Members a plan may carry that broca reads or passes on unread.
const READ: &[&str] = &[
    "tool_items",
    "system_text_items",
    "composition",
    "compaction_item",
    "composition_digest",
    "senders",
    crate::pre_user::MEMBER,
];

/// Members of the role broca does not serve: a plan naming one is refused naming it.
const NOT_SERVED: &[(&str, &str)] = &[("readers", "this runner restricts no readers")];

/// A send's fetch plan, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The plan as sent.
    pub value: Map<String, Value>,
    /// Its identity: SHA-256 of its JCS text.
    pub identity: String,
    composition: Option<Map<String, Value>>,
    composition_digest: Option<String>,
    fetches: Vec<Fetch>,
    /// Whether a person may drive the session (`interactive`, true when absent): when not,
    /// no command is frozen and every invocation is refused `no_person`.
    interactive: bool,
    /// Its step-transform items (`pre_user` subscriptions), in plan order.
    pub steps: crate::pre_user::Hooks,
}

/// One provider's part of a plan: its tool item, its system-text item, or both.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetch {
    pub provider: String,
    tools: Option<Item>,
    text: Option<Item>,
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    preset: Option<String>,
    params: Map<String, Value>,
    optional: bool,
}

pub use crate::Missed;

/// One provider's answer: the catalog as it came, and its tools as broca routes them (each
/// pinned to the provider: broca-subc's reading of the same answer).
#[derive(Debug, Clone, PartialEq)]
pub struct Arrived {
    pub answer: CatalogAnswer,
    pub specs: Vec<ToolSpec>,
}

fn field(field: &'static str, why: impl Into<String>) -> Refusal {
    Refusal::InvalidField {
        field,
        why: why.into(),
    }
}

impl Plan {
    /// Reads `plan` as a send carried it: refused `invalid_params` naming the member that
    /// is malformed or not served, before anything is fetched or written.
    pub fn read(plan: &Value) -> Result<Plan, Refusal> {
        let Some(value) = plan.as_object() else {
            return Err(field("plan", "`plan` must be an object"));
        };
        check_members(value)?;
        let fetches = read_fetches(value)?;
        let composition = read_composition(value)?;
        let steps = crate::pre_user::read(value)?;
        let interactive = cortexkit_role_llm_runner::user_commands::check_interactive(value)
            .map_err(|f| field(f, "`plan.interactive` must be a boolean"))?;
        let digest = |v: &Value| {
            composition_digest(v)
                .map_err(|e| field("plan", format!("`plan` has no JCS form: {e:?}")))
        };
        // A plan without a composition has the empty one's digest: every planned session's
        // baseline names one.
        let composition_digest = Some(digest(&Value::Object(
            composition.clone().unwrap_or_default(),
        ))?);
        Ok(Plan {
            identity: digest(plan)?,
            value: value.clone(),
            composition,
            composition_digest,
            fetches,
            interactive,
            steps,
        })
    }

    /// The providers of the plan's system-text items that name no preset: each must serve a
    /// default text (`system-text-default/v1` in the daemon's catalog), or the plan is
    /// refused `system_text_preset_required` before anything is fetched.
    pub fn preset_less_texts(&self) -> Vec<&str> {
        self.fetches
            .iter()
            .filter(|f| f.text.as_ref().is_some_and(|t| t.preset.is_none()))
            .map(|f| f.provider.as_str())
            .collect()
    }

    /// The plan's composition, as sent.
    pub fn composition(&self) -> Option<&Map<String, Value>> {
        self.composition.as_ref()
    }

    /// Whether admission has anything to fetch.
    pub fn fetches(&self) -> &[Fetch] {
        &self.fetches
    }

    /// The `tool.catalog` request of `fetch`: its tool item's params and preset, the plan's
    /// composition, and its text item when it has one.
    pub fn request(&self, fetch: &Fetch) -> CatalogRequest {
        let mut request = CatalogRequest::new(
            fetch
                .tools
                .as_ref()
                .map(|t| t.params.clone())
                .unwrap_or_default(),
        );
        if let Some(preset) = fetch.tools.as_ref().and_then(|t| t.preset.clone()) {
            request = request.with_preset(preset);
        }
        if let Some(c) = &self.composition {
            request = request.with_composition(c.clone());
        }
        if let Some(text) = &fetch.text {
            let mut item = SystemTextItem::new(text.params.clone());
            if let Some(preset) = &text.preset {
                item = item.with_preset(preset.clone());
            }
            request = request.with_system_text(item);
        }
        request
    }

    /// The plan the session freezes from its providers' answers (one per [`Self::fetches`],
    /// in order), or the admission refusal: a required item that did not arrive
    /// (`fetch_unavailable`), answers that disagree with the plan (`plan_stale`), or two
    /// providers offering one tool name (`tool_name_collision`).
    pub fn admit(&self, answers: Vec<Result<Arrived, Missed>>) -> Result<FrozenPlan, Refusal> {
        let mut a = Admitting::new(self);
        assert!(
            answers.len() <= self.fetches.len(),
            "one answer per fetch at most"
        );
        for (fetch, answer) in self.fetches.iter().zip(answers) {
            match answer {
                Ok(arrived) => a.arrived(self, fetch, &arrived),
                Err(missed) => a.missed(fetch, &missed)?,
            }
        }
        a.finish(self.interactive)
    }

    /// Where `provider`'s answer (offering `offered`) disagrees with the plan: its
    /// composition's digest, or the tools the composition lists for it.
    fn differences(&self, provider: &str, answer: &CatalogAnswer, offered: &[&str]) -> Vec<Value> {
        let mut out = Vec::new();
        if let (Some(ours), Some(theirs), true) = (
            &self.composition_digest,
            &answer.composition_digest,
            self.composition.is_some(),
        ) {
            if ours != theirs {
                out.push(json!({"kind": "composition", "provider": provider,
                    "expected": ours, "answered": theirs}));
            }
        }
        if let Some(listed) = self.composed_tools(provider) {
            let missing: Vec<&str> = listed
                .iter()
                .copied()
                .filter(|n| !offered.contains(n))
                .collect();
            let unexpected: Vec<&str> = offered
                .iter()
                .copied()
                .filter(|n| !listed.contains(n))
                .collect();
            if !missing.is_empty() || !unexpected.is_empty() {
                out.push(json!({"kind": "tools", "provider": provider,
                    "missing": missing, "unexpected": unexpected}));
            }
        }
        out
    }

    /// The tool names the composition lists for `provider`, when it lists them.
    fn composed_tools(&self, provider: &str) -> Option<Vec<&str>> {
        let providers = self.composition.as_ref()?.get("providers")?.as_array()?;
        let entry = providers
            .iter()
            .find(|p| p.get("provider").and_then(Value::as_str) == Some(provider))?;
        Some(
            entry
                .get("tools")?
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect(),
        )
    }
}

/// A text answer checked: its digest is its text's, and its tool names are the tools its
/// provider offered (tool-provider/v1 §3's `text_tool_names`).
fn check_text(
    provider: &str,
    text: &cortexkit_role_tool_provider::catalog::SystemTextAnswer,
    offered: &[&str],
    differences: &mut Vec<Value>,
) {
    if let Some(t) = &text.text {
        if system_text_digest(t) != text.item_digest {
            differences.push(json!({"kind": "system_text_digest", "provider": provider}));
        }
        let mut names: Vec<&str> = offered.to_vec();
        names.sort_unstable();
        names.dedup();
        let composed_for: Vec<&str> = text
            .tool_names
            .iter()
            .flatten()
            .map(String::as_str)
            .collect();
        let missing: Vec<&str> = composed_for
            .iter()
            .copied()
            .filter(|n| !names.contains(n))
            .collect();
        let unexpected: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !composed_for.contains(n))
            .collect();
        if !missing.is_empty() || !unexpected.is_empty() {
            differences.push(json!({"kind": "text_tool_names", "provider": provider,
                "missing": missing, "unexpected": unexpected}));
        }
    }
}

/// Refuses two providers offering one model-facing name, naming every provider of it.
fn collisions(tools: &[ToolSpec]) -> Result<(), Refusal> {
    let mut by_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for t in tools {
        by_name
            .entry(t.name.as_str())
            .or_default()
            .push(provider_of(&t.route).to_string());
    }
    match by_name.into_iter().find(|(_, p)| p.len() > 1) {
        Some((name, providers)) => Err(Refusal::PlanToolCollision {
            name: name.to_string(),
            providers,
        }),
        None => Ok(()),
    }
}

/// Refuses two providers declaring one person-only command name, naming every provider.
fn command_collisions(commands: &[FrozenCommand]) -> Result<(), Refusal> {
    let mut by_name: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in commands {
        by_name
            .entry(c.name.as_str())
            .or_default()
            .push(c.provider.clone());
    }
    match by_name.into_iter().find(|(_, p)| p.len() > 1) {
        Some((name, providers)) => Err(Refusal::UserCommandCollision {
            name: name.to_string(),
            providers,
        }),
        None => Ok(()),
    }
}

/// The module a daemon tool's route names (`subc:<module>@<pin>`).
fn provider_of(route: &str) -> &str {
    let rest = route
        .strip_prefix(broca_protocol::route::SUBC_PREFIX)
        .unwrap_or(route);
    rest.split_once('@').map_or(rest, |(m, _)| m)
}

/// The plan's members: none this runner does not serve, none it does not read, and its
/// `senders` and `compaction_item` well formed.
fn check_members(value: &Map<String, Value>) -> Result<(), Refusal> {
    for (member, why) in NOT_SERVED {
        if value.contains_key(*member) {
            return Err(field("plan", format!("`plan.{member}`: {why}")));
        }
    }
    if let Some(unknown) = value
        .keys()
        .find(|k| !READ.contains(&k.as_str()) && k.as_str() != "interactive")
    {
        return Err(field(
            "plan",
            format!(
                "`plan.{}` is not a member this runner reads",
                unknown.escape_debug()
            ),
        ));
    }
    cortexkit_role_llm_runner::delivery_order::plan_senders(value).map_err(|f| {
        field(
            f,
            "`plan.senders` must list each sending module once, each template's id once per \
             sender, every placeholder with its slot and every slot used",
        )
    })?;
    cortexkit_role_llm_runner::compaction::check_plan(value).map_err(|f| {
        field(
            f,
            "`plan.compaction_item` must name its role `preset` (a string)",
        )
    })?;
    Ok(())
}

/// The plan's `tool_items` and `system_text_items`, by provider: one fetch each, a provider
/// named at most once per list.
fn read_fetches(value: &Map<String, Value>) -> Result<Vec<Fetch>, Refusal> {
    let mut fetches: Vec<Fetch> = Vec::new();
    for (list, is_tools) in [("tool_items", true), ("system_text_items", false)] {
        let Some(items) = value.get(list) else {
            continue;
        };
        let Some(items) = items.as_array() else {
            return Err(field("plan", format!("`plan.{list}` must be an array")));
        };
        for (i, raw) in items.iter().enumerate() {
            let (provider, item) = read_item(list, i, raw, is_tools)?;
            let at = match fetches.iter().position(|f| f.provider == provider) {
                Some(at) => at,
                None => {
                    fetches.push(Fetch {
                        provider: provider.clone(),
                        tools: None,
                        text: None,
                    });
                    fetches.len() - 1
                }
            };
            let slot = if is_tools {
                &mut fetches[at].tools
            } else {
                &mut fetches[at].text
            };
            if slot.is_some() {
                let who = provider.escape_debug();
                let why = format!("`plan.{list}` names provider `{who}` twice");
                return Err(field("plan", why));
            }
            *slot = Some(item);
        }
    }
    assert!(
        fetches
            .iter()
            .all(|f| f.tools.is_some() || f.text.is_some()),
        "a fetch has an item"
    );
    Ok(fetches)
}

/// The plan's `composition`, an object joined by this runner's join version.
fn read_composition(value: &Map<String, Value>) -> Result<Option<Map<String, Value>>, Refusal> {
    let composition = match value.get("composition") {
        None => None,
        Some(Value::Object(c)) => Some(c.clone()),
        Some(_) => return Err(field("plan", "`plan.composition` must be an object")),
    };
    if let Some(v) = composition.as_ref().and_then(|c| c.get("join_version")) {
        if v.as_u64() != Some(u64::from(broca_wal::planrec::JOIN_VERSION)) {
            return Err(field(
                "plan",
                format!(
                    "`plan.composition.join_version` {v}: this runner joins system text by \
                     version {}",
                    broca_wal::planrec::JOIN_VERSION
                ),
            ));
        }
    }
    Ok(composition)
}

/// A plan's answers as admission takes them in, one provider after the other: the plan it
/// freezes, the tools, commands and texts they gave, and where they disagree with the plan.
struct Admitting {
    frozen: FrozenPlan,
    tools: Vec<ToolSpec>,
    commands: Vec<FrozenCommand>,
    differences: Vec<Value>,
    texts: Vec<String>,
}

impl Admitting {
    fn new(plan: &Plan) -> Admitting {
        Admitting {
            frozen: FrozenPlan {
                plan: Value::Object(plan.value.clone()).to_string(),
                identity: plan.identity.clone(),
                composition_digest: plan.composition_digest.clone(),
                items: Vec::new(),
                absent_items: Vec::new(),
                system_text: None,
                join_version: broca_wal::planrec::JOIN_VERSION,
                tools: Vec::new().into(),
                tools_digest: String::new(),
                capabilities: Vec::new(),
                user_commands: Vec::new(),
                interactive: plan.interactive,
                generation: 0,
            },
            tools: Vec::new(),
            commands: Vec::new(),
            differences: Vec::new(),
            texts: Vec::new(),
        }
    }

    /// A provider whose answer did not arrive: refused when an item of it is required, else
    /// its items named absent.
    fn missed(&mut self, fetch: &Fetch, missed: &Missed) -> Result<(), Refusal> {
        let provider = &fetch.provider;
        let required = [&fetch.tools, &fetch.text]
            .into_iter()
            .flatten()
            .any(|i| !i.optional);
        if required {
            return Err(Refusal::FetchUnavailable {
                provider: provider.clone(),
                why: missed.why(),
            });
        }
        for (item, kind) in [(&fetch.tools, "tools"), (&fetch.text, "system_text")] {
            if item.is_some() {
                self.frozen.absent_items.push(missed.absent(provider, kind));
            }
        }
        Ok(())
    }

    /// A provider's answer: its items frozen, its tools, commands, capabilities and text
    /// taken, and where it disagrees with the plan noted.
    fn arrived(&mut self, plan: &Plan, fetch: &Fetch, arrived: &Arrived) {
        let provider = &fetch.provider;
        let answer = &arrived.answer;
        let both = fetch.tools.is_some() && fetch.text.is_some();
        let name = |kind: &str| both.then(|| kind.to_string());
        let offered: Vec<&str> = arrived.specs.iter().map(|s| s.name.as_str()).collect();
        self.differences
            .extend(plan.differences(provider, answer, &offered));
        if fetch.tools.is_some() {
            self.frozen.items.push(PlanItem {
                provider: provider.clone(),
                item: name("tools"),
                item_digest: answer.catalog_digest.clone(),
                preflight_digest: None,
            });
            self.tools.extend(arrived.specs.iter().cloned());
        }
        if fetch.text.is_some() {
            match &answer.system_text {
                Some(text) => {
                    check_text(provider, text, &offered, &mut self.differences);
                    self.frozen.items.push(PlanItem {
                        provider: provider.clone(),
                        item: name("system_text"),
                        item_digest: text.item_digest.clone(),
                        preflight_digest: Some(text.preflight_digest.clone()),
                    });
                    if let Some(t) = text.text.as_ref().filter(|t| !t.is_empty()) {
                        self.texts.push(t.clone());
                    }
                }
                None => self.differences.push(json!({"kind": "system_text",
                    "provider": provider, "why": "the answer carries no system_text"})),
            }
        }
        self.take_declared(provider, answer);
    }

    /// A provider's person-only commands and the capabilities it declares.
    fn take_declared(&mut self, provider: &str, answer: &CatalogAnswer) {
        self.commands
            .extend(answer.user_commands.iter().map(|c| FrozenCommand {
                provider: provider.to_string(),
                name: c.name.clone(),
                description: c.description.clone(),
                argument_hint: c.argument_hint.clone(),
            }));
        let declared: Vec<String> = answer
            .capabilities
            .iter()
            .filter(|(_, v)| **v == Value::Bool(true))
            .map(|(k, _)| k.clone())
            .collect();
        if !declared.is_empty() {
            self.frozen.capabilities.push(ProviderCapabilities {
                provider: provider.to_string(),
                names: declared,
            });
        }
    }

    /// The plan the session freezes, or the refusal: answers that disagree with the plan,
    /// two providers offering one tool name or declaring one command.
    fn finish(mut self, interactive: bool) -> Result<FrozenPlan, Refusal> {
        if !self.differences.is_empty() {
            return Err(Refusal::PlanStale {
                differences: self.differences,
            });
        }
        collisions(&self.tools)?;
        command_collisions(&self.commands)?;
        if interactive {
            self.frozen.user_commands = self.commands;
        }
        self.frozen.tools_digest = crate::tools_digest(&self.tools);
        debug_assert!(
            self.tools.iter().all(|t| !provider_of(&t.route).is_empty()),
            "every planned tool is routed to its provider"
        );
        self.frozen.tools = self.tools.into();
        if !self.texts.is_empty() {
            self.frozen.system_text = Some(self.texts.join("\n\n"));
        }
        Ok(self.frozen)
    }
}

/// One `tool_items` or `system_text_items` entry read.
fn read_item(list: &str, i: usize, raw: &Value, tools: bool) -> Result<(String, Item), Refusal> {
    let bad = |why: String| field("plan", format!("`plan.{list}[{i}]`: {why}"));
    let Some(item) = raw.as_object() else {
        return Err(bad(
            "must be an object {provider, preset?, params, optional?}".into(),
        ));
    };
    if tools {
        if item.contains_key("upfront") {
            return Err(field(
                "plan.tool_items[].upfront",
                format!("`plan.tool_items[{i}].upfront`: this runner renders no upfront tools"),
            ));
        }
        if item.contains_key("output_refs") {
            return Err(field(
                "plan.tool_items[].output_refs",
                format!(
                    "`plan.tool_items[{i}].output_refs`: this runner scans no output references"
                ),
            ));
        }
    }
    if let Some(k) = item
        .keys()
        .find(|k| !matches!(k.as_str(), "provider" | "preset" | "params" | "optional"))
    {
        return Err(bad(format!("has no member `{}`", k.escape_debug())));
    }
    let provider = match item.get("provider").and_then(Value::as_str) {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => return Err(bad("`provider` must be a module id".into())),
    };
    let preset = match item.get("preset") {
        None => None,
        Some(Value::String(p)) => Some(p.clone()),
        Some(_) => return Err(bad("`preset` must be a string".into())),
    };
    let params = match item.get("params") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Err(bad("`params` must be an object".into())),
    };
    let optional = match item.get("optional") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`optional` must be a boolean".into())),
    };
    Ok((
        provider,
        Item {
            preset,
            params,
            optional,
        },
    ))
}

/// The structured-output mode whose run offers its own `submit_result` after its tools.
pub const SUBMIT_TOOL_MODE: &str = cortexkit_role_llm_runner::structured_output::modes::SUBMIT_TOOL;

/// A send's config on a session that froze `plan`: the plan's tools offered (and the run's
/// own `submit_result`, when it asks for one), and its joined system text ahead of the
/// send's own. A send naming `tools` is refused: a planned session's tools are its plan's.
pub fn apply(
    config: &mut broca_wal::runrec::FrozenConfig,
    plan: &FrozenPlan,
    named_tools: bool,
) -> Result<(), Refusal> {
    if named_tools {
        return Err(field(
            "tools",
            "this session's tools are its fetch plan's; a send does not name them",
        ));
    }
    if plan_provider(plan).is_some() {
        provider_window(config)?;
    }
    let submit = cortexkit_role_llm_runner::structured_output::SUBMIT_RESULT_TOOL;
    if plan.tools.iter().any(|t| t.name == submit) && config.structured_output.is_some() {
        return Err(field(
            "structured_output",
            format!("the plan offers a tool named `{submit}`, which structured output reserves"),
        ));
    }
    let own_submit = config
        .structured_output
        .as_ref()
        .filter(|so| so.mode == SUBMIT_TOOL_MODE)
        .and_then(|_| config.tools.iter().find(|t| t.name == submit));
    match own_submit {
        // The run's own `submit_result` after the plan's tools: a list of its own.
        Some(own) => {
            let mut tools = plan.tools.to_vec();
            tools.push(own.clone());
            config.tools_digest = crate::tools_digest(&tools);
            config.tools = tools.into();
        }
        // Shared with the frozen plan: nothing copied or digested per send.
        None => {
            config.tools = plan.tools.clone();
            config.tools_digest.clone_from(&plan.tools_digest);
        }
    }
    config.system = match (&plan.system_text, config.system.take()) {
        (Some(p), Some(own)) => Some(format!("{p}\n\n{own}")),
        (p, own) => p.clone().or(own),
    };
    debug_assert!(
        config.tools.iter().filter(|t| t.name == submit).count() <= 1,
        "`submit_result` is offered once at most"
    );
    Ok(())
}

/// A send's config on a session whose plan names a compaction provider: its history is the
/// provider's to shape (cortexkit-role-compaction R1), so neither the built-in compaction nor
/// a limit of the send's own applies; the run goes to the model's window, which the session's
/// actor keeps each request within (a ride with `over_limit`, then `context_ceiling`).
fn provider_window(config: &mut broca_wal::runrec::FrozenConfig) -> Result<(), Refusal> {
    if config.compaction.is_some() {
        return Err(field(
            "compaction",
            "this session's history is shaped by its plan's compaction provider; a send does \
             not turn on the built-in compaction",
        ));
    }
    let window = config.catalog.as_ref().and_then(|c| c.context_window);
    if let (Some(limit), Some(window)) = (config.context_limit, window) {
        if limit < window {
            return Err(field(
                "context_limit",
                "this session's requests are kept within its model's window by its plan's \
                 compaction provider; a send does not set a lower limit",
            ));
        }
    }
    config.context_limit = None;
    Ok(())
}

/// A queued send's config, admitted on the plan `before` (none: the tools config's), made the
/// config of a run starting on `next`, a change accepted since (llm-runner/v1
/// `session_change`: a change applies at the first run starting after it): the earlier
/// plan's text taken off the front of its system text, then `next` applied.
pub fn reapply(
    config: &mut broca_wal::runrec::FrozenConfig,
    before: Option<&FrozenPlan>,
    next: &FrozenPlan,
) {
    if let (Some(old), Some(system)) = (before.and_then(|p| p.system_text.as_ref()), &config.system)
    {
        if let Some(own) = system.strip_prefix(old.as_str()) {
            let own = own.strip_prefix("\n\n").unwrap_or(own);
            config.system = (!own.is_empty()).then(|| own.to_string());
        }
    }
    if apply(config, next, false).is_ok() {
        config.plan = Some(Box::new(next.clone()));
    }
}

/// The plan a replayed record's `config` gives its session, if any: the plan it was
/// admitted with (when it holds none yet), or, as a run starts on it (`started`), a
/// refreshed one of a later generation than `held`. Read from a WAL, the plan's tools are
/// its config's (planrec's `tools`).
pub fn replayed(
    config: &broca_wal::runrec::FrozenConfig,
    held: Option<&FrozenPlan>,
    started: bool,
) -> Option<Box<FrozenPlan>> {
    let plan = config.plan.as_ref()?;
    if held.is_some_and(|h| !started || plan.generation <= h.generation) {
        return None;
    }
    let mut plan = plan.clone();
    if plan.tools.is_empty() {
        let submit = config
            .structured_output
            .as_ref()
            .is_some_and(|so| so.mode == SUBMIT_TOOL_MODE);
        plan.tools = FrozenPlan::tools_from(&config.tools, submit);
    }
    Some(plan)
}

/// The `session.baseline` answer of a session that froze `plan`: its items, absent items,
/// composition digest and the tool names its latest run offers (`tool_names`).
pub fn baseline(plan: &FrozenPlan, mut tool_names: Vec<String>) -> Value {
    use cortexkit_role_llm_runner::baseline::{Baseline, BaselineReply};
    tool_names.sort();
    tool_names.dedup();
    let mut baseline = json!({
        "items": plan.items,
        "absent_items": plan.absent_items,
        "composition_digest": plan.composition_digest,
        "tool_names": tool_names,
    });
    // Omitted when empty, so a baseline without commands keeps its bytes.
    if !plan.user_commands.is_empty() {
        baseline["user_commands"] = json!(plan.user_commands);
    }
    let baseline: Baseline =
        serde_json::from_value(baseline).expect("a frozen plan's baseline decodes");
    serde_json::to_value(BaselineReply::ready(baseline)).expect("a baseline serializes")
}

/// The compaction provider a frozen plan names, and its item's preset.
pub fn plan_provider(plan: &broca_wal::planrec::FrozenPlan) -> Option<(String, String)> {
    let value: serde_json::Map<String, Value> = serde_json::from_str(&plan.plan).ok()?;
    let provider = cortexkit_role_llm_runner::compaction::plan_compaction_provider(&value)?;
    let preset = value
        .get(cortexkit_role_llm_runner::compaction::PLAN_COMPACTION_ITEM)
        .and_then(|i| i.get("preset"))
        .and_then(Value::as_str)?;
    Some((provider.to_string(), preset.to_string()))
}
