//! broca's listing methods: `sessions.list` from the store's marks (each session's triple and
//! latest run, kept by the store's follower; a session is handed to the store when a run
//! starts and when it ends), checked against the WALs: a listed session whose WAL this
//! process appended to past its mark is brought up to date from its WAL before the page is
//! answered; and `runs.list` from the session's WAL as a reader (the host's `ReadCache`),
//! exact.

use broca_wal::SessionTriple;
use broca_wire::request::lists::{
    run_cursor, run_cursor_after, RunsList, SessionCursor, SessionsList,
};
use broca_wire::{Code, RpcError};
use serde_json::{json, Value};

use std::sync::Arc;

use crate::reads::with_session;
use crate::Host;

/// sessions.list: the store's sessions, filtered, newest activity first, one page.
pub(crate) async fn sessions(ctx: &Host, list: Box<SessionsList>) -> Result<Value, RpcError> {
    let Some(store) = ctx.store.clone() else {
        return Err(RpcError::new(
            Code::StoreUnavailable,
            "sessions.list reads the store, which this daemon could not open (its log says \
             why); `broca store rebuild` makes it again",
        ));
    };
    let read_marks = |store: Arc<broca_store::Store>| async move {
        broca_io::blocking::run(broca_io::blocking::Kind::StoreRead, move || {
            store.sessions()
        })
        .await
        .map_err(|e| RpcError::new(Code::StoreUnavailable, format!("the store: {e}")))
    };
    let marks = read_marks(store.clone()).await?;
    let (page, more) = select(marks, &list);
    // The page's sessions whose WAL moved on since their mark: caught up from the WAL, then
    // the page is chosen again.
    let behind = behind_marks(ctx, &page).await;
    if behind.is_empty() {
        return Ok(render(page, more));
    }
    let wal_dir = ctx.wal_dir.clone();
    let caught = store.clone();
    let failed = broca_io::blocking::run(broca_io::blocking::Kind::StoreWrite, move || {
        let paths: Vec<_> = behind
            .iter()
            .filter_map(|m| SessionTriple::new(&m.project_root, &m.harness, &m.session).ok())
            .map(|t| broca_wal_writer::wal_path(&wal_dir, &t))
            .collect();
        caught.catch_up_batch(&paths)
    })
    .await
    .map_err(|e| RpcError::new(Code::StoreUnavailable, format!("the store: {e}")))?;
    for f in failed {
        tracing::warn!("sessions.list: a session could not be caught up: {f}");
    }
    let marks = read_marks(store).await?;
    let (page, more) = select(marks, &list);
    Ok(render(page, more))
}

/// The marks of `page` that are behind what this process appended to their WALs.
async fn behind_marks(
    ctx: &Host,
    page: &[(SessionCursor, broca_store::Mark)],
) -> Vec<broca_store::Mark> {
    let addrs: Vec<[u8; 16]> = page.iter().map(|(at, _)| at.address).collect();
    let mut heads = Vec::new();
    for shard in 0..ctx.mesh.shards() {
        let (reply, wait) = futures_channel::oneshot::channel();
        // A shard too busy to take the question is not asked: its sessions keep their marks.
        if ctx
            .mesh
            .try_send(shard, crate::ShardMsg::Heads(addrs.clone(), reply))
            .is_ok()
        {
            heads.extend(wait.await.unwrap_or_default());
        }
    }
    page.iter()
        .filter(|(at, m)| {
            heads
                .iter()
                .any(|(a, seq)| *a == at.address && *seq > m.last_seq)
        })
        .map(|(_, m)| m.clone())
        .collect()
}

/// A page of sessions: the marks `list` keeps, newest activity first, and whether more follow.
fn select(
    marks: Vec<([u8; 16], broca_store::Mark)>,
    list: &SessionsList,
) -> (Vec<(SessionCursor, broca_store::Mark)>, bool) {
    let after = list.cursor.as_deref().and_then(SessionCursor::decode);
    let mut kept: Vec<(SessionCursor, broca_store::Mark)> = marks
        .into_iter()
        .filter(|(_, m)| {
            list.project_root
                .as_ref()
                .is_none_or(|p| *p == m.project_root)
                && list.harness.as_ref().is_none_or(|h| *h == m.harness)
                && list.since_ms.is_none_or(|t| m.active_unix_ms() >= t)
                && list.state.as_ref().is_none_or(|s| match &m.last_run {
                    Some(r) => r.state == *s,
                    None => s == "none",
                })
        })
        .map(|(address, m)| {
            let at = SessionCursor {
                active_ms: m.active_unix_ms(),
                address,
            };
            (at, m)
        })
        // Newest activity first; the address orders sessions active at the same time.
        .filter(|(at, _)| after.is_none_or(|a| newer_first(at) > newer_first(&a)))
        .collect();
    kept.sort_by_key(|(at, _)| newer_first(at));
    let more = kept.len() > list.limit as usize;
    kept.truncate(list.limit as usize);
    (kept, more)
}

/// The answer of a page of sessions.
fn render(kept: Vec<(SessionCursor, broca_store::Mark)>, more: bool) -> Value {
    let next = more
        .then(|| kept.last().map(|(at, _)| at.encode()))
        .flatten();
    let sessions: Vec<Value> = kept
        .into_iter()
        .map(|(at, m)| {
            let mut s = json!({
                "project_root": m.project_root,
                "harness": m.harness,
                "session": m.session,
                "created_at_ms": m.created_unix_ms,
                "active_at_ms": at.active_ms,
                "runs": m.runs,
                "messages": m.messages,
            });
            if let Some(r) = m.last_run {
                let mut last = json!({
                    "run_id": r.run_id,
                    "state": r.state,
                    "model": r.model,
                    "started_at_ms": r.started_unix_ms,
                });
                if let Some(t) = r.ended_unix_ms {
                    last["ended_at_ms"] = t.into();
                }
                s["last_run"] = last;
            }
            if m.queued > 0 {
                s["queued"] = m.queued.into();
            }
            s
        })
        .collect();
    let mut page = json!({ "sessions": sessions });
    if let Some(next) = next {
        page["next_cursor"] = next.into();
    }
    page
}

/// The sort key of "newest activity first, then by address".
fn newer_first(at: &SessionCursor) -> (std::cmp::Reverse<u64>, [u8; 16]) {
    (std::cmp::Reverse(at.active_ms), at.address)
}

/// runs.list: the session's runs, newest first, as `run.status` answers each (with the
/// provider, model and send_id beside it), one page.
pub(crate) async fn runs(
    ctx: &Host,
    t: SessionTriple,
    list: Box<RunsList>,
) -> Result<Value, RpcError> {
    let page = with_session(ctx, &t, move |read| {
        let Some(read) = read else {
            return json!({ "runs": [] });
        };
        let before = list.cursor.as_deref().and_then(run_cursor);
        let mut runs: Vec<&broca_core::RunView> = read
            .session
            .runs
            .iter()
            .rev()
            .filter(|r| before.is_none_or(|b| r.started_seq < b))
            .filter(|r| list.state.as_ref().is_none_or(|s| r.state.as_str() == s))
            .collect();
        let more = runs.len() > list.limit as usize;
        runs.truncate(list.limit as usize);
        let next = more
            .then(|| runs.last().map(|r| run_cursor_after(r.started_seq)))
            .flatten();
        let runs: Vec<Value> = runs
            .into_iter()
            .map(|r| {
                let mut v = broca_read::views::status_answer(r);
                v["provider"] = r.config.provider.clone().into();
                v["model"] = r.config.model.clone().into();
                v["steps"] = r.steps.into();
                if let Some(id) = &r.send_id {
                    v["send_id"] = id.clone().into();
                }
                if let Some(title) = &r.config.title {
                    v["title"] = title.clone().into();
                }
                v
            })
            .collect();
        let mut page = json!({ "runs": runs });
        if let Some(next) = next {
            page["next_cursor"] = next.into();
        }
        page
    })
    .await?;
    Ok(page)
}
