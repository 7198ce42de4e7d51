//! The next waiting send started once no run is active (a child of `admission`).

use broca_wal::runrec::RunStarted;

use super::{input_cap, joining, ordered, resolved_calls, resolved_mid, RunState, Session};

/// The RunStarted of the session's next waiting send, once no run is active: an interrupting
/// send first, then a steer its run ended before rendering (delivered as this turn, under
/// that run's settings), then the queue in order. Each keeps its frozen admission, takes the
/// results an interrupted run left open, and names what it delivers.
pub fn start_queued(session: &Session, run_id: String, now_unix_ms: u64) -> Option<RunStarted> {
    if session.open.is_some()
        || session
            .runs
            .last()
            .is_some_and(|r| r.state == RunState::Active)
    {
        return None;
    }
    let interrupt = session
        .queued
        .iter()
        .find(|q| q.delivery.as_deref() == Some(broca_wire::delivery::INTERRUPT));
    if interrupt.is_none() {
        if let Some(started) = joining::steer_turn(session, &run_id, now_unix_ms) {
            return Some(started);
        }
    }
    let q = interrupt.or_else(|| session.queued.iter().find(|q| ordered::starts_a_run(q)))?;
    let mut config = q.config.clone();
    config.stop.input_cap = input_cap(session, config.stop.input_cap);
    // A change accepted after the send was queued applies as its run starts.
    let rebuilt = session
        .runs
        .last()
        .is_some_and(|r| r.config.model != config.model);
    if let Some(pending) = session.change.due(session.plan.as_deref(), rebuilt) {
        if config
            .plan
            .as_ref()
            .is_none_or(|p| p.generation < pending.generation)
        {
            broca_fetch_plan::plan::reapply(&mut config, session.plan.as_deref(), &pending.plan);
        }
    }
    Some(RunStarted {
        run_id,
        send_id: q.send_id.clone(),
        inputs_digest: q.inputs_digest.clone(),
        prompt: q.prompt.clone(),
        config,
        resolved_mid: resolved_mid(session),
        resolved_calls: resolved_calls(session),
        at_unix_ms: now_unix_ms,
        principal: q.principal.clone(),
        scope_owner: q.scope_owner.clone(),
        submission_id: Some(q.submission_id.clone()),
        client_message_id: q.client_message_id.clone(),
        delivery: q.delivery.clone(),
        steer_seq: None,
        media: q.media.clone(),
        order: q.order.clone(),
        // What the hooks did is on the queued send's own record.
        pre_user: Vec::new(),
    })
}
