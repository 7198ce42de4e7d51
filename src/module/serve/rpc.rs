//! The management methods of `POST /v1/rpc`: `{"method", "params"}` in, `{"result"}` or an
//! error out. Session-bound methods name the session by `project_root`, `harness`, `session`;
//! the command goes to the shard that owns it. `session.read` reads the WAL file on the
//! blocking pool and never takes the writer lease.

use std::sync::Arc;

use futures_channel::oneshot;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::session::SessionCommand;
use broca_core::admission::SendRequest;
use broca_core::replay::RunView;
use broca_wal::SessionTriple;
use broca_wire::{ReadMessage, ReadPage, RpcError, READ_LIMIT_DEFAULT, READ_LIMIT_MAX};

use super::ServeCtx;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    method: String,
    #[serde(default)]
    params: Option<Map<String, Value>>,
}

fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::permanent(400, "invalid_params", why)
}

/// Checks a management request body as far as it can be checked without a daemon: the
/// envelope, the method, the session triple, and for session.send its parameters and what
/// admission refuses whatever the session holds. The fuzz targets drive the request parsing
/// through here. Answers the method.
pub fn check_request(body: &[u8]) -> Result<String, RpcError> {
    let env: Envelope = serde_json::from_slice(body).map_err(|e| {
        RpcError::permanent(400, "invalid_request", format!("not an envelope: {e}"))
    })?;
    let mut params = env.params.unwrap_or_default();
    match env.method.as_str() {
        "session.send" => {
            triple(&mut params)?;
            let req: SendRequest = serde_json::from_value(Value::Object(params))
                .map_err(|e| invalid(e.to_string()))?;
            let catalog = broca_catalog::current();
            let probe = broca_core::admission::AdmissionContext {
                catalog: &catalog,
                tools: &[],
                run_id: String::new(),
                now_unix_ms: 0,
            };
            broca_core::admission::admit(&req, &broca_core::Session::default(), &probe)
                .map_err(|r| RpcError::refusal(&r))?;
        }
        "run.status" | "run.result" | "run.cancel" | "session.read" => {
            triple(&mut params)?;
            take_str(&mut params, "run_id")?;
            take_u64(&mut params, "from_ordinal")?;
            take_u64(&mut params, "limit")?;
            no_more(&params)?;
        }
        other => {
            return Err(RpcError::permanent(
                404,
                "unknown_method",
                format!("unknown method `{other}`"),
            ))
        }
    }
    Ok(env.method)
}

/// Runs one call.
pub(crate) async fn call(ctx: &Arc<ServeCtx>, body: &[u8]) -> Result<Value, RpcError> {
    let env: Envelope = serde_json::from_slice(body).map_err(|e| {
        RpcError::permanent(
            400,
            "invalid_request",
            format!("the body is not a request envelope {{\"method\", \"params\"}}: {e}"),
        )
    })?;
    let params = env.params.unwrap_or_default();
    match env.method.as_str() {
        "session.send" => send(ctx, params).await,
        "run.status" => status(ctx, params).await,
        "run.result" => result(ctx, params).await,
        "run.cancel" => cancel(ctx, params).await,
        "session.read" => read(ctx, params).await,
        other => Err(RpcError::permanent(
            404,
            "unknown_method",
            format!(
                "unknown method `{other}` (known: session.send, run.status, run.result, \
                 run.cancel, session.read)"
            ),
        )),
    }
}

fn take_str(params: &mut Map<String, Value>, key: &str) -> Result<Option<String>, RpcError> {
    match params.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(format!("`{key}` must be a string, not {other}"))),
    }
}

fn take_u64(params: &mut Map<String, Value>, key: &str) -> Result<Option<u64>, RpcError> {
    match params.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(other) => Err(invalid(format!(
            "`{key}` must be a non-negative integer, not {other}"
        ))),
    }
}

fn triple(params: &mut Map<String, Value>) -> Result<SessionTriple, RpcError> {
    let mut part =
        |key: &str| take_str(params, key)?.ok_or_else(|| invalid(format!("`{key}` is required")));
    let (root, harness, session) = (part("project_root")?, part("harness")?, part("session")?);
    SessionTriple::new(&root, &harness, &session).map_err(|e| invalid(e.to_string()))
}

fn no_more(params: &Map<String, Value>) -> Result<(), RpcError> {
    match params.keys().next() {
        Some(k) => Err(invalid(format!("unknown parameter `{k}`"))),
        None => Ok(()),
    }
}

/// The refusal for a command that did not reach its shard.
fn unrouted(e: super::mesh::MeshError) -> RpcError {
    match e {
        super::mesh::MeshError::Full => RpcError::transient(
            503,
            "shard_busy",
            "the session's shard has too many commands waiting; retry shortly",
        ),
        super::mesh::MeshError::Gone => unavailable(),
    }
}

fn unavailable() -> RpcError {
    RpcError::transient(
        503,
        "session_unavailable",
        "the session's shard did not answer; retry",
    )
}

async fn view(
    ctx: &Arc<ServeCtx>,
    t: &SessionTriple,
    run_id: Option<String>,
) -> Result<Option<RunView>, RpcError> {
    let (reply, wait) = oneshot::channel();
    ctx.route(t.clone(), SessionCommand::Status { run_id, reply })
        .map_err(unrouted)?;
    wait.await.map_err(|_| unavailable())
}

fn unknown_run(run_id: &str) -> RpcError {
    RpcError::permanent(
        404,
        "unknown_run",
        format!("no run `{run_id}` in this session"),
    )
}

async fn send(ctx: &Arc<ServeCtx>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let t = triple(&mut params)?;
    let req: SendRequest =
        serde_json::from_value(Value::Object(params)).map_err(|e| invalid(e.to_string()))?;
    if ctx.is_stopping() {
        return Err(RpcError::transient(
            503,
            "shutting_down",
            "broca is stopping; retry later",
        ));
    }
    // What admission refuses whatever the session holds is refused here, before the session
    // is opened (a refused send writes nothing, not even a new WAL).
    let specs = ctx.tools.specs();
    let catalog = broca_catalog::current();
    let probe = broca_core::admission::AdmissionContext {
        catalog: &catalog,
        tools: &specs,
        run_id: String::new(),
        now_unix_ms: 0,
    };
    if let Err(r) = broca_core::admission::admit(&req, &broca_core::Session::default(), &probe) {
        return Err(RpcError::refusal(&r));
    }
    let (reply, wait) = oneshot::channel();
    ctx.route(t.clone(), SessionCommand::Send { req, reply })
        .map_err(unrouted)?;
    let sent = wait.await.map_err(|_| unavailable())??;
    if !sent.existing {
        return Ok(serde_json::json!({"state": "active", "run_id": sent.run_id}));
    }
    let run = view(ctx, &t, Some(sent.run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&sent.run_id))?;
    Ok(serde_json::to_value(broca_core::views::send_answer(&run)).expect("an answer serializes"))
}

async fn status(ctx: &Arc<ServeCtx>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let t = triple(&mut params)?;
    let run_id = take_str(&mut params, "run_id")?;
    no_more(&params)?;
    let run = view(ctx, &t, run_id.clone())
        .await?
        .ok_or_else(|| match &run_id {
            Some(id) => unknown_run(id),
            None => RpcError::permanent(404, "unknown_run", "this session has no run yet"),
        })?;
    Ok(serde_json::to_value(broca_core::views::run_status(&run)).expect("a status serializes"))
}

async fn result(ctx: &Arc<ServeCtx>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let t = triple(&mut params)?;
    let run_id = take_str(&mut params, "run_id")?.ok_or_else(|| invalid("`run_id` is required"))?;
    no_more(&params)?;
    let run = view(ctx, &t, Some(run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&run_id))?;
    Ok(serde_json::to_value(broca_core::views::run_result(&run)).expect("a result serializes"))
}

async fn cancel(ctx: &Arc<ServeCtx>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let t = triple(&mut params)?;
    let run_id = take_str(&mut params, "run_id")?.ok_or_else(|| invalid("`run_id` is required"))?;
    no_more(&params)?;
    view(ctx, &t, Some(run_id.clone()))
        .await?
        .ok_or_else(|| unknown_run(&run_id))?;
    let (reply, wait) = oneshot::channel();
    ctx.route(t, SessionCommand::Cancel { run_id, reply })
        .map_err(unrouted)?;
    let acked = wait.await.map_err(|_| unavailable())?;
    Ok(Value::String(
        if acked { "ack" } else { "not_active" }.into(),
    ))
}

async fn read(ctx: &Arc<ServeCtx>, mut params: Map<String, Value>) -> Result<Value, RpcError> {
    let t = triple(&mut params)?;
    let from = take_u64(&mut params, "from_ordinal")?.unwrap_or(0);
    let limit = take_u64(&mut params, "limit")?.unwrap_or(READ_LIMIT_DEFAULT as u64);
    no_more(&params)?;
    if limit == 0 || limit > READ_LIMIT_MAX as u64 {
        return Err(invalid(format!("`limit` must be 1 to {READ_LIMIT_MAX}")));
    }
    let path = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let page = glommio::executor()
        .spawn_blocking({
            let store = ctx.store.clone();
            move || read_page(&path, store.as_deref(), from, limit as usize)
        })
        .await;
    page.map_err(|e| RpcError::transient(500, "internal", e))
}

/// Pages the durable transcript of the WAL at `path`, read as a reader (no lease): from the
/// store's materialized transcript when the store has applied exactly what the WAL holds
/// (same lineage, same last seq), else by replaying the WAL.
fn read_page(
    path: &std::path::Path,
    store: Option<&broca_store::Store>,
    from: u64,
    limit: usize,
) -> Result<Value, String> {
    let found = broca_wal::verify::read_and_scan_if_any(path).map_err(|e| e.to_string())?;
    let Some((bytes, scan)) = found else {
        let page = ReadPage {
            messages: Vec::new(),
            next_from_ordinal: None,
            head: 0,
            lineage_id: None,
        };
        return Ok(serde_json::to_value(page).expect("a page serializes"));
    };
    let last_seq = scan.frames.last().map_or(0, |f| f.seq);
    let addr = scan.header.address.0;
    let current = store.and_then(|s| s.mark(&addr).ok().flatten().map(|m| (s, m)));
    if let Some((s, mark)) =
        current.filter(|(_, m)| m.lineage_id == scan.header.lineage_hex() && m.last_seq == last_seq)
    {
        if let Ok(messages) = s.transcript_page(&addr, from, limit) {
            let head = mark.messages;
            let start = from.min(head);
            let end = start + messages.len() as u64;
            let page = ReadPage {
                messages: messages
                    .iter()
                    .enumerate()
                    .map(|(i, message)| ReadMessage {
                        ordinal: start + i as u64,
                        message,
                    })
                    .collect(),
                next_from_ordinal: (end < head).then_some(end),
                head,
                lineage_id: Some(mark.lineage_id.clone()),
            };
            return Ok(serde_json::to_value(page).expect("a page serializes"));
        }
    }
    let session = broca_core::Session::replay_scan(&scan, &bytes)
        .map_err(|e| format!("{}: record {}: {}", path.display(), e.seq, e.reason))?;
    let head = session.transcript.len() as u64;
    let start = from.min(head) as usize;
    let end = (start + limit).min(session.transcript.len());
    let messages = session.transcript[start..end]
        .iter()
        .enumerate()
        .map(|(i, message)| ReadMessage {
            ordinal: (start + i) as u64,
            message,
        })
        .collect();
    let page = ReadPage {
        messages,
        next_from_ordinal: ((end as u64) < head).then_some(end as u64),
        head,
        lineage_id: Some(scan.header.lineage_hex()),
    };
    Ok(serde_json::to_value(page).expect("a page serializes"))
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

    #[test]
    fn a_page_is_never_served_from_a_projection_behind_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let wal_dir = state.join("wal");
        broca_owner_only::create_dir(&wal_dir).unwrap();
        let path = broca_wal_writer::wal_path(&wal_dir, &triple());
        session_with(&wal_dir, "one");
        let (store, _) = broca_store::Store::open(state).unwrap();
        store.catch_up(&path).unwrap();
        assert_eq!(
            super::read_page(&path, Some(&store), 0, 10).unwrap()["head"],
            2
        );
        // The WAL moves on; the store has not caught up yet.
        session_with(&wal_dir, "two");
        let page = super::read_page(&path, Some(&store), 0, 10).unwrap();
        assert_eq!(page["head"], 4, "{page}");
        assert_eq!(page["messages"].as_array().unwrap().len(), 4, "{page}");
    }

    #[test]
    fn a_page_is_never_served_from_a_projection_of_another_lineage() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let wal_dir = state.join("wal");
        broca_owner_only::create_dir(&wal_dir).unwrap();
        let path = broca_wal_writer::wal_path(&wal_dir, &triple());
        session_with(&wal_dir, "the first life");
        let (store, _) = broca_store::Store::open(state).unwrap();
        store.catch_up(&path).unwrap();
        let page = super::read_page(&path, Some(&store), 0, 10).unwrap();
        assert_eq!(first_text(&page), "the first life", "{page}");
        let old_lineage = page["lineage_id"].clone();
        // The session is recreated: a new lineage with exactly as many records; the store
        // still holds the old one's projection.
        std::fs::remove_file(&path).unwrap();
        session_with(&wal_dir, "a second life");
        let mark = store.mark(&triple().address().0).unwrap().unwrap();
        let (_, scan) = broca_wal::verify::read_and_scan(&path).unwrap();
        assert_eq!(
            mark.last_seq,
            scan.frames.last().unwrap().seq,
            "the old projection ends at the same seq"
        );
        let page = super::read_page(&path, Some(&store), 0, 10).unwrap();
        assert_eq!(first_text(&page), "a second life", "{page}");
        assert_ne!(
            page["lineage_id"], old_lineage,
            "the lineage change is visible"
        );
        assert_eq!(page["lineage_id"], scan.header.lineage_hex());
    }
}
