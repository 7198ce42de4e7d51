//! Admission, before any record is written: idempotency by send_id, the model spec, whether
//! this build speaks the provider's wire family, the credential (resolved, its secret
//! fetched into memory only and dropped; the id frozen), the cache policy against the family,
//! the stop conditions, the budget (the measures it needs, and whether the frozen catalog
//! entry can price them), the context limit (the caller's, else the model's context window)
//! and the tool set. Accepted inputs, the renderer version and the catalog entry are frozen
//! into RunStarted; a refusal writes nothing and answers a refusal code.

use crate::replay::prompt_digest;
use broca_catalog as catalog;
use broca_protocol::delivery::delivery_identity;
use broca_protocol::model::ProviderCheck;
use broca_protocol::ToolSpec;
use broca_wal::runrec::{
    result_reason, CachePolicy, FrozenConfig, InputCap, ResultBlock, RunStarted, SendQueued,
    StopConditions,
};

use super::replay::{RunState, Session};

mod joining;
mod queued;
pub use queued::start_queued;
pub(crate) mod ordered;
pub use ordered::{expired_queued, join_waiting, may_cancel, may_retract, may_send};
mod retention;
pub use joining::{inherit, PENDING_STEERS_MAX};
pub(crate) use retention::session_retention;
pub use retention::TITLE_BYTES_MAX;
use retention::{retention, title};
mod planned;
pub use planned::SentPlan;
mod checks;
pub use checks::freeze;
use checks::{
    check_credential_id, check_priced, check_provider, check_request, compaction, select_tools,
    stop_conditions,
};
mod repeated;
use repeated::{frozen_so_key, repeated, so_key, Identity};

/// max_steps when a send does not say.
pub const MAX_STEPS_DEFAULT: u32 = 32;
/// The largest max_steps a send may ask for.
pub const MAX_STEPS_LIMIT: u32 = 10_000;
/// The largest prompt accepted, in bytes.
pub const PROMPT_BYTES_MAX: usize = 4 * 1024 * 1024;

pub use broca_wire::{Budget, Refusal, SendRequest};

/// What admission decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// The send_id names an existing run with the same inputs: nothing to write.
    Existing { run_index: usize },
    /// A new run: append this RunStarted (durably) before answering.
    New(Box<RunStarted>),
    /// A run is active: append this queued send (durably) before answering `pending`.
    Queued(Box<SendQueued>),
    /// The send_id names a queued send with the same inputs: nothing to write.
    Pending { submission_id: String },
    /// A steer joins the active run: append this (durably) before answering; its prompt joins
    /// the conversation at the run's next step boundary.
    Steered(Box<broca_wal::runrec::SendSteered>),
    /// The send_id names a steered send with the same inputs: nothing to write.
    SteerExisting { seq: u64 },
    /// A `dedupe_key` send replaces its sender's waiting sends of that key: these first.
    Replacing {
        ended: Vec<broca_wal::runrec::SendRetracted>,
        then: Box<Admitted>,
    },
    /// The send_id names an ordered send that ended undelivered (llm-runner/v1 §9.7:
    /// `superseded`, `expired`, `template_part_gone`): its terminal state, nothing to write.
    Ended(broca_wal::runrec::SendEnded),
}

/// What admission needs besides the request and the session.
pub struct AdmissionContext<'a> {
    /// Every configured tool (from the tools config), possibly with duplicate names.
    pub tools: &'a [ToolSpec],
    /// The id the new run gets.
    pub run_id: String,
    pub now_unix_ms: u64,
    /// The catalog the send's model resolves in (a snapshot: admission reads nothing else).
    pub catalog: &'a catalog::Catalog,
    /// The families and credentials the runs' model client has.
    pub providers: &'a dyn ProviderCheck,
}

/// A send checked on its own and resolved (model, credential id, tools, stop conditions,
/// budget, context limit, cache policy): what admission decides whatever the session holds.
/// The session's part ([`admit_prepared`]) needs nothing more: admission runs once per send.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub send_id: Option<String>,
    /// The digest of the send's inputs (everything but the send_id).
    pub inputs_digest: String,
    /// The digest of its prompt alone (a reused send_id's refusal names what differs).
    pub prompt_digest: String,
    pub prompt: String,
    pub config: FrozenConfig,
    /// The caller's id for the message it creates.
    pub client_message_id: Option<String>,
    /// Who sends it (set by the surface that took the request).
    pub caller: broca_wire::Caller,
    /// Its delivery mode when not `queue` (`steer`, `interrupt`).
    pub delivery: Option<String>,
    /// Its ordered delivery, when its `delivery` was a list.
    pub order: Option<broca_protocol::delivery::SendOrder>,
    /// The settings the send named (a steer's are checked against the run it joins).
    pub named: Vec<&'static str>,
    /// The uploads its `content` attaches, in order (checked against the session's).
    pub content: Vec<String>,
    /// A first send must name a `retention_policy` (module mode; `session_retention`).
    pub policy_required: bool,
    /// Its fetch plan, read and checked; what its fetch gave is set by the host.
    pub plan: Option<SentPlan>,
    /// What the plan's `pre_user` hooks did to `prompt` (set by the host; on its record).
    pub pre_user: Vec<serde_json::Value>,
    /// The number each part the session's next request shows carries, by `(mid, part id)`
    /// (its compaction provider's view), for a template send's `part_tag` slots: set by the
    /// session's actor just before admission (`broca_ck::provided::shown_numbers`); empty
    /// shows no part.
    pub shown_parts: std::collections::HashMap<(String, String), u64>,
}

/// A send that did not pass [`prepare`]: its refusal, with what a repeated send_id needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Unprepared {
    pub send_id: Option<String>,
    pub inputs_digest: String,
    pub prompt_digest: String,
    pub client_message_id: Option<String>,
    /// Its `structured_output` as a repeated send_id compares it (`so_key`).
    pub structured_output: Option<String>,
    pub caller: broca_wire::Caller,
    pub refusal: Refusal,
    /// As in [`Prepared`].
    pub delivery: Option<String>,
    /// As in [`Prepared`].
    pub order: Option<broca_protocol::delivery::SendOrder>,
}

/// The digest of a send's inputs (everything but the send_id).
pub fn inputs_digest(req: &SendRequest) -> String {
    let mut canonical = req.clone();
    canonical.send_id = None;
    // A repeat may name the session's frozen policy or leave it out: the same send either
    // way (a different one is refused `retention_conflict` before the send_id is looked up).
    canonical.retention_policy = None;
    // Its expiry is timing, not content: a retry keeps the first deadline.
    if let Some(order) = canonical.order.as_mut() {
        order.expires_at_ms = None;
    }
    let bytes = serde_json::to_vec(&canonical).expect("send requests serialize");
    blake3::hash(&bytes).to_hex()[..32].to_string()
}

/// Admits `req` into `session`, or refuses it: [`prepare`], then [`admit_prepared`].
pub fn admit(
    req: &SendRequest,
    session: &Session,
    ctx: &AdmissionContext<'_>,
) -> Result<Admitted, Refusal> {
    match prepare(req, ctx.tools, ctx.catalog, ctx.providers) {
        Ok(p) => admit_prepared(p, session, ctx.run_id.clone(), ctx.now_unix_ms),
        Err(u) => admit_unprepared(&u, session),
    }
}

/// The session's answer to a send that did not pass [`prepare`]: the existing run when its
/// send_id was admitted before with the same inputs, else the refusal.
pub fn admit_unprepared(u: &Unprepared, session: &Session) -> Result<Admitted, Refusal> {
    ordered::sender_admitted(&u.caller, u.order.as_ref(), u.delivery.as_deref(), session)?;
    let identity = Identity {
        inputs_digest: &u.inputs_digest,
        prompt_digest: &u.prompt_digest,
        client_message_id: u.client_message_id.as_deref(),
        structured_output: u.structured_output.clone(),
        delivery: delivery_identity(u.delivery.as_deref(), u.order.as_ref()),
    };
    if let Some(answer) = repeated(session, &u.caller, u.send_id.as_deref(), &identity) {
        return answer;
    }
    Err(u.refusal.clone())
}

/// How many sends a session holds queued behind its active run.
pub const QUEUED_SENDS_MAX: usize = 64;

/// The session's part of admission: a repeated send_id (the same inputs answer the existing
/// run, or the queued send; others are refused), a send behind an active run (queued), and
/// the results an interrupted run left open; then the record to append.
pub fn admit_prepared(
    p: Prepared,
    session: &Session,
    run_id: String,
    now_unix_ms: u64,
) -> Result<Admitted, Refusal> {
    ordered::sender_admitted(&p.caller, p.order.as_ref(), p.delivery.as_deref(), session)?;
    let identity = Identity {
        inputs_digest: &p.inputs_digest,
        prompt_digest: &p.prompt_digest,
        client_message_id: p.client_message_id.as_deref(),
        structured_output: frozen_so_key(p.config.structured_output.as_ref()),
        delivery: delivery_identity(p.delivery.as_deref(), p.order.as_ref()),
    };
    retention::unreleased(session)?;
    retention::policy_fits(
        session,
        p.config.retention_policy.as_ref(),
        p.policy_required,
    )?;
    if let Some(answer) = repeated(session, &p.caller, p.send_id.as_deref(), &identity) {
        return answer;
    }
    let retention = session_retention(session, p.config.retention)?;
    let mut p = p;
    p.config.retention = retention;
    planned::plan(&mut p, session)?;
    ordered::render_template(&mut p, session)?;
    let replaced = ordered::replaced(&p, session, &run_id, now_unix_ms);
    let admitted = admit_planned(p, session, run_id, now_unix_ms)?;
    Ok(if replaced.is_empty() {
        admitted
    } else {
        Admitted::Replacing {
            ended: replaced,
            then: Box::new(admitted),
        }
    })
}

/// [`admit_prepared`] past the send_id and the plan: the record a new send appends.
fn admit_planned(
    p: Prepared,
    session: &Session,
    run_id: String,
    now_unix_ms: u64,
) -> Result<Admitted, Refusal> {
    let p = match join_open_run(p, session, &run_id, now_unix_ms) {
        Ok(joined) => return joined,
        Err(p) => p,
    };
    let media = attach(session, &p.content, &p.config, session.boot)?;
    let busy = session.open.is_some()
        || session
            .runs
            .last()
            .is_some_and(|r| r.state == RunState::Active)
        || session.queued.iter().any(ordered::starts_a_run);
    // A session holds a bounded queue: past it, a send is refused (transient, nothing
    // written) until the queue drains.
    if busy && session.queued.len() >= QUEUED_SENDS_MAX {
        return Err(Refusal::SessionBusy {
            run_id: session
                .runs
                .last()
                .map(|r| r.run_id.clone())
                .unwrap_or_default(),
        });
    }
    let mut p = p;
    // Compaction, once a send of the session turned it on, stays on until one says `off`.
    if p.config.compaction.is_none() && !p.named.contains(&"compaction") {
        p.config.compaction = session.runs.last().and_then(|r| r.config.compaction);
    }
    check_cap_lowers(session, &p.config)?;
    // A list without `idle_start` never starts a run: it waits for one.
    if busy || p.order.as_ref().is_some_and(|o| !o.may_start_a_run()) {
        // The cap it asked for; the session's state joins it when it starts.
        return Ok(queued(p, media, format!("sub_{run_id}"), now_unix_ms));
    }
    let mut config = p.config;
    config.stop.input_cap = input_cap(session, config.stop.input_cap);
    Ok(Admitted::New(Box::new(RunStarted {
        run_id,
        send_id: p.send_id,
        inputs_digest: p.inputs_digest,
        prompt: p.prompt,
        config,
        resolved_mid: resolved_mid(session),
        resolved_calls: resolved_calls(session),
        at_unix_ms: now_unix_ms,
        principal: p.caller.principal,
        scope_owner: p.caller.scope_owner,
        submission_id: None,
        client_message_id: p.client_message_id,
        delivery: p.delivery,
        steer_seq: None,
        media,
        order: p.order,
        pre_user: p.pre_user,
    })))
}

/// A send that joins the run being driven, under its settings, its media checked against
/// that run's model: a list naming a mode a run in progress takes (`steer`, `tool_result`)
/// waits for its boundaries; a steer joins at its next step. `Err` hands back a send that
/// joins none.
fn join_open_run(
    p: Prepared,
    session: &Session,
    run_id: &str,
    now_unix_ms: u64,
) -> Result<Result<Admitted, Refusal>, Prepared> {
    let Some(open) = &session.open else {
        return Err(p);
    };
    let config = &session.runs[open.index].config;
    let ordered = ordered::joins_a_run(&p);
    if !ordered && p.delivery.as_deref() != Some(broca_wire::delivery::STEER) {
        return Err(p);
    }
    let media = match attach(session, &p.content, config, session.boot) {
        Ok(media) => media,
        Err(r) => return Ok(Err(r)),
    };
    let steered = joining::steer(p, media, session, open.index, now_unix_ms);
    Ok(match steered {
        Ok(Admitted::Steered(mut steered)) if ordered => {
            steered.submission_id = Some(format!("sub_{run_id}"));
            Ok(Admitted::Steered(steered))
        }
        other => other,
    })
}

/// A send that waits for the running run (or, a list without `idle_start`, for one to run),
/// with the input cap it asked for.
fn queued(
    p: Prepared,
    media: Vec<broca_protocol::media::Media>,
    submission_id: String,
    now_unix_ms: u64,
) -> Admitted {
    Admitted::Queued(Box::new(SendQueued {
        submission_id,
        send_id: p.send_id,
        inputs_digest: p.inputs_digest,
        prompt: p.prompt,
        config: p.config,
        at_unix_ms: now_unix_ms,
        principal: p.caller.principal,
        scope_owner: p.caller.scope_owner,
        client_message_id: p.client_message_id,
        delivery: p.delivery,
        media,
        order: p.order,
        pre_user: p.pre_user,
    }))
}

/// The media a send's uploads attach (as the process started at `boot` holds them), checked
/// against the model of `config`.
pub fn attach(
    session: &Session,
    ids: &[String],
    config: &FrozenConfig,
    boot: u64,
) -> Result<Vec<broca_protocol::media::Media>, Refusal> {
    use crate::replay::uploads::ContentRefusal;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let family = config.family();
    session
        .attach(ids, boot, family, &config.input_facts())
        .map_err(|r| match r {
            ContentRefusal::UnknownUpload(id) => Refusal::UnknownUpload(id),
            ContentRefusal::UploadGone(id) => Refusal::UploadGone(id),
            ContentRefusal::NotCommitted(id) => Refusal::UploadNotCommitted(id),
            ContentRefusal::Unsupported { upload_id, mime } => Refusal::MediaUnsupported {
                upload_id,
                why: format!(
                    "{}/{} does not take {mime} (what its catalog entry and its wire family                      say); send it to a model that does",
                    config.provider, config.model
                ),
            },
        })
}

/// The session's input cap only goes down: a send asking a higher one is refused.
fn check_cap_lowers(session: &Session, config: &FrozenConfig) -> Result<(), Refusal> {
    let Some(asked) = config.stop.input_cap.map(|c| c.limit) else {
        return Ok(());
    };
    match session.input_cap.filter(|f| asked > *f) {
        Some(frozen) => Err(Refusal::InvalidField {
            field: "budget.max_input_tokens",
            why: format!(
                "the session's input cap is {frozen} tokens and only goes down; {asked} would \
                 raise it"
            ),
        }),
        None => Ok(()),
    }
}

/// The input cap a run starting now keeps: the lowest of the session's and the send's, with
/// what the session's steps have consumed; none when neither has a cap.
fn input_cap(session: &Session, asked: Option<InputCap>) -> Option<InputCap> {
    let limit = match (session.input_cap, asked.map(|c| c.limit)) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(InputCap {
        limit,
        spent: session.input.spent,
        unmeasured: session.input.unmeasured,
    })
}

/// The id of the message whose calls [`resolved_calls`] answers, when there are any.
fn resolved_mid(session: &Session) -> Option<String> {
    if session.unresolved_calls.is_empty() {
        return None;
    }
    session.last_assistant_mid.clone()
}

/// Results for the tool calls an interrupted run left without one: outcome unknown.
fn resolved_calls(session: &Session) -> Vec<ResultBlock> {
    session
        .unresolved_calls
        .iter()
        .map(|id| ResultBlock {
            call_id: id.clone(),
            content: if session.imported_pending.contains(id) {
                "outcome unknown: the imported session stopped before this tool call's result \
                 was recorded; it may or may not have run, and broca did not run it"
            } else {
                broca_wal::runrec::OUTCOME_UNKNOWN_TEXT
            }
            .into(),
            is_error: true,
            reason: Some(result_reason::OUTCOME_UNKNOWN.into()),
            size: None,
            parts: Vec::new(),
        })
        .collect()
}

/// Checks and resolves `req` against the configured tools, the catalog and the providers
/// the runs' model client has, whatever any session holds.
pub fn prepare(
    req: &SendRequest,
    tools: &[ToolSpec],
    catalog: &catalog::Catalog,
    providers: &dyn ProviderCheck,
) -> Result<Prepared, Unprepared> {
    let inputs_digest = inputs_digest(req);
    let resolved = resolve(req, tools, catalog, providers).and_then(|config| {
        let plan = match &req.plan {
            Some(plan) => Some(SentPlan {
                plan: broca_fetch_plan::plan::Plan::read(plan)?,
                admitted: None,
            }),
            None => None,
        };
        Ok((config, plan))
    });
    match resolved {
        Ok((config, plan)) => Ok(Prepared {
            send_id: req.send_id.clone(),
            inputs_digest,
            prompt_digest: prompt_digest(&req.prompt),
            prompt: req.prompt.clone(),
            config,
            client_message_id: req.client_message_id.clone(),
            caller: broca_wire::Caller::operator(),
            delivery: req.delivery.clone(),
            order: req.order.clone(),
            named: req.named_settings(),
            content: req
                .content
                .iter()
                .flatten()
                .map(|c| c.upload_id().to_string())
                .collect(),
            policy_required: false,
            plan,
            pre_user: Vec::new(),
            shown_parts: Default::default(),
        }),
        Err(refusal) => Err(Unprepared {
            // A send_id that is itself invalid names no run.
            send_id: req
                .send_id
                .clone()
                .filter(|id| !id.is_empty() && id.len() <= SEND_ID_BYTES_MAX),
            inputs_digest,
            prompt_digest: prompt_digest(&req.prompt),
            client_message_id: req.client_message_id.clone(),
            structured_output: so_key(req.structured_output.as_ref()),
            caller: broca_wire::Caller::operator(),
            refusal,
            delivery: req.delivery.clone(),
            order: req.order.clone(),
        }),
    }
}

/// The longest send_id taken.
pub const SEND_ID_BYTES_MAX: usize = 256;

/// The send's `structured_output`, frozen for the run's family, or refused naming its field.
fn structured_output(
    req: &SendRequest,
    tools: &[ToolSpec],
    entry: &catalog::ModelEntry,
) -> Result<Option<broca_wal::runrec::FrozenStructuredOutput>, Refusal> {
    let Some(raw) = &req.structured_output else {
        return Ok(None);
    };
    let names: Vec<&str> = match &req.tools {
        Some(wanted) => wanted.iter().map(String::as_str).collect(),
        None => tools.iter().map(|t| t.name.as_str()).collect(),
    };
    let family = entry.provider.family.as_str();
    let support = entry.capability.structured_output;
    broca_protocol::structured::admit(raw, &names, family, support)
        .map(Some)
        .map_err(|r| Refusal::InvalidField {
            field: r.field,
            why: r.why,
        })
}

/// The run's tools: those the send chose (else every configured one), the demo model's
/// built-in tool unless the send chose its tools, and the run's own `submit_result` from
/// the first request.
fn run_tools(
    req: &SendRequest,
    tools: &[ToolSpec],
    entry: &catalog::ModelEntry,
    structured: Option<&broca_wal::runrec::FrozenStructuredOutput>,
) -> Result<Vec<ToolSpec>, Refusal> {
    let mut tools = select_tools(tools, req.tools.as_deref())?;
    if entry.provider.family == broca_protocol::demo::FAMILY
        && req.tools.is_none()
        && !tools
            .iter()
            .any(|t| t.name == broca_protocol::demo::WORD_COUNT)
    {
        tools.push(broca_protocol::demo::word_count_spec());
    }
    if let Some(submit) =
        structured.and_then(|so| broca_protocol::structured::rendering(so).submit_tool)
    {
        tools.push(submit);
    }
    Ok(tools)
}

/// The send's directives by name.
fn directives(req: &SendRequest) -> Vec<String> {
    req.directives
        .iter()
        .flatten()
        .map(|d| {
            serde_json::to_value(d)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .expect("a directive name serializes as a string")
        })
        .collect()
}

/// The frozen config of `req`, or why it is refused.
fn resolve(
    req: &SendRequest,
    tools: &[ToolSpec],
    catalog: &catalog::Catalog,
    providers: &dyn ProviderCheck,
) -> Result<FrozenConfig, Refusal> {
    check_request(req)?;
    if req.model.is_empty() {
        return Err(Refusal::InvalidField {
            field: "model",
            why: "`model` is required (a steer or an interrupt takes the session's latest \
                  run's when it has one)"
                .into(),
        });
    }
    let entry = catalog
        .resolve(&req.model)
        .map_err(|e| Refusal::InvalidParams(e.to_string()))?;
    check_credential_id(req)?;
    let stop = stop_conditions(req)?;
    let (traits, credential_id) = check_provider(req, &entry, providers)?;
    // `auto` asks for breakpoints only where the family marks them; elsewhere it is off,
    // and frozen so.
    let cache_policy = match req.cache_policy.unwrap_or(CachePolicy::Auto) {
        CachePolicy::Auto if traits.marks_cache => CachePolicy::Auto,
        _ => CachePolicy::Off,
    };
    if stop.max_cost_micros.is_some() {
        check_priced(&entry, cache_policy)?;
    }
    // The caller's limit, within the model's window; else the window.
    let context_limit = match (req.context_limit, entry.context_window) {
        (Some(mine), Some(window)) => Some(mine.min(window)),
        (mine, window) => mine.or(window),
    };
    // Checked before the tools are looked up: a send naming the reserved `submit_result` is
    // refused for that, whether or not a tool of that name is configured.
    let structured_output = structured_output(req, tools, &entry)?;
    let tools = run_tools(req, tools, &entry, structured_output.as_ref())?;
    let tools_digest = broca_fetch_plan::tools_digest(&tools);
    Ok(FrozenConfig {
        provider: entry.provider.id.to_string(),
        model: entry.model.clone(),
        credential_id,
        renderer_version: catalog::RENDERER_VERSION,
        catalog_digest: entry.digest(),
        catalog: Some(freeze(&entry)),
        system: req.system.clone(),
        tools: tools.into(),
        tools_digest,
        generation: req.generation.clone().unwrap_or_default(),
        stop,
        context_limit,
        cache_policy,
        directives: directives(req),
        structured_output,
        route_decision_id: req.route_decision_id.clone(),
        compaction: compaction(req)?,
        retention: retention(req)?,
        retention_policy: retention::policy(req)?,
        title: title(req)?,
        plan: None,
    })
}

#[cfg(test)]
mod tests;
