//! A shard's sessions: an actor per live session in the shard's registry, started on the
//! first command for it (opening its WAL under the lease and resuming a run a crash left
//! open) and closed after it has been idle for a while or to make room, so an idle session
//! costs no memory; the next command rebuilds it from the WAL. A command for a session no
//! actor holds that needs no actor (a status, a cancel of nothing) is answered from its WAL.

use std::rc::Rc;
use std::time::Duration;

use broca_session::{ActorError, SessionActor, SessionCommand, Unopened};
use broca_shards::registry::{Inbox, Msg, Refused};
use broca_wal::{SessionTriple, WalError};
use broca_wire::{Code, RpcError};

use crate::shard::{Actor, Key, Shard, INBOX_MAX};

/// How often a shard out of file descriptors says so in its log.
const SHORT_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a stopping shard waits for its sessions to close.
const STOP_CLOSE_MAX: Duration = Duration::from_secs(30);
/// How often a stopping shard looks whether its active runs ended within the grace.
const GRACE_POLL: Duration = Duration::from_millis(10);

impl Shard {
    /// Hands `cmd` to the session's actor, starting it if needed. A read of a session whose
    /// actor is not open is answered from its WAL as a reader: it takes no lease and writes
    /// nothing.
    pub(crate) fn dispatch(self: &Rc<Self>, triple: SessionTriple, cmd: SessionCommand) {
        if self.sessions.is_closing() {
            return refuse_closing(cmd);
        }
        let addr = triple.address().0;
        let cmd = match self.sessions.is_live(&addr) {
            true => cmd,
            false => match self.without_actor(&triple, cmd) {
                Some(cmd) => cmd,
                None => return,
            },
        };
        let me = self.clone();
        let t = triple.clone();
        let start = move |inbox: Inbox<SessionCommand>| {
            glommio::spawn_local(async move { me.actor(t, Rc::new(inbox)).await }).detach();
        };
        match self.sessions.route(&addr, cmd, start) {
            Ok(()) => self.bound_room_waits(),
            Err((cmd, Refused::AtLimit)) => cmd.fail(&self.at_limit()),
            Err((cmd, Refused::InboxFull)) => cmd.fail(&inbox_full()),
            Err((cmd, Refused::Closing)) => refuse_closing(cmd),
        }
    }

    /// Answers what a session no actor holds needs no actor for (the session's own
    /// answer, `broca_session::answer_unopened`); `Some` hands back a command its actor must
    /// answer (started for it).
    fn without_actor(&self, triple: &SessionTriple, cmd: SessionCommand) -> Option<SessionCommand> {
        let wal = broca_wal_writer::wal_path(&self.host.wal_dir, triple);
        match broca_session::answer_unopened(&wal, cmd) {
            Unopened::Answered => None,
            Unopened::Open(cmd) => Some(cmd),
            // Nothing to expire: expired already (and deleted), or never written.
            Unopened::Expire(reply) => {
                let addr = triple.address().to_string();
                let ended = crate::retention::local::with(|r| r.ended(&addr));
                let _ = reply.send(ended.map(|e| e.at_ms));
                None
            }
        }
    }

    /// While commands wait for room, refuses each that has waited longer than
    /// `wait_for_room` (checked every tenth of it, at most a second apart); no timer runs
    /// while none waits.
    fn bound_room_waits(self: &Rc<Self>) {
        if self.sessions.waiting_for_room() == 0 || self.room_sweep.replace(true) {
            return;
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            let bound = me.host.opts.wait_for_room;
            let every = (bound / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
            while me.sessions.waiting_for_room() > 0 && !me.sessions.is_closing() {
                glommio::timer::sleep(every).await;
                let expired = me.sessions.expire_waiting(bound);
                if !expired.is_empty() {
                    tracing::warn!(
                        commands = expired.len(),
                        waited_secs = bound.as_secs_f64(),
                        "refused sends that waited too long for an open session to close"
                    );
                }
                for cmd in expired {
                    cmd.fail(&me.waited_too_long());
                }
            }
            me.room_sweep.set(false);
        })
        .detach();
    }

    fn waited_too_long(&self) -> RpcError {
        let limits = self.sessions.limits();
        RpcError::new(
            Code::SessionLimit,
            format!(
                "waited {:.0} s for one of the {} sessions this shard keeps open to finish \
                 its run and close; retry later (raise open_sessions_max, the open-files \
                 limit or wait_for_room_secs)",
                self.host.opts.wait_for_room.as_secs_f64(),
                limits.open_max
            ),
        )
    }

    fn at_limit(&self) -> RpcError {
        let limits = self.sessions.limits();
        RpcError::new(
            Code::SessionLimit,
            format!(
                "all {} sessions this shard keeps open are running and {} commands already \
                 wait for one to close; retry later (raise open_sessions_max or the \
                 open-files limit)",
                limits.open_max, limits.waiting_max
            ),
        )
    }

    /// A session a crash left with an open run, found at start: its actor opens and resumes
    /// the run in the background (at most `RESUMES_AT_ONCE` resumes at a time).
    pub(crate) fn resume(self: &Rc<Self>, triple: SessionTriple) {
        let addr = triple.address().0;
        if self.sessions.is_closing() || self.sessions.is_live(&addr) {
            return; // stopping, or already open (it resumed when it opened)
        }
        // A barrier starts the actor (which resumes the run as it opens) and asks nothing.
        let (reply, _) = futures_channel::oneshot::channel();
        let me = self.clone();
        let t = triple.clone();
        let start = move |inbox: Inbox<SessionCommand>| {
            glommio::spawn_local(async move { me.actor(t, Rc::new(inbox)).await }).detach();
        };
        if let Err((_, why)) = self
            .sessions
            .route(&addr, SessionCommand::Barrier { reply }, start)
        {
            tracing::warn!(
                "session {}: its open run is not resumed now ({why:?}: every session this \
                 shard keeps open is running); it resumes when the session is next used",
                triple.address()
            );
        }
    }

    /// One session's actor: open, resume, answer commands in order, run sends, close when
    /// idle, told to make room, or stopping.
    async fn actor(self: Rc<Self>, triple: SessionTriple, inbox: Rc<Inbox<SessionCommand>>) {
        let addr = triple.address().0;
        // The steps that are large futures (opening, resuming, a run, closing) are boxed: an
        // open session waiting for its next command holds only this loop's own state, and a
        // running one the step it is in (BENCHMARKS.md, memory per session).
        let opened = Box::pin(self.open_actor(&triple, &inbox)).await;
        if let Some(mut actor) = opened {
            if actor.state().open.is_some() {
                let _slot = self.resumes.acquire_permit(1).await;
                let resumed = Box::pin(self.running(&inbox, &triple, actor.resume())).await;
                self.mark_moved(&triple, &actor);
                if let Err(e) = resumed {
                    tracing::error!("session {}: resuming: {e}", triple.address());
                }
            }
            self.note_retention(&actor, &triple);
            Box::pin(self.serve_commands(&mut actor, &inbox, &triple)).await;
            broca_provider::prefix::forget(&actor.state().transcript);
            if let Err(e) = Box::pin(actor.close()).await {
                tracing::error!("session {}: closing: {e}", triple.address());
            }
            self.expire_asked.borrow_mut().remove(&addr);
            for reply in self
                .close_asked
                .borrow_mut()
                .remove(&addr)
                .unwrap_or_default()
            {
                let _ = reply.send(true);
            }
            let expiring = self.expiring.borrow_mut().remove(&addr);
            if let Some(expiring) = expiring {
                self.delete_expired(&triple, expiring).await;
            }
        }
        self.ended(addr, &triple, inbox).await;
    }

    /// Answers the session's commands in order until it is idle, told to close, or stopping.
    async fn serve_commands(
        &self,
        actor: &mut Actor,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
    ) {
        let mut open = Box::pin(self.run_queued(actor, inbox, triple)).await;
        // The queue a resumed run left may have drained: a session its release or policy
        // deletes is due now.
        self.note_retention(actor, triple);
        let idle = self.sessions.limits().idle;
        while open && !self.sessions.is_closing() {
            // Idle (free the memory), told to close or stop, or the channel closed.
            let Some(Msg::Command(cmd)) = inbox.next_or_idle(idle).await else {
                break;
            };
            open = Box::pin(self.answer(actor, inbox, triple, cmd)).await;
            self.note_retention(actor, triple);
        }
    }

    /// The actor of `addr` has ended: the commands that came in meanwhile go to a new one (or
    /// are refused).
    async fn ended(
        self: &Rc<Self>,
        addr: Key,
        triple: &SessionTriple,
        inbox: Rc<Inbox<SessionCommand>>,
    ) {
        let left = self.sessions.ended(&addr, &inbox).await;
        self.drop_hub_if_idle(addr);
        for cmd in left {
            self.dispatch(triple.clone(), cmd);
        }
        // Commands an actor short of descriptors handed back wait for room too.
        self.bound_room_waits();
    }

    /// Opens the session's actor, wired to its hub (appends published once durable, display
    /// deltas passed on); when it cannot be opened, every queued command is answered so.
    async fn open_actor(
        &self,
        triple: &SessionTriple,
        inbox: &Rc<Inbox<SessionCommand>>,
    ) -> Option<Actor> {
        let addr = triple.address().0;
        let hub = self.hub(addr);
        let watch = crate::watch::SessionWatch {
            hub: hub.clone(),
            outcomes: self.outcomes.clone(),
            spans: self.host.traces.clone().map(|t| {
                let spans = broca_otel::SessionSpans::new(triple.address().to_string());
                (t, std::cell::RefCell::new(spans))
            }),
            hints: self.host.step_hints.clone().map(|h| {
                let tail = broca_read::step_events::subject_tail(&h.runner);
                (tail, h)
            }),
            host: self.host.clone(),
            triple: triple.clone(),
            keeper: self.keeper(),
        };
        let opener = SessionActor::opener(
            &self.host.wal_dir,
            triple,
            self.model.clone(),
            self.tools.clone(),
        )
        .tool_specs(self.host.tools.specs())
        .log(broca_crash_points::log_config())
        .committer(self.services.committer.clone())
        .hooks(Rc::new(broca_crash_points::KillPoints))
        .inbox(inbox.clone())
        .keep_entries(self.host.opts.compaction_providers)
        .watch(Rc::new(watch));
        let opened = opener.open().await;
        let e = match opened {
            Ok(actor) => {
                // An open writes its lease record: the file system takes writes.
                self.host.storage.wrote();
                self.supersede(triple, &actor.writer().header().lineage_hex())
                    .await;
                hub.set_watch(actor.writer().watch());
                hub.set_start(actor.writer().next_seq(), actor.writer().log().end());
                return Some(actor);
            }
            Err(e) => e,
        };
        if matches!(e, ActorError::Wal(WalError::OutOfDescriptors { .. })) {
            self.out_of_descriptors_met(triple, &e);
            // Other sessions are open: their descriptors come back as they close. This
            // session's commands wait for that (they go back to the registry as the actor
            // ends) instead of being refused.
            if self.sessions.stats().live > 1 {
                self.sessions.short_of_room(inbox);
                return None;
            }
        } else {
            tracing::error!("session {}: {e}", triple.address());
        }
        let err = if self.host.storage.failed(&e) {
            e.to_rpc_error()
        } else {
            RpcError::new(
                Code::SessionUnavailable,
                format!("the session cannot be opened: {e}"),
            )
        };
        while let Some(msg) = inbox.queued().await {
            if let Msg::Command(cmd) = msg {
                cmd.fail(&err);
            }
        }
        None
    }

    /// A session opened with a record of `lineage` where a tombstone of another stands (a
    /// send after its expiry made it afresh): every shard serves it again before its actor
    /// answers anything.
    async fn supersede(&self, triple: &SessionTriple, lineage: &str) {
        let addr = triple.address().to_string();
        if !crate::retention::local::with(|r| r.superseded_by(&addr, lineage)) {
            return;
        }
        self.host
            .tell_shards(|noted| crate::ShardMsg::Superseded {
                addr: addr.clone(),
                lineage: lineage.to_string(),
                noted,
            })
            .await;
    }

    /// Logs a session that could not open its WAL for want of a descriptor: the first at
    /// once, then, while more meet it, one line per [`SHORT_LOG_EVERY`] with how many (a
    /// daemon out of descriptors meets it at every new session; each waits for another
    /// session to close, or is answered 503 when no other is open).
    fn out_of_descriptors_met(&self, triple: &SessionTriple, e: &ActorError) {
        self.out_of_descriptors
            .set(self.out_of_descriptors.get() + 1);
        if let Some(n) = self.short_unlogged.get() {
            self.short_unlogged.set(Some(n + 1));
            return;
        }
        tracing::error!("session {}: {e}", triple.address());
        self.short_unlogged.set(Some(0));
        let unlogged = self.short_unlogged.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(SHORT_LOG_EVERY).await;
                match unlogged.get() {
                    Some(n) if n > 0 => {
                        tracing::error!(
                            "{n} more sessions could not open their WAL in the last {} s: out \
                             of file descriptors (raise the open-files limit, or lower \
                             open_sessions_max)",
                            SHORT_LOG_EVERY.as_secs()
                        );
                        unlogged.set(Some(0));
                    }
                    _ => {
                        unlogged.set(None);
                        return;
                    }
                }
            }
        })
        .detach();
    }

    /// Stops the shard: no new runs; active runs get the grace period (cut short by a drain's
    /// deadline, `Host::runs_wait_left`); then every session is
    /// told to stop (sealing its run Interrupted) and closed, and what moved on is handed to
    /// the store.
    pub(crate) async fn stop(&self) {
        let began = std::time::Instant::now();
        while self.runs_active.get() > 0 && !self.host.runs_wait_left(began).is_zero() {
            glommio::timer::sleep(GRACE_POLL).await;
        }
        for cmd in self.sessions.shutdown_all() {
            refuse_closing(cmd);
        }
        self.sessions.wait_empty(STOP_CLOSE_MAX).await;
        self.project_dirty();
    }
}

/// The refusal of a command that came while the shard stops.
fn refuse_closing(cmd: SessionCommand) {
    let r = broca_core::admission::Refusal::ShuttingDown;
    cmd.fail(&RpcError::refusal(&r));
}

/// The refusal of a command whose session has [`INBOX_MAX`] commands waiting.
fn inbox_full() -> RpcError {
    RpcError::new(
        Code::SessionQueueFull,
        format!("the session has {INBOX_MAX} commands waiting; retry shortly"),
    )
}
