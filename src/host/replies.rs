//! The answers and refusals the management methods share: a bad parameter, an owner-only
//! method asked by another caller, a command that did not reach its shard, and a send's reply
//! for a run it named.

use futures_channel::oneshot;
use serde_json::Value;

use broca_session::SessionCommand;
use broca_wal::SessionTriple;

use broca_shards::mesh::MeshError;
use broca_wire::{Code, RpcError};

use crate::Host;

pub(crate) fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::new(Code::InvalidParams, why)
}

/// The refusal for a command that did not reach its shard.
pub(crate) fn unrouted(e: MeshError) -> RpcError {
    match e {
        MeshError::Full => RpcError::new(
            Code::ShardBusy,
            "the session's shard has too many commands waiting; retry shortly",
        ),
        MeshError::Gone => unavailable(),
    }
}

pub(crate) fn unavailable() -> RpcError {
    RpcError::new(
        Code::SessionUnavailable,
        "the session's shard did not answer; retry",
    )
}

/// The refusal of an owner-only method to anyone else.
pub(crate) fn not_owner(method: &str) -> RpcError {
    RpcError::new(
        Code::ScopeOwnerMismatch,
        format!(
            "{method} is answered only to the session's owner (the principal of its first send)"
        ),
    )
}

/// The answer to a send that named `run`: its state, and how a send that waited for its
/// turn was delivered.
pub(crate) fn send_reply(run: &broca_core::RunView) -> Value {
    let mut answer =
        serde_json::to_value(broca_read::views::send_answer(run)).expect("an answer serializes");
    if run.submission_id.is_some() || run.delivery.is_some() {
        answer["delivered"] = serde_json::json!({"as": "turn", "ref": run.run_id});
    }
    answer
}

/// Hands the session's shard the command `make` builds around a reply channel; answers the
/// reply.
pub(crate) async fn ask<R>(
    ctx: &Host,
    t: SessionTriple,
    make: impl FnOnce(oneshot::Sender<R>) -> SessionCommand,
) -> Result<R, RpcError> {
    let (reply, wait) = oneshot::channel();
    ctx.route(t, make(reply)).map_err(unrouted)?;
    wait.await.map_err(|_| unavailable())
}
