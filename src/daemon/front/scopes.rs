//! broca as the owner of its sessions' scopes, on its registered connection (the owner is the
//! module whose registered connection registers them): tool routes ask (from any shard, over
//! `broca_subc::scope::Scopes`) and this task, on shard 0, takes the owner's sync authority
//! with one empty `scope.sync`, then registers the scopes asked for with `scope.apply`, the
//! asks that came meanwhile in one request. The bookkeeping is broca-subc's sans-IO
//! `Registry`.

use broca_subc::scope::ScopeError;
use std::collections::HashMap;

use super::ConnectionEnded;
use std::rc::Rc;
use std::time::Duration;

use broca_subc::scope::{Ask, Registry};
use futures_lite::StreamExt;

use super::Routes;

/// How long the daemon gets to answer a scope op.
const SCOPE_DEADLINE: Duration = Duration::from_secs(10);

/// Serves the asks until every asking side is gone (broca stops).
pub(super) async fn own(
    front: Rc<Routes>,
    mut asks: futures_channel::mpsc::UnboundedReceiver<Ask>,
) {
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut reg = Registry::new(start);
    while let Some(first) = asks.next().await {
        let mut batch = vec![first];
        while let Ok(more) = asks.try_recv() {
            batch.push(more);
        }
        let answers = settle(&front, &mut reg, &batch).await;
        for ask in batch {
            let answer = match &answers {
                Err(why) => Err(why.clone()),
                Ok(results) => match results.get(&ask.record.scope_ref) {
                    Some(r) => r.clone(),
                    None if reg.is_live(&ask.record) => Ok(()),
                    None => Err(ScopeError::Unexpected(
                        "the daemon's answer says nothing of the session's scope".into(),
                    )),
                },
            };
            let _ = ask.reply.send(answer);
        }
    }
}

/// Makes the asked scopes live: the first sync when it has not gone, then one apply of
/// those not live. Per ref, what the daemon said; `Err`: the whole request failed.
async fn settle(
    front: &Routes,
    reg: &mut Registry,
    batch: &[Ask],
) -> Result<HashMap<String, Result<(), ScopeError>>, ScopeError> {
    if let Some(sync) = reg.first_sync() {
        let answer = ask_daemon(front, sync, broca_subc::protocol::scope::SCOPE_SYNC_OP).await?;
        reg.synced(&answer)?;
        tracing::info!("broca owns its sessions' scopes on its daemon connection");
    }
    for ask in batch.iter().filter(|a| a.fresh) {
        reg.forget(&ask.record.scope_ref);
    }
    let records: Vec<_> = batch.iter().map(|a| a.record.clone()).collect();
    let Some(apply) = reg.batch(&records) else {
        return Ok(HashMap::new());
    };
    let answer = ask_daemon(
        front,
        apply.body,
        broca_subc::protocol::scope::SCOPE_APPLY_OP,
    )
    .await?;
    let results = reg.applied(&answer)?;
    tracing::debug!(
        registered = apply.upserts.len(),
        live = reg.live(),
        "sessions' scopes registered"
    );
    Ok(results)
}

async fn ask_daemon(
    front: &Routes,
    body: Vec<u8>,
    op: &str,
) -> Result<broca_subc::frames::FrameIn, ScopeError> {
    match broca_io::net::with_timeout(SCOPE_DEADLINE, front.ask_daemon(body)).await {
        Ok(Ok(frame)) => Ok(frame),
        Ok(Err(ConnectionEnded)) => Err(ScopeError::Gone),
        Err(()) => Err(ScopeError::Timeout {
            op: op.to_string(),
            after: SCOPE_DEADLINE,
        }),
    }
}
