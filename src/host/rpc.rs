//! The management methods, executed: a request the management core (broca-wire) parsed in,
//! its `result` or a refusal out, the same for every front (serve's `/v1/rpc`, a daemon
//! route). A session-bound command goes to the shard that owns the session; the reads
//! (`crate::reads`) never take the writer lease.

use std::sync::Arc;

use futures_channel::oneshot;
use serde_json::Value;

use broca_core::admission::{Prepared, SendRequest, Unprepared};
use broca_core::replay::RunView;
use broca_session::{Cancelled, ImportTarget, SessionCommand};
use broca_wal::SessionTriple;
use broca_wire::{Caller, Code, Method, Request, RpcError, SessionName};

use crate::reads::{baseline, head, history, read, send_status, tool_calls};
use crate::replies::ask;
use crate::replies::{invalid, not_owner, send_reply, unavailable, unrouted};
use crate::Host;

/// Checks a management request body as far as it can be checked without a daemon: the
/// envelope, the method, its parameters, the session triple, and for session.send what
/// admission refuses whatever the session holds (with no tools configured, the catalog in
/// use, and any credential taken). The fuzz targets drive the request parsing through
/// here. Answers the method.
pub fn check_request(body: &[u8]) -> Result<String, RpcError> {
    let request = broca_wire::request::parse(body)?;
    if let Some(s) = request.session() {
        triple(s)?;
    }
    if let Request::Send { send, .. } = &request {
        let catalog = broca_catalog::current();
        let any = broca_protocol::model::AnyProvider;
        if let Err(u) = broca_core::admission::prepare(send, &[], &catalog, &any) {
            return Err(RpcError::refusal(&u.refusal));
        }
    }
    Ok(request.method().as_str().to_string())
}

impl Host {
    /// Executes one management request from `caller`: its `result`, or the refusal.
    pub async fn call(
        self: &Arc<Self>,
        request: Request,
        caller: &Caller,
    ) -> Result<Value, RpcError> {
        call(self, request, caller).await
    }
}

async fn call(ctx: &Arc<Host>, request: Request, caller: &Caller) -> Result<Value, RpcError> {
    let Some(session) = request.session() else {
        return sessionless(ctx, request).await;
    };
    let t = triple(session)?;
    // A release answers `absent` for a session expired or deleted, where others refuse.
    if !matches!(request, Request::Release { .. }) {
        ctx.retention_gate(&t, &request).await?;
    }
    match request {
        Request::Release { .. } => ctx.release(&t, caller).await,
        Request::Send { send: req, .. } => self::send(ctx, t, *req, caller).await,
        Request::Status { run_id, .. } => status(ctx, t, run_id).await,
        Request::Result {
            run_id, wait_ms, ..
        } => result(ctx, t, run_id, wait_ms).await,
        Request::Cancel { run_id, at, .. } => cancel(ctx, t, run_id, at, caller).await,
        Request::ToolCalls { calls, .. } => tool_calls(ctx, t, calls).await,
        Request::History { history: req, .. } => history(ctx, t, req).await,
        Request::Read { read: req, .. } => read(ctx, t, req).await,
        Request::Head { .. } => head(ctx, t).await,
        Request::Retract {
            submission_id,
            named_sender,
            ..
        } => {
            if named_sender {
                return Err(retract_naming_a_sender(ctx, &t, &submission_id, caller).await);
            }
            retract(ctx, t, submission_id, caller).await
        }
        Request::SendStatus { send_id, .. } => send_status(ctx, t, send_id, caller).await,
        Request::Baseline { .. } => baseline(ctx, t, caller).await,
        Request::RunsList { list, .. } => crate::lists::runs(ctx, t, list).await,
        Request::Upload { op, .. } => upload(ctx, t, op, caller).await,
        Request::MediaRead { read, .. } => crate::media::media_read(ctx, t, read).await,
        #[cfg(debug_assertions)]
        Request::ArchiveNow { .. } => ctx.archive_now(&t).await,
        #[cfg(not(debug_assertions))]
        Request::ArchiveNow { .. } => Err(invalid("a release build packs no session now")),
        planned => plan_call(ctx, t, planned, caller).await,
    }
}

/// A request naming no session of its own: an import (its logs name theirs), the build's
/// description, the sessions' list, the debug clock.
async fn sessionless(ctx: &Arc<Host>, request: Request) -> Result<Value, RpcError> {
    match request {
        Request::Import {
            format,
            path,
            project_root,
            harness,
            session,
        } => {
            let target = ImportTarget {
                project_root,
                harness,
                session,
            };
            import(ctx, &format, path, target).await
        }
        Request::Describe => Ok(broca_wire::role::describe(broca_wire::role::Declared {
            step_events: ctx.step_hints.is_some(),
            policy_required: ctx.policy_required,
            prunes_reasoning: ctx.opts.prune_reasoning,
            plans: ctx.opts.plans,
            delivery_order: ctx.opts.delivery_order,
            pre_user: ctx.runs_pre_user(),
        })),
        Request::SessionsList { list } => crate::lists::sessions(ctx, list).await,
        #[cfg(debug_assertions)]
        Request::AdvanceClock { ms } => Ok(ctx.advance_clock(ms).await),
        _ => Err(invalid("the request names no session")),
    }
}

/// A request about the session's plan and owners: a person-only command and its status, a
/// refresh and its policy, a flushed prefix, an adoption, a host's start.
async fn plan_call(
    ctx: &Arc<Host>,
    t: SessionTriple,
    request: Request,
    caller: &Caller,
) -> Result<Value, RpcError> {
    match request {
        Request::UserCommand { command, .. } => {
            crate::commands::user_command(ctx, t, command, caller).await
        }
        Request::UserCommandStatus { call_key, .. } => {
            crate::commands::status(ctx, t, call_key, caller).await
        }
        Request::Refresh { refresh, .. } => crate::change::refresh(ctx, t, refresh, caller).await,
        Request::RefreshPolicy { policy, .. } => {
            crate::change::refresh_policy(ctx, t, policy, caller).await
        }
        Request::FlushPrefix { send_id, .. } => {
            crate::change::flush_prefix(ctx, t, send_id, caller).await
        }
        Request::Adopt { adopt, .. } => crate::adopt::adopt(ctx, t, adopt, caller).await,
        Request::HostStart { plan, .. } => crate::adopt::host_start(ctx, t, plan, caller).await,
        _ => Err(invalid("the request names no session")),
    }
}

/// An upload operation: refused while the process stops, but for a status.
async fn upload(
    ctx: &Host,
    t: SessionTriple,
    op: broca_wire::request::uploads::UploadOp,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if ctx.is_stopping() && !matches!(op, broca_wire::request::uploads::UploadOp::Status { .. }) {
        return Err(RpcError::new(
            Code::ShuttingDown,
            "broca is stopping; retry later",
        ));
    }
    let caller = caller.clone();
    ask(ctx, t, |reply| SessionCommand::Upload { op, caller, reply }).await?
}

/// session.import: each log under `path` into its session (the parts of `target` not given
/// from the log), each one durable record or nothing. One log: its answer, or its error.
/// A folder: `{"imports": [...]}`, an entry per log, with its answer or its `error`.
async fn import(
    ctx: &Host,
    format: &str,
    path: String,
    target: ImportTarget,
) -> Result<Value, RpcError> {
    if ctx.is_stopping() {
        return Err(RpcError::new(
            Code::ShuttingDown,
            "broca is stopping; retry later",
        ));
    }
    let format = broca_import::Format::parse(format)
        .ok_or_else(|| invalid(format!("unknown log format `{format}`")))?;
    let root = std::path::PathBuf::from(&path);
    let roots = ctx.opts.import_roots.clone();
    let (folder, files) = broca_io::blocking::run(broca_io::blocking::Kind::Import, move || {
        broca_session::confine(&roots, &root)?;
        Ok((root.is_dir(), broca_session::log_files(&[root])?))
    })
    .await
    .map_err(|e| broca_session::import_error(&e))?;
    let mut entries = Vec::new();
    for file in files {
        let answer = import_one(ctx, format, file.clone(), target.clone()).await;
        if !folder {
            return answer;
        }
        entries.push(answer.unwrap_or_else(|e| {
            serde_json::json!({
                "file": file,
                "error": {"code": e.code.as_str(), "class": e.class().as_str(), "message": e.message},
            })
        }));
    }
    Ok(serde_json::json!({ "imports": entries }))
}

async fn import_one(
    ctx: &Host,
    format: broca_import::Format,
    file: std::path::PathBuf,
    target: ImportTarget,
) -> Result<Value, RpcError> {
    let roots = ctx.opts.import_roots.clone();
    let (t, input) = broca_io::blocking::run(broca_io::blocking::Kind::Import, move || {
        // Each log too: a link in an allowed folder may lead out of it.
        broca_session::confine(&roots, &file)?;
        broca_session::read_source(format, &file, &target)
    })
    .await
    .map_err(|e| broca_session::import_error(&e))?;
    let name = input.file.clone();
    // A log the session holds as it is, or one refused: answered from a read of its WAL (no
    // lease, nothing written, the session's actor not even started).
    let wal = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let checked = {
        let input = input.clone();
        broca_io::blocking::run(broca_io::blocking::Kind::Import, move || {
            broca_session::check_read_only(&wal, &input)
        })
        .await
    };
    if let Some(done) = checked.map_err(|e| broca_session::import_error(&e))? {
        return Ok(done.to_json(&name, &t));
    }
    let (reply, wait) = oneshot::channel();
    let input = Box::new(input);
    ctx.route(t.clone(), SessionCommand::Import { input, reply })
        .map_err(unrouted)?;
    let done = wait.await.map_err(|_| unavailable())??;
    Ok(done.to_json(&name, &t))
}

fn triple(s: &SessionName) -> Result<SessionTriple, RpcError> {
    SessionTriple::new(&s.project_root, &s.harness, &s.session).map_err(|e| invalid(e.to_string()))
}

async fn view(
    ctx: &Host,
    t: &SessionTriple,
    run_id: Option<String>,
) -> Result<Option<RunView>, RpcError> {
    ask(ctx, t.clone(), |reply| SessionCommand::Status {
        run_id,
        reply,
    })
    .await
}

fn unknown_run(run_id: &str) -> RpcError {
    RpcError::new(
        Code::UnknownRun,
        format!("no run `{run_id}` in this session"),
    )
}

async fn send(
    ctx: &Host,
    t: SessionTriple,
    req: SendRequest,
    caller: &Caller,
) -> Result<Value, RpcError> {
    send_served(ctx, &req)?;
    // A steer or an interrupt takes the settings it leaves out from the session's latest
    // run; its identity (a re-send's comparison) and the settings it named stay as sent.
    let joining = req.delivery.is_some() || req.order.is_some();
    let mut admission = prepared(ctx, &t, req, caller, joining).await?;
    if let Err(u) = &admission {
        if u.send_id.is_none() {
            return Err(RpcError::refusal(&u.refusal));
        }
    }
    if let Ok(p) = &mut admission {
        refuse_content(ctx, &t, p).await?;
        crate::plans::fetch(ctx, &t, p).await?;
        crate::pre_user::run(ctx, &t, p).await?;
    }
    let (reply, wait) = oneshot::channel();
    let admission = Box::new(admission);
    ctx.route(t.clone(), SessionCommand::Send { admission, reply })
        .map_err(unrouted)?;
    let sent = wait.await.map_err(|_| unavailable())??;
    if let Some(answer) = sent.steer {
        return Ok(answer);
    }
    if let Some(submission_id) = sent.pending {
        return Ok(serde_json::json!({"state": "pending", "submission_id": submission_id}));
    }
    if !sent.existing {
        let mut answer = serde_json::json!({"state": "active", "run_id": sent.run_id});
        // A steer or an interrupt on an idle session is a plain send: delivered as this turn.
        if joining {
            answer["delivered"] = serde_json::json!({"as": "turn", "ref": sent.run_id});
        }
        return Ok(answer);
    }
    let run = view(ctx, &t, Some(sent.run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&sent.run_id))?;
    debug_assert_eq!(
        run.run_id, sent.run_id,
        "a repeated send answers its own run"
    );
    Ok(send_reply(&run))
}

/// Whether this runner serves what the send asks: refused while it stops, a plan where plans
/// are off, a delivery list where ordered delivery is off or none of whose modes broca
/// delivers, a plan naming what this runner does not host.
fn send_served(ctx: &Host, req: &SendRequest) -> Result<(), RpcError> {
    if ctx.is_stopping() {
        return Err(RpcError::new(
            Code::ShuttingDown,
            "broca is stopping; retry later",
        ));
    }
    if let (Some(plan), false) = (&req.plan, ctx.opts.plans) {
        return Err(broca_wire::request::plan_not_admitted(plan));
    }
    if req.order.is_some() && !ctx.opts.delivery_order {
        return Err(broca_wire::request::list_not_admitted());
    }
    if let Some(order) = &req.order {
        // A list none of whose modes broca delivers could never go out.
        let modes = broca_wire::role::DELIVERY_ORDER_MODES;
        if !order.modes.iter().any(|m| modes.contains(&m.as_str())) {
            return Err(RpcError::new(
                broca_wire::Code::DeliveryUnsupported,
                "no mode of this delivery list is one broca delivers (tool_result, steer, \
                 idle_start)",
            )
            .with_detail("delivery", serde_json::json!(order.modes)));
        }
    }
    if let Some(plan) = &req.plan {
        crate::plans::plan_served(ctx, plan)?;
    }
    Ok(())
}

/// Admission's part that needs no session, run here once: a send it refuses opens no session
/// (nothing is written, not even a new WAL) unless its send_id may name a run the session
/// already has; the session's actor does the rest with what was resolved here. A `joining`
/// send (a steer, an interrupt, a list) takes what it leaves out from the latest run, its
/// identity and named settings kept as sent. A credential read from the vault is read off
/// this shard's thread first, so admission's check of it does not wait on the vault here.
async fn prepared(
    ctx: &Host,
    t: &SessionTriple,
    mut req: SendRequest,
    caller: &Caller,
    joining: bool,
) -> Result<Result<Prepared, Unprepared>, RpcError> {
    let asked = joining.then(|| {
        (
            broca_core::admission::inputs_digest(&req),
            req.named_settings(),
        )
    });
    if joining {
        if let Some(latest) = view(ctx, t, None).await? {
            broca_core::admission::inherit(&mut req, &latest.config);
        }
    }
    if let Some(id) = &req.credential_id {
        ctx.checks.prefetch(id).await;
    }
    let specs = ctx.tools.specs();
    let catalog = broca_catalog::current();
    let mut admission = broca_core::admission::prepare(&req, &specs, &catalog, &ctx.checks);
    match &mut admission {
        Ok(p) => {
            p.caller = caller.clone();
            p.policy_required = ctx.policy_required;
        }
        Err(u) => u.caller = caller.clone(),
    }
    if let Some((digest, named)) = asked {
        match &mut admission {
            Ok(p) => (p.inputs_digest, p.named) = (digest, named),
            Err(u) => u.inputs_digest = digest,
        }
    }
    Ok(admission)
}

/// A send whose `content` the session's uploads refuse (an unknown, lost or open upload, or
/// media its model does not take), as its WAL read as a reader says: refused here, before
/// its session's actor is even started (a refusal writes nothing, not even the lease record
/// an actor's opening appends). The actor checks the same again as it admits the send.
async fn refuse_content(
    ctx: &Host,
    t: &SessionTriple,
    p: &broca_core::admission::Prepared,
) -> Result<(), RpcError> {
    if p.content.is_empty() {
        return Ok(());
    }
    let (ids, caller, config, steer) = (
        p.content.clone(),
        p.caller.clone(),
        p.config.clone(),
        p.delivery.as_deref() == Some(broca_wire::delivery::STEER),
    );
    let boot = broca_session::process_boot();
    let checked = crate::reads::with_session(ctx, t, move |read| {
        let Some(read) = read else {
            return Ok(());
        };
        let s = &read.session;
        if !caller.owns(&s.owners()) {
            return Ok(()); // the actor refuses it as not the owner's
        }
        // A steer's media go to the run it joins.
        let config = match s
            .runs
            .last()
            .filter(|r| steer && r.state == broca_core::RunState::Active)
        {
            Some(run) => &run.config,
            None => &config,
        };
        broca_core::admission::attach(s, &ids, config, boot).map(drop)
    })
    .await?;
    checked.map_err(|r| RpcError::refusal(&r))
}

/// session.retract: withdraws a queued send before it starts (owner-only).
async fn retract(
    ctx: &Host,
    t: SessionTriple,
    submission_id: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    let caller = caller.clone();
    let answer = ask(ctx, t, |reply| SessionCommand::Retract {
        submission_id,
        caller,
        reply,
    })
    .await??;
    Ok(Value::String(answer.as_str().into()))
}

/// The refusal of a `session.retract` naming a `sender`: a caller that may not withdraw the
/// submission is refused as such first (`scope_owner_mismatch`), then the member
/// (`invalid_params {field: "sender"}`). Nothing is written either way.
async fn retract_naming_a_sender(
    ctx: &Host,
    t: &SessionTriple,
    submission_id: &str,
    caller: &Caller,
) -> RpcError {
    let (caller, id) = (caller.clone(), submission_id.to_string());
    let allowed = crate::reads::with_session(ctx, t, move |read| {
        read.is_none_or(|r| broca_core::admission::may_retract(&caller, &r.session, &id))
    })
    .await;
    match allowed {
        Ok(true) => RpcError::refusal(&broca_wire::Refusal::InvalidField {
            field: "sender",
            why: "a retraction's sender is its route's attested principal, never a request field"
                .into(),
        }),
        Ok(false) => RpcError::refusal(&broca_wire::Refusal::ScopeOwnerMismatch),
        Err(e) => e,
    }
}

async fn status(ctx: &Host, t: SessionTriple, run_id: Option<String>) -> Result<Value, RpcError> {
    // A run id the session does not know answers the role's `unknown` state, never a
    // refusal; the session-level form (no run id) answers its latest run.
    match (view(ctx, &t, run_id.clone()).await?, run_id) {
        (Some(run), _) => Ok(broca_read::views::status_answer(&run)),
        (None, Some(_)) => Ok(serde_json::json!({"state": "unknown"})),
        (None, None) => Err(RpcError::new(
            Code::UnknownRun,
            "this session has no run yet",
        )),
    }
}

/// run.result; with `wait_ms`, a long poll: an active run is looked at again every 50 ms
/// until it ends, the wait is over, or broca begins to stop, and answered as it then is.
async fn result(
    ctx: &Host,
    t: SessionTriple,
    run_id: String,
    wait_ms: Option<u64>,
) -> Result<Value, RpcError> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms.unwrap_or(0));
    loop {
        let run = view(ctx, &t, Some(run_id.clone()))
            .await?
            .ok_or_else(|| unknown_run(&run_id))?;
        debug_assert_eq!(run.run_id, run_id, "the view asked for is the run's");
        let waiting = run.state == broca_core::RunState::Active
            && std::time::Instant::now() < until
            && !ctx.is_stopping();
        if !waiting {
            return Ok(broca_read::views::result_answer(&run));
        }
        glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn cancel(
    ctx: &Host,
    t: SessionTriple,
    run_id: String,
    at: broca_wire::CancelAt,
    caller: &Caller,
) -> Result<Value, RpcError> {
    view(ctx, &t, Some(run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&run_id))?;
    let caller = caller.clone();
    let cancelled = ask(ctx, t, |reply| SessionCommand::Cancel {
        run_id,
        at,
        caller,
        reply,
    })
    .await?;
    match cancelled {
        Cancelled::Ack => Ok(Value::String("ack".into())),
        Cancelled::NotActive => Ok(Value::String("not_active".into())),
        Cancelled::NotOwner => Err(not_owner(Method::RunCancel.as_str())),
    }
}
