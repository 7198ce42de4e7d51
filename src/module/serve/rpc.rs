//! The management methods of `POST /v1/rpc`: `{"method", "params"}` in, `{"result"}` or an
//! error out. Session-bound methods name the session by `project_root`, `harness`, `session`;
//! the command goes to the shard that owns it. `session.read` reads the WAL file on the
//! blocking pool and never takes the writer lease.

use std::sync::Arc;

use futures_channel::oneshot;
use serde_json::Value;

use crate::session::{Cancelled, Retracted, SessionCommand};
use broca_core::admission::SendRequest;
use broca_core::replay::RunView;
use broca_core::role::ReadRefusal;
use broca_wal::SessionTriple;
use broca_wire::{Caller, Request, RpcError, SessionName};
use cortexkit_role_llm_runner::read::ReadRequest;

use super::ServeCtx;

fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::new(broca_wire::Code::InvalidParams, why)
}

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

/// Runs one call.
pub(crate) async fn call(
    ctx: &Arc<ServeCtx>,
    body: &[u8],
    caller: &Caller,
) -> Result<Value, RpcError> {
    let request = broca_wire::request::parse(body)?;
    let Some(session) = request.session() else {
        return match request {
            Request::Import {
                format,
                path,
                project_root,
                harness,
                session,
            } => {
                let target = crate::session::ImportTarget {
                    project_root,
                    harness,
                    session,
                };
                import(ctx, &format, path, target).await
            }
            Request::Describe => Ok(broca_wire::role::describe()),
            _ => Err(invalid("the request names no session")),
        };
    };
    let t = triple(session)?;
    match request {
        Request::Send { send: req, .. } => self::send(ctx, t, *req, caller).await,
        Request::Status { run_id, .. } => status(ctx, t, run_id).await,
        Request::Result { run_id, .. } => result(ctx, t, run_id).await,
        Request::Cancel { run_id, .. } => cancel(ctx, t, run_id, caller).await,
        Request::Read { read: req, .. } => read(ctx, t, req).await,
        Request::Head { .. } => head(ctx, t).await,
        Request::Retract { submission_id, .. } => retract(ctx, t, submission_id, caller).await,
        Request::SendStatus { send_id, .. } => send_status(ctx, t, send_id, caller).await,
        Request::Baseline { .. } => baseline(ctx, t, caller).await,
        Request::Import { .. } | Request::Describe => Err(invalid("the request names no session")),
    }
}

/// session.baseline: read from the session's WAL (or its archived copy) without its actor:
/// no lease taken, nothing written. `not_yet` when nothing has reached the session.
async fn baseline(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    caller: &Caller,
) -> Result<Value, RpcError> {
    let wal = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let caller = caller.clone();
    let names = glommio::executor()
        .spawn_blocking(move || {
            let Some(read) = broca_core::read_session(&wal, broca_core::Keep::State)? else {
                return Ok(Ok(None));
            };
            let state = read.session;
            if !caller.owns(&state.owners()) {
                return Ok(Err(()));
            }
            let tools = state.runs.last().map(|r| {
                r.config
                    .tools
                    .iter()
                    .map(|t| t.name.clone())
                    .collect::<Vec<_>>()
            });
            Ok::<_, broca_core::ReadError>(Ok(Some(tools.unwrap_or_default())))
        })
        .await
        .map_err(unreadable)?
        .map_err(|()| not_owner("session.baseline"))?;
    Ok(broca_wire::role::baseline(names))
}

/// session.import: each log under `path` into its session (the parts of `target` not given
/// from the log), each one durable record or nothing. One log: its answer, or its error.
/// A folder: `{"imports": [...]}`, an entry per log, with its answer or its `error`.
async fn import(
    ctx: &Arc<ServeCtx>,
    format: &str,
    path: String,
    target: crate::session::ImportTarget,
) -> Result<Value, RpcError> {
    if ctx.is_stopping() {
        return Err(RpcError::new(
            broca_wire::Code::ShuttingDown,
            "broca is stopping; retry later",
        ));
    }
    let format = broca_import::Format::parse(format)
        .ok_or_else(|| invalid(format!("unknown log format `{format}`")))?;
    let root = std::path::PathBuf::from(&path);
    let folder = root.is_dir();
    let files = glommio::executor()
        .spawn_blocking(move || crate::session::log_files(&[root]))
        .await
        .map_err(|e| RpcError::new(broca_wire::Code::ImportUnreadable, e))?;
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
    ctx: &Arc<ServeCtx>,
    format: broca_import::Format,
    file: std::path::PathBuf,
    target: crate::session::ImportTarget,
) -> Result<Value, RpcError> {
    let (t, input) = glommio::executor()
        .spawn_blocking(move || crate::session::read_source(format, &file, &target))
        .await
        .map_err(|e| crate::session::import_error(&e))?;
    let name = input.file.clone();
    // A log the session holds as it is, or one refused: answered from a read of its WAL (no
    // lease, nothing written, the session's actor not even started).
    let wal = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let checked = {
        let input = input.clone();
        glommio::executor()
            .spawn_blocking(move || crate::session::check_read_only(&wal, &input))
            .await
    };
    if let Some(done) = checked.map_err(|e| crate::session::import_error(&e))? {
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

/// The refusal for a command that did not reach its shard.
fn unrouted(e: super::mesh::MeshError) -> RpcError {
    match e {
        super::mesh::MeshError::Full => RpcError::new(
            broca_wire::Code::ShardBusy,
            "the session's shard has too many commands waiting; retry shortly",
        ),
        super::mesh::MeshError::Gone => unavailable(),
    }
}

fn unavailable() -> RpcError {
    RpcError::new(
        broca_wire::Code::SessionUnavailable,
        "the session's shard did not answer; retry",
    )
}

/// Hands the session's shard the command `make` builds around a reply channel; answers the
/// reply.
async fn ask<R>(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    make: impl FnOnce(oneshot::Sender<R>) -> SessionCommand,
) -> Result<R, RpcError> {
    let (reply, wait) = oneshot::channel();
    ctx.route(t, make(reply)).map_err(unrouted)?;
    wait.await.map_err(|_| unavailable())
}

async fn view(
    ctx: &Arc<ServeCtx>,
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
        broca_wire::Code::UnknownRun,
        format!("no run `{run_id}` in this session"),
    )
}

/// The refusal of an owner-only method to anyone else.
fn not_owner(method: &str) -> RpcError {
    RpcError::new(
        broca_wire::Code::ScopeOwnerMismatch,
        format!(
            "{method} is answered only to the session's owner (the principal of its first send)"
        ),
    )
}

async fn send(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    req: SendRequest,
    caller: &Caller,
) -> Result<Value, RpcError> {
    if ctx.is_stopping() {
        return Err(RpcError::new(
            broca_wire::Code::ShuttingDown,
            "broca is stopping; retry later",
        ));
    }
    // Admission's part that needs no session runs here, once: a send it refuses opens no
    // session (nothing is written, not even a new WAL) unless its send_id may name a run the
    // session already has; the session's actor does the rest with what was resolved here.
    let specs = ctx.tools.specs();
    let catalog = broca_catalog::current();
    let mut admission = broca_core::admission::prepare(&req, &specs, &catalog, &ctx.checks);
    match &mut admission {
        Ok(p) => p.caller = caller.clone(),
        Err(u) => u.caller = caller.clone(),
    }
    if let Err(u) = &admission {
        if u.send_id.is_none() {
            return Err(RpcError::refusal(&u.refusal));
        }
    }
    let (reply, wait) = oneshot::channel();
    let admission = Box::new(admission);
    ctx.route(t.clone(), SessionCommand::Send { admission, reply })
        .map_err(unrouted)?;
    let sent = wait.await.map_err(|_| unavailable())??;
    if let Some(submission_id) = sent.pending {
        return Ok(serde_json::json!({"state": "pending", "submission_id": submission_id}));
    }
    if !sent.existing {
        return Ok(serde_json::json!({"state": "active", "run_id": sent.run_id}));
    }
    let run = view(ctx, &t, Some(sent.run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&sent.run_id))?;
    Ok(send_reply(&run))
}

/// session.send_status: what a re-send of `send_id` would answer, read from the WAL (or its
/// archived copy) as a reader: nothing admitted, delivered or written.
async fn send_status(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    send_id: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    let wal = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let caller = caller.clone();
    glommio::executor()
        .spawn_blocking(move || {
            let unknown = || {
                RpcError::new(
                    broca_wire::Code::UnknownSend,
                    format!("this session has no send `{}`", send_id.escape_debug()),
                )
            };
            let found = broca_core::read_session(&wal, broca_core::Keep::State);
            let Some(read) = found.map_err(unreadable)? else {
                return Err(unknown());
            };
            let s = read.session;
            if !caller.owns(&s.owners()) {
                return Err(not_owner("session.send_status"));
            }
            if let Some(&index) = s.by_send_id.get(&send_id) {
                return Ok(send_reply(&s.runs[index]));
            }
            if let Some(q) = s
                .queued
                .iter()
                .find(|q| q.send_id.as_deref() == Some(send_id.as_str()))
            {
                return Ok(
                    serde_json::json!({"state": "pending", "submission_id": q.submission_id}),
                );
            }
            if s.retracted.contains_key(&send_id) {
                return Err(RpcError::refusal(&broca_wire::Refusal::SendRetracted));
            }
            Err(unknown())
        })
        .await
}

/// The answer to a send that named `run`: its state, and how a send that waited for its
/// turn was delivered.
fn send_reply(run: &broca_core::RunView) -> Value {
    let mut answer =
        serde_json::to_value(broca_core::views::send_answer(run)).expect("an answer serializes");
    if run.submission_id.is_some() {
        answer["delivered"] = serde_json::json!({"as": "turn", "ref": run.run_id});
    }
    answer
}

/// session.retract: withdraws a queued send before it starts (owner-only).
async fn retract(
    ctx: &Arc<ServeCtx>,
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
    Ok(Value::String(
        match answer {
            Retracted::Retracted => "retracted",
            Retracted::AlreadyStarted => "already_started",
            Retracted::NotPending => "not_pending",
        }
        .into(),
    ))
}

async fn status(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    run_id: Option<String>,
) -> Result<Value, RpcError> {
    // A run id the session does not know answers the role's `unknown` state, never a
    // refusal; the session-level form (no run id) answers its latest run.
    match (view(ctx, &t, run_id.clone()).await?, run_id) {
        (Some(run), _) => Ok(broca_core::views::status_answer(&run)),
        (None, Some(_)) => Ok(serde_json::json!({"state": "unknown"})),
        (None, None) => Err(RpcError::new(
            broca_wire::Code::UnknownRun,
            "this session has no run yet",
        )),
    }
}

async fn result(ctx: &Arc<ServeCtx>, t: SessionTriple, run_id: String) -> Result<Value, RpcError> {
    let run = view(ctx, &t, Some(run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&run_id))?;
    Ok(broca_core::views::result_answer(&run))
}

async fn cancel(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    run_id: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    view(ctx, &t, Some(run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&run_id))?;
    let caller = caller.clone();
    let cancelled = ask(ctx, t, |reply| SessionCommand::Cancel {
        run_id,
        caller,
        reply,
    })
    .await?;
    match cancelled {
        Cancelled::Ack => Ok(Value::String("ack".into())),
        Cancelled::NotActive => Ok(Value::String("not_active".into())),
        Cancelled::NotOwner => Err(not_owner("run.cancel")),
    }
}

async fn read(
    ctx: &Arc<ServeCtx>,
    t: SessionTriple,
    req: Box<ReadRequest>,
) -> Result<Value, RpcError> {
    if let Err(field) = req.check_rich_ui(broca_wire::role::GROUPS) {
        return Err(invalid("this runner serves no rich UI stamps").with_field(field));
    }
    if let Err(field) = req.check_display_facts(broca_wire::role::GROUPS) {
        return Err(invalid("this runner serves no display facts").with_field(field));
    }
    let path = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let page = glommio::executor()
        .spawn_blocking(move || {
            let (session, incarnation, last_seq) = entries_of(&path)?;
            let page = broca_core::role::read_page(session.as_ref(), &incarnation, &req);
            // The page's snapshot ends after the last record it read: a subscription from
            // this head continues strictly after it.
            Ok::<_, broca_core::ReadError>(page.map(|p| match last_seq {
                Some(seq) => p.with_head(head_position(seq)),
                None => p,
            }))
        })
        .await
        .map_err(unreadable)?;
    match page {
        Ok(page) => Ok(serde_json::to_value(page).expect("a page serializes")),
        Err(ReadRefusal::Invalid { field, why }) => Err(invalid(why).with_field(field)),
        Err(ReadRefusal::HistoryChanged(v)) => Err(RpcError::new(
            broca_wire::Code::HistoryChanged,
            format!(
                "the cursor is of history version {v}; this session's is {}",
                broca_core::role::HISTORY_VERSION
            ),
        )),
        Err(ReadRefusal::UnknownMid(mid)) => Err(RpcError::new(
            broca_wire::Code::UnknownMid,
            format!("no message `{}` in this session", mid.escape_debug()),
        )),
    }
}

/// session.head: read from the WAL like a page, no lease taken.
async fn head(ctx: &Arc<ServeCtx>, t: SessionTriple) -> Result<Value, RpcError> {
    let path = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let head = glommio::executor()
        .spawn_blocking(move || {
            let (session, incarnation, _) = entries_of(&path)?;
            Ok::<_, broca_core::ReadError>(broca_core::role::head(session.as_ref(), &incarnation))
        })
        .await
        .map_err(unreadable)?;
    Ok(serde_json::to_value(head).expect("a head serializes"))
}

/// A subscription position strictly after every unit of the record `seq`: what a page's
/// `head` holds, and what `session.subscribe` takes back as `from`.
pub(crate) fn head_position(seq: u64) -> serde_json::Map<String, Value> {
    let cursor = broca_core::project::Cursor::end_of(seq).to_string();
    [("after".to_string(), Value::String(cursor))]
        .into_iter()
        .collect()
}

/// The session of the WAL at `path` (or its archived copy) replayed with its entries, read
/// as a reader (no lease), its incarnation (the WAL's lineage), and the seq of its last
/// record. A session never written has no entries and the incarnation `none`.
type Read = (Option<broca_core::Session>, String, Option<u64>);

fn entries_of(path: &std::path::Path) -> Result<Read, broca_core::ReadError> {
    Ok(
        match broca_core::read_session(path, broca_core::Keep::Entries)? {
            Some(r) => (Some(r.session), r.lineage, r.last_seq),
            None => (None, "none".to_string(), None),
        },
    )
}

/// The refusal of a session whose WAL cannot be read (the error names the file).
fn unreadable(e: broca_core::ReadError) -> RpcError {
    RpcError::new(broca_wire::Code::SessionUnavailable, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::rc::Rc;

    use crate::scripted::{CountingTools, Script, ScriptedModel};
    use crate::session::SessionActor;
    use broca_core::admission::SendRequest;
    use broca_wal::SessionTriple;

    fn triple() -> SessionTriple {
        SessionTriple::new("/p", "h", "s").unwrap()
    }

    /// A WAL of the session with one run whose prompt is `prompt` (its records are the same
    /// in number whatever the prompt).
    fn session_with(wal_dir: &Path, prompt: &str) {
        broca_shards::run_local(async {
            let script = Script {
                tool_step_percent: 0,
                ..Script::default()
            };
            let mut a: SessionActor<ScriptedModel, CountingTools> = SessionActor::open(
                wal_dir,
                &triple(),
                Rc::new(ScriptedModel::new(script)),
                Rc::new(CountingTools::default()),
                Vec::new(),
                broca_io::LogConfig::default(),
                broca_io::Committer::default(),
            )
            .await
            .unwrap();
            let req = SendRequest {
                prompt: prompt.into(),
                model: "scripted/m1".into(),
                ..SendRequest::default()
            };
            a.send(&req).await.unwrap();
            a.run_admitted().await.unwrap();
            a.close().await.unwrap();
        })
        .unwrap();
    }

    fn first_text(page: &serde_json::Value) -> String {
        page["messages"][0]["message"]["content"][0]["text"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn page(path: &Path) -> serde_json::Value {
        let (session, incarnation, _) = super::entries_of(path).unwrap();
        let req = cortexkit_role_llm_runner::read::ReadRequest::range(1);
        let page = broca_core::role::read_page(session.as_ref(), &incarnation, &req).unwrap();
        serde_json::to_value(page).unwrap()
    }

    #[test]
    fn a_page_follows_the_wal_and_names_its_lineage() {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join("wal");
        broca_owner_only::create_dir(&wal_dir).unwrap();
        let path = broca_wal_writer::wal_path(&wal_dir, &triple());
        session_with(&wal_dir, "the first life");
        let first = page(&path);
        assert_eq!(first_text(&first), "the first life", "{first}");
        assert_eq!(first["messages"].as_array().unwrap().len(), 2, "{first}");
        session_with(&wal_dir, "more");
        assert_eq!(page(&path)["messages"].as_array().unwrap().len(), 4);
        // The session is recreated: a new lineage, which the page's incarnation names.
        std::fs::remove_file(&path).unwrap();
        session_with(&wal_dir, "a second life");
        let second = page(&path);
        assert_eq!(first_text(&second), "a second life", "{second}");
        let (_, scan) = broca_wal::verify::read_and_scan(&path).unwrap();
        assert_eq!(second["incarnation"], scan.header.lineage_hex());
        assert_ne!(second["incarnation"], first["incarnation"]);
    }
}
