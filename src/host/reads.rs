//! The management methods answered from a session's WAL (or its archived copy) as a reader,
//! on the blocking pool: no lease taken, nothing written, the session's actor not even
//! started. `session.read` and `session.head` page the role's entries; `session.baseline` and
//! `session.send_status` read what the session froze.

use serde_json::Value;

use broca_core::role::ReadRefusal;
use broca_wal::SessionTriple;
use broca_wire::{Caller, Code, Cursor, RpcError};
use cortexkit_role_llm_runner::read::ReadRequest;

use crate::replies::{invalid, not_owner, send_reply};
use crate::Host;

/// session.baseline: read from the session's WAL (or its archived copy) without its actor:
/// no lease taken, nothing written. `not_yet` when nothing has reached the session.
pub(crate) async fn baseline(
    ctx: &Host,
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

/// session.send_status: what a re-send of `send_id` would answer, read from the WAL (or its
/// archived copy) as a reader: nothing admitted, delivered or written.
pub(crate) async fn send_status(
    ctx: &Host,
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
                    Code::UnknownSend,
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
    let path = broca_wal_writer::wal_path(&ctx.wal_dir, &t);
    let page = glommio::executor()
        .spawn_blocking(move || {
            let (session, incarnation, last_seq) = entries_of(&path)?;
            let page = broca_core::role::read_page(session.as_ref(), &incarnation, &req);
            // The page's snapshot ends after the last record it read: a subscription from
            // this head continues strictly after it.
            Ok::<_, broca_core::ReadError>(page.map(|p| match last_seq {
                Some(seq) => p.with_head(Cursor::head_position(seq)),
                None => p,
            }))
        })
        .await
        .map_err(unreadable)?;
    match page {
        Ok(page) => Ok(serde_json::to_value(page).expect("a page serializes")),
        Err(ReadRefusal::Invalid { field, why }) => Err(invalid(why).with_field(field)),
        Err(ReadRefusal::HistoryChanged(v)) => Err(RpcError::new(
            Code::HistoryChanged,
            format!(
                "the cursor is of history version {v}; this session's is {}",
                broca_core::role::HISTORY_VERSION
            ),
        )),
        Err(ReadRefusal::UnknownMid(mid)) => Err(RpcError::new(
            Code::UnknownMid,
            format!("no message `{}` in this session", mid.escape_debug()),
        )),
    }
}

/// session.head: read from the WAL like a page, no lease taken.
pub(crate) async fn head(ctx: &Host, t: SessionTriple) -> Result<Value, RpcError> {
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
