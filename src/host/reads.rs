//! The management methods answered from a session's WAL (or its archived copy) as a reader,
//! on the blocking pool: no lease taken, nothing written, the session's actor not even
//! started. `session.read` and `session.head` page the role's entries; `session.baseline` and
//! `session.send_status` read what the session froze.

use serde_json::Value;

use broca_read::role::ReadRefusal;
use broca_wal::SessionTriple;
use broca_wire::{Caller, Code, Cursor, Method, RpcError};
use cortexkit_role_llm_runner::history::HistoryRequest;
use cortexkit_role_llm_runner::read::ReadRequest;
use cortexkit_role_llm_runner::tool_calls::ToolCallsRequest;

use crate::replies::{invalid, not_owner, send_reply};
use crate::Host;

/// Runs `f` on the blocking pool over the session of `t` as its WAL (or its archived copy)
/// holds it now, read as a reader through the host's read cache: no lease taken, nothing
/// written, the session's actor not even started. `f` gets `None` for a session never
/// written.
pub(crate) async fn with_session<R: Send + 'static>(
    ctx: &Host,
    t: &SessionTriple,
    f: impl FnOnce(Option<&broca_read::ReadSession>) -> R + Send + 'static,
) -> Result<R, RpcError> {
    let path = broca_wal_writer::wal_path(&ctx.wal_dir, t);
    let reads = ctx.reads.clone();
    broca_io::blocking::run(broca_io::blocking::Kind::WalRead, move || {
        reads.with(&path, f)
    })
    .await
    .map_err(unreadable)
}

/// session.baseline: what the session froze. `not_yet` when nothing has reached the session.
pub(crate) async fn baseline(
    ctx: &Host,
    t: SessionTriple,
    caller: &Caller,
) -> Result<Value, RpcError> {
    let caller = caller.clone();
    let plans = ctx.opts.plans;
    let answer = with_session(ctx, &t, move |read| {
        let Some(read) = read else {
            return Ok(broca_wire::role::baseline(None));
        };
        let state = &read.session;
        if !caller.owns(&state.owners()) {
            return Err(());
        }
        let tools = state.runs.last().map(|r| {
            r.config
                .tools
                .iter()
                .map(|t| t.name.clone())
                .collect::<Vec<_>>()
        });
        let names = tools.unwrap_or_default();
        let mut answer = match &state.plan {
            Some(plan) => broca_fetch_plan::plan::baseline(plan, names),
            None => broca_wire::role::baseline(Some(names)),
        };
        if plans {
            broca_fetch_plan::change::baseline(&mut answer, &state.change, state.plan.as_deref());
        }
        Ok(answer)
    })
    .await?
    .map_err(|()| not_owner(Method::SessionBaseline.as_str()))?;
    Ok(answer)
}

/// session.send_status: what a re-send of `send_id` would answer: nothing admitted,
/// delivered or written.
pub(crate) async fn send_status(
    ctx: &Host,
    t: SessionTriple,
    send_id: String,
    caller: &Caller,
) -> Result<Value, RpcError> {
    let caller = caller.clone();
    with_session(ctx, &t, move |read| {
        let unknown = || {
            RpcError::new(
                Code::UnknownSend,
                format!("this session has no send `{}`", send_id.escape_debug()),
            )
        };
        let Some(read) = read else {
            return Err(unknown());
        };
        let s = &read.session;
        // The owner's sends, or a plan sender's own (and its predecessor's, §9.7).
        if !broca_core::admission::may_send(&caller, s) {
            return Err(not_owner(Method::SessionSendStatus.as_str()));
        }
        use broca_core::replay::Found;
        match s.lookup_send(caller.principal.as_deref(), &send_id) {
            Some(Found::Steer(steer)) => {
                if let Some(answer) = broca_read::views::steer_answer(s, steer.seq) {
                    return Ok(answer);
                }
            }
            Some(Found::Run(index)) => return Ok(send_reply(&s.runs[index])),
            Some(Found::Queued(q)) => {
                // Past its time it is what a re-send would make it: `expired` (a status
                // writes nothing; the next boundary or send records it).
                let now = broca_session::now_unix_ms();
                if q.order.as_ref().is_some_and(|o| {
                    cortexkit_role_llm_runner::delivery_order::expired(o.expires_at_ms, now)
                }) {
                    return Ok(serde_json::json!({"state": "expired"}));
                }
                return Ok(
                    serde_json::json!({"state": "pending", "submission_id": q.submission_id}),
                );
            }
            Some(Found::Retracted(_, Some(ended))) => {
                return Ok(broca_read::views::ended_answer(ended))
            }
            Some(Found::Retracted(_, None)) => {
                return Err(RpcError::refusal(&broca_wire::Refusal::SendRetracted))
            }
            None => {}
        }
        Err(unknown())
    })
    .await?
}

/// The incarnation a page names: the WAL's lineage (`log-1` for a session never written, as
/// the role's suite has it).
fn incarnation(read: Option<&broca_read::ReadSession>) -> String {
    read.map_or_else(|| "log-1".to_string(), |r| r.lineage.clone())
}

/// The history version of the session `t`'s current record (after an expiry, the next).
fn version(t: &SessionTriple) -> u64 {
    crate::retention::local::with(|r| r.history_version(&t.address().to_string()))
}

pub(crate) async fn read(
    ctx: &Host,
    t: SessionTriple,
    req: Box<ReadRequest>,
) -> Result<Value, RpcError> {
    if let Err(field) = req.check_rich_ui(broca_wire::role::GROUPS) {
        return Err(invalid("this runner serves no rich UI stamps").with_field(field));
    }
    if let Err(field) = req.check_display_facts(broca_wire::role::GROUPS) {
        return Err(invalid("this runner serves no display facts").with_field(field));
    }
    let v = version(&t);
    let part_keys = ctx.opts.prune_reasoning;
    let page = with_session(ctx, &t, move |read| {
        let session = read.map(|r| &r.session);
        let page = broca_read::role::read_page(session, v, &incarnation(read), &req, part_keys);
        // The page's snapshot ends after the last record it read: a subscription from this
        // head continues strictly after it.
        page.map(|p| match read.and_then(|r| r.last_seq) {
            Some(seq) => p.with_head(Cursor::head_position(seq)),
            None => p,
        })
    })
    .await?;
    match page {
        Ok(page) => Ok(serde_json::to_value(page).expect("a page serializes")),
        Err(ReadRefusal::Invalid { field, why }) => Err(invalid(why).with_field(field)),
        Err(ReadRefusal::HistoryChanged(old)) => Err(RpcError::new(
            Code::HistoryChanged,
            format!("the cursor is of history version {old}; this session's is {v}"),
        )),
        Err(ReadRefusal::UnknownMid(mid)) => Err(unknown_mid(&mid)),
    }
}

fn unknown_mid(mid: &str) -> RpcError {
    RpcError::new(
        Code::UnknownMid,
        format!("no message `{}` in this session", mid.escape_debug()),
    )
}

/// session.head: the session's metadata and spend, no bodies.
pub(crate) async fn head(ctx: &Host, t: SessionTriple) -> Result<Value, RpcError> {
    let v = version(&t);
    let head = with_session(ctx, &t, move |read| {
        broca_read::role::head(read.map(|r| &r.session), v, &incarnation(read))
    })
    .await?;
    Ok(serde_json::to_value(head).expect("a head serializes"))
}

/// session.history: the whole history by opaque cursors, raw or as display rows.
pub(crate) async fn history(
    ctx: &Host,
    t: SessionTriple,
    req: Box<HistoryRequest>,
) -> Result<Value, RpcError> {
    use broca_read::history::HistoryRefusal;
    let v = version(&t);
    let part_keys = ctx.opts.prune_reasoning;
    let page = with_session(ctx, &t, move |read| {
        let session = read.map(|r| &r.session);
        broca_read::history::history_page(session, v, &incarnation(read), &req, part_keys)
    })
    .await?;
    page.map_err(|refusal| match refusal {
        HistoryRefusal::Invalid { field, why } => invalid(why).with_field(field),
        HistoryRefusal::UnknownMid(mid) => unknown_mid(&mid),
        HistoryRefusal::UnknownOrdinal(n) => RpcError::new(
            Code::UnknownOrdinal,
            format!("this session has no entry of ordinal {n}"),
        ),
        HistoryRefusal::CursorExpired => RpcError::new(
            Code::CursorExpired,
            "the cursor is of another session's history; read a fresh page",
        ),
    })
}

/// run.tool_calls: a run's calls in dispatch order, paged.
pub(crate) async fn tool_calls(
    ctx: &Host,
    t: SessionTriple,
    req: Box<ToolCallsRequest>,
) -> Result<Value, RpcError> {
    use broca_read::tool_calls::ToolCallsRefusal;
    let page = with_session(ctx, &t, move |read| {
        broca_read::tool_calls::tool_calls_page(read.map(|r| &r.session), &req)
    })
    .await?;
    match page {
        Ok(page) => Ok(serde_json::to_value(page).expect("a page serializes")),
        Err(ToolCallsRefusal::UnknownRun(run_id)) => Err(RpcError::new(
            Code::UnknownRun,
            format!("no run `{}` in this session", run_id.escape_debug()),
        )),
        Err(ToolCallsRefusal::BadAfter) => Err(invalid(
            "`after` is not a cursor this run's pages gave (pass back a page's `next`)",
        )
        .with_field("after")),
    }
}

/// The refusal of a session whose WAL cannot be read (the error names the file).
fn unreadable(e: broca_read::ReadError) -> RpcError {
    RpcError::new(Code::SessionUnavailable, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::rc::Rc;

    use broca_core::admission::SendRequest;
    use broca_session::SessionActor;
    use broca_testkit::{CountingTools, Script, ScriptedModel};
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
            let mut a: SessionActor<ScriptedModel, CountingTools> = SessionActor::opener(
                wal_dir,
                &triple(),
                Rc::new(ScriptedModel::new(script)),
                Rc::new(CountingTools::default()),
            )
            .tool_specs(Vec::new())
            .log(broca_io::LogConfig::default())
            .committer(broca_io::Committer::default())
            .open()
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

    /// The first page through `cache`, checked against a whole read of the WAL.
    fn page_through(cache: &broca_read::read::ReadCache, path: &Path) -> serde_json::Value {
        let req = cortexkit_role_llm_runner::read::ReadRequest::range(1);
        let cached = cache
            .with(path, |r| {
                let r = r.unwrap();
                broca_read::role::read_page(Some(&r.session), 1, &r.lineage, &req, false).unwrap()
            })
            .unwrap();
        let whole = broca_read::read_session(path, broca_read::Keep::Entries)
            .unwrap()
            .unwrap();
        let want =
            broca_read::role::read_page(Some(&whole.session), 1, &whole.lineage, &req, false);
        assert_eq!(
            Ok(cached.clone()),
            want,
            "the cache answers what a whole read does"
        );
        serde_json::to_value(cached).unwrap()
    }

    #[test]
    fn a_page_follows_the_wal_and_names_its_lineage() {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join("wal");
        broca_owner_only::create_dir(&wal_dir).unwrap();
        let path = broca_wal_writer::wal_path(&wal_dir, &triple());
        let cache = broca_read::read::ReadCache::new(4);
        let page = |path: &Path| page_through(&cache, path);
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
