//! Retention as requests meet it (docs/retention.md): a session past its expiry is expired
//! before any request of it is served, so a read right at expiry already answers `expired`;
//! each shard looks for its sessions due every [`broca_wire::role::RETENTION_SWEEP_MS`], so
//! one no request touches is deleted within the declared `delete_within_ms`.

use std::sync::Arc;
use std::time::Duration;

use broca_session::SessionCommand;
use broca_wal::SessionTriple;
use broca_wire::{Code, Request, RpcError};

use crate::Host;

/// The `expired` answer of a session whose retention ran out at `at`.
pub(crate) fn expired(at: u64) -> RpcError {
    RpcError::new(
        Code::Expired,
        format!(
            "this session's retention ran out at {at} (ms since the Unix epoch): its \
             transcript is deleted; a send starts it afresh"
        ),
    )
    .with_detail("expired_at_ms", at.into())
}

impl Host {
    /// Retention before a request of session `t` is served: the session expired first when
    /// it is due; then every request but a send (which starts a fresh record) of an expired
    /// session answers `expired`, writing nothing. A send giving the session a retention
    /// lists it among those kept (durably) before it is admitted.
    pub(crate) async fn retention_gate(
        &self,
        t: &SessionTriple,
        request: &Request,
    ) -> Result<(), RpcError> {
        let Request::Send { send, .. } = request else {
            let media = matches!(request, Request::MediaRead { .. });
            return self.unexpired_for(t, media).await;
        };
        self.expire_if_due(t).await;
        // Listed (durably, once) when something will act on the session: a retention, or a
        // policy that deletes or archives it. A `forever` policy needs no listing.
        let acts = send
            .retention_policy
            .as_ref()
            .and_then(|v| broca_wire::decode_policy(v).ok())
            .is_some_and(|p| broca_core::replay::policy_acts(&p));
        if send.retention.is_some() || acts {
            self.keep_listed(t).await?;
        }
        Ok(())
    }

    /// `expired` when the session `t` is (expired first when it is due).
    pub(crate) async fn unexpired(&self, t: &SessionTriple) -> Result<(), RpcError> {
        self.unexpired_for(t, false).await
    }

    /// `expired` when the session `t` is (expired first when it is due); `unknown_session`
    /// when its storage policy or release deleted it, or `unknown_media` for a media read.
    async fn unexpired_for(&self, t: &SessionTriple, media: bool) -> Result<(), RpcError> {
        self.expire_if_due(t).await;
        match crate::retention::local::with(|r| r.ended(&t.address().to_string())) {
            None => Ok(()),
            Some(e) if !e.deleted => Err(expired(e.at_ms)),
            Some(_) if media => Err(RpcError::new(
                Code::UnknownMedia,
                "this session was deleted (its storage policy or its release), and its media \
                 with it",
            )),
            Some(_) => Err(RpcError::new(
                Code::UnknownSession,
                "this session was deleted (its storage policy or its release); a send starts \
                 it afresh",
            )),
        }
    }

    /// `session.release` (llm-runner/v1 `session_retention`): `absent` when no session is
    /// under the name (never written, expired or deleted); else the release, durable before
    /// the answer (the session listed among those kept first, so a restart finds it), then
    /// `deleted` when nothing holds it and its floor has passed, or `pending`.
    pub(crate) async fn release(
        &self,
        t: &SessionTriple,
        caller: &broca_wire::Caller,
    ) -> Result<serde_json::Value, RpcError> {
        use broca_session::Release;
        use cortexkit_role_llm_runner::session_retention::{ReleaseReply, ReleaseState};
        let answer = |state| serde_json::to_value(ReleaseReply::new(state)).expect("serializes");
        self.expire_if_due(t).await;
        let addr = t.address().to_string();
        if crate::retention::local::with(|r| r.ended(&addr).is_some()) {
            return Ok(answer(ReleaseState::absent()));
        }
        let wal = broca_wal_writer::wal_path(&self.wal_dir, t);
        if wal.exists() || broca_wal::archive::exists(&wal) {
            self.keep_listed(t).await?;
        }
        let (reply, wait) = futures_channel::oneshot::channel();
        let caller = caller.clone();
        self.route(t.clone(), SessionCommand::Release { caller, reply })
            .map_err(crate::replies::unrouted)?;
        let released = wait.await.map_err(|_| crate::replies::unavailable())??;
        match released {
            Release::Absent => Ok(answer(ReleaseState::absent())),
            Release::Pending { .. } => {
                if self.may_be_due(t) && self.expire(t).await.is_some() {
                    return Ok(answer(ReleaseState::deleted()));
                }
                Ok(answer(ReleaseState::pending()))
            }
        }
    }

    /// Lists `t` among the sessions kept with a retention, a storage policy or a release
    /// (durably; once per record on each shard).
    async fn keep_listed(&self, t: &SessionTriple) -> Result<(), RpcError> {
        let addr = t.address().to_string();
        let version = crate::retention::local::with(|r| r.history_version(&addr));
        if crate::retention::local::with(|r| r.indexed(&addr, version)) {
            return Ok(());
        }
        let me = self.retention.clone();
        let listed = t.clone();
        broca_io::blocking::run(broca_io::blocking::Kind::Retention, move || {
            me.index(&listed)
        })
        .await
        .map_err(|e| {
            RpcError::new(
                Code::Internal,
                format!("the session's retention cannot be kept: {e}"),
            )
        })?;
        crate::retention::local::with(|r| r.mark_indexed(addr, version));
        Ok(())
    }

    /// Whether the session `t` may be due now: its shard's earliest due time has come (its
    /// actor then says whether this one is).
    fn may_be_due(&self, t: &SessionTriple) -> bool {
        let shard = self.shard_of(t);
        self.retention
            .may_be_due(shard, broca_session::now_unix_ms())
    }

    async fn expire_if_due(&self, t: &SessionTriple) {
        if self.may_be_due(t) {
            self.expire(t).await;
        }
    }

    /// Expires the session `t` if it is past its retention, and waits until it is deleted.
    pub(crate) async fn expire(&self, t: &SessionTriple) -> Option<u64> {
        let (reply, wait) = futures_channel::oneshot::channel();
        self.route(t.clone(), SessionCommand::Expire { reply })
            .ok()?;
        wait.await.ok().flatten()
    }

    /// Expires every session of this shard past its retention now, one after the other.
    pub(crate) async fn expire_due(&self) {
        let now = broca_session::now_unix_ms();
        for t in crate::retention::local::with(|r| r.due_now(now)) {
            self.expire(&t).await;
        }
    }

    /// Tells every shard `msg` and waits until each has taken it (one that stopped is not
    /// waited for).
    pub(crate) async fn tell_shards(
        &self,
        msg: impl Fn(futures_channel::oneshot::Sender<()>) -> crate::ShardMsg,
    ) {
        for shard in 0..self.shards() {
            let (done, wait) = futures_channel::oneshot::channel();
            if self.mesh.send(shard, msg(done)).await.is_ok() {
                let _ = wait.await;
            }
        }
    }

    /// Moves the process's clock forward by `ms` (a debug build's test hook: the
    /// llm-runner/v1 suite's `advance_retention_clock`) and expires what is then due before
    /// answering.
    #[cfg(debug_assertions)]
    pub(crate) async fn advance_clock(&self, ms: u64) -> serde_json::Value {
        broca_session::advance_clock(ms);
        self.expire_due().await;
        serde_json::json!({"now_ms": broca_session::now_unix_ms()})
    }
}

/// A shard's look for its sessions due, every [`broca_wire::role::RETENTION_SWEEP_MS`] while
/// any of them has a retention; it ends when none has (an idle daemon keeps no timer for
/// it), and the shard's next session kept starts it again (`Keeper::note_due`). `running` is
/// the shard's own flag.
pub(crate) fn sweep(
    host: &Arc<Host>,
    stop: std::rc::Rc<broca_shards::timer::StopSignal>,
    running: std::rc::Rc<std::cell::Cell<bool>>,
) {
    if running.get() || !crate::retention::local::with(|r| r.any_due()) {
        return;
    }
    running.set(true);
    let host = host.clone();
    let period = Duration::from_millis(broca_wire::role::RETENTION_SWEEP_MS);
    glommio::spawn_local(async move {
        while stop.or_stop(glommio::timer::sleep(period)).await.is_some() {
            if !crate::retention::local::with(|r| r.any_due()) {
                break;
            }
            host.expire_due().await;
        }
        running.set(false);
    })
    .detach();
}
