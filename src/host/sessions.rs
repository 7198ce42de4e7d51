//! A shard's sessions: an actor per live session in the shard's registry, started on the
//! first command for it (opening its WAL under the lease and resuming a run a crash left
//! open) and closed after it has been idle for a while or to make room, so an idle session
//! costs no memory; the next command rebuilds it from the WAL. A command for a session no
//! actor holds that needs no actor (a status, a cancel of nothing) is answered from its WAL.

use std::rc::Rc;
use std::time::Duration;

use broca_session::{ActorError, Cancelled, Retracted, SessionActor, SessionCommand};
use broca_shards::registry::{Inbox, Msg, Refused};
use broca_wal::{SessionTriple, WalError};
use broca_wire::{Code, RpcError};

use crate::shard::{Key, Shard, INBOX_MAX};

/// A shard's session actor.
pub(crate) type Actor =
    SessionActor<broca_provider::transport::HttpModelClient, broca_tools::Tools>;

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

    /// Answers what a session no actor holds needs no actor for; `Some` hands back a command
    /// its actor must answer (started for it).
    fn without_actor(&self, triple: &SessionTriple, cmd: SessionCommand) -> Option<SessionCommand> {
        let wal = broca_wal_writer::wal_path(&self.host.wal_dir, triple);
        if let SessionCommand::Status { run_id, reply } = cmd {
            glommio::spawn_local(crate::unopened::view_from_wal(wal, run_id, reply)).detach();
            return None;
        }
        let writes = matches!(&cmd, SessionCommand::Send { admission, .. } if admission.is_ok())
            || matches!(&cmd, SessionCommand::Import { .. })
            || matches!(&cmd, SessionCommand::HostStart { plan: Some(_), .. });
        if writes || broca_wal::archive::exists(&wal) {
            return Some(cmd);
        }
        // Nothing was ever sent to this session: answer without creating its WAL (a refused
        // send's send_id names no run here either).
        match cmd {
            SessionCommand::Cancel { reply, .. } => drop(reply.send(Cancelled::NotActive)),
            SessionCommand::Retract { reply, .. } => drop(reply.send(Ok(Retracted::NotPending))),
            SessionCommand::Release { reply, .. } => {
                drop(reply.send(Ok(broca_session::Release::Absent)))
            }
            SessionCommand::Barrier { reply } => drop(reply.send(None)),
            SessionCommand::Send { admission, reply } => {
                if let Err(u) = *admission {
                    drop(reply.send(Err(RpcError::refusal(&u.refusal))));
                }
            }
            // There are no uploads into a session never written (llm-runner/v1 §9.12).
            SessionCommand::Upload { op, reply, .. } => drop(reply.send(no_session_upload(&op))),
            // Nor calls a late result could settle.
            SessionCommand::LateResult { reply, .. } => {
                drop(reply.send(Ok(broca_tools::late::LateRecorded::NotAwaited)))
            }
            // No plan was ever frozen here, so no command either.
            SessionCommand::UserCommand { request, reply, .. } => drop(reply.send(Err(
                RpcError::refusal(&broca_core::Refusal::UnknownUserCommand {
                    command: request.command.clone(),
                }),
            ))),
            SessionCommand::CommandReplied { reply, .. } => drop(reply.send(Err(
                RpcError::refusal(&broca_core::Refusal::UnknownInvocation),
            ))),
            SessionCommand::CommandStatus { reply, .. } => drop(reply.send(Err(
                RpcError::refusal(&broca_core::Refusal::UnknownInvocation),
            ))),
            SessionCommand::CommandLate { reply, .. } => drop(reply.send(Ok(false))),
            // A change needs a session to change: nothing was ever sent here.
            SessionCommand::Refresh { reply, .. } => drop(reply.send(Err(not_yet()))),
            // A new session: what its host's start comes to (its plan is fetched next), and
            // an adoption's refusal (no plan was applied here).
            SessionCommand::HostStart {
                identity,
                caller,
                reply,
                ..
            } => {
                let fresh = broca_core::Session::default();
                let step = broca_core::adopt::host_start(&fresh, &caller, &identity);
                drop(reply.send(step.map_err(|r| RpcError::refusal(&r))))
            }
            SessionCommand::Adopt {
                request,
                identity,
                required,
                caller,
                reply,
            } => {
                let fresh = broca_core::Session::default();
                let answer =
                    broca_core::adopt::adopt(&fresh, &caller, &request, &identity, required, 0)
                        .and_then(|(record, answer)| match record {
                            None => Ok(answer),
                            // No plan was applied here: an adoption always drifts.
                            Some(_) => Err(broca_core::Refusal::PlanDrift {
                                frozen: None,
                                sent: identity.clone(),
                            }),
                        });
                drop(reply.send(answer.map_err(|r| RpcError::refusal(&r))))
            }
            SessionCommand::RefreshPolicy { reply, .. }
            | SessionCommand::FlushPrefix { reply, .. } => drop(reply.send(Err(not_yet()))),
            // No session, so no provider to hand a view over.
            SessionCommand::ApplyView { reply, .. } => drop(reply.send(Err(not_yet()))),
            // Nothing to expire: expired already (and deleted), or never written.
            SessionCommand::Expire { reply } => {
                let addr = triple.address().to_string();
                let _ = reply.send(self.host.retention.expired_at(&addr));
            }
            // No actor holds its WAL.
            SessionCommand::Close { reply } => drop(reply.send(true)),
            SessionCommand::Status { .. } | SessionCommand::Import { .. } => {
                unreachable!("answered above")
            }
        }
        None
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
                "waited {:.0} s for one of the {} sessions this shard keeps open to finish                  its run and close; retry later (raise open_sessions_max, the open-files                  limit or wait_for_room_secs)",
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
        let (on_append, on_display) = (hub.clone(), hub.clone());
        let outcomes = self.outcomes.clone();
        // The session's spans, built from its records as they are appended.
        let mut spans = self.host.traces.clone().map(|t| {
            (
                t,
                broca_otel::SessionSpans::new(triple.address().to_string()),
            )
        });
        let mut opener = SessionActor::opener(
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
        .on_append(Box::new(move |seq, end, record| {
            outcomes.record(record);
            if let Some((traces, spans)) = &mut spans {
                let done = spans.observe(record);
                if !done.is_empty() {
                    traces.offer(done);
                }
            }
            on_append.on_append(seq, end, record)
        }))
        .display(Box::new(move |text| on_display.display(text)));
        if let Some(hints) = &self.host.step_hints {
            // Each model attempt's hint goes to the bus once its record is durable.
            let (hub, hints) = (hub.clone(), hints.clone());
            let tail = broca_core::step_events::subject_tail(&hints.runner);
            opener = opener.on_step(
                hints.runner.clone(),
                Box::new(move |end, event| {
                    let body = serde_json::to_vec(&event).expect("a step hint serializes");
                    let (publisher, tail) = (hints.publisher.clone(), tail.clone());
                    hub.when_durable(end, move || {
                        publisher.publish(tail, body);
                    });
                }),
            );
        }
        let opened = opener.open().await;
        let e = match opened {
            Ok(actor) => {
                // An open writes its lease record: the file system takes writes.
                self.host.storage.wrote();
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

/// What an upload operation on a session never written answers: its status `gone`, a begin
/// `unknown_session`, anything else `unknown_upload`.
fn no_session_upload(
    op: &broca_wire::request::uploads::UploadOp,
) -> Result<serde_json::Value, RpcError> {
    use broca_wire::request::uploads::UploadOp;
    match op {
        UploadOp::Status { .. } => Ok(serde_json::json!({"state": "gone", "received": 0})),
        UploadOp::Begin { .. }
        | UploadOp::Refused {
            method: broca_wire::Method::UploadBegin,
            ..
        } => Err(RpcError::new(
            Code::UnknownSession,
            "this session was never written; an upload goes into an existing session",
        )),
        UploadOp::Refused { error, .. } => Err(error.clone()),
        other => Err(RpcError::new(
            Code::UnknownUpload,
            format!(
                "no upload `{}` in this session",
                other.upload_id().unwrap_or_default().escape_debug()
            ),
        )),
    }
}

/// A change op on a session nothing was ever sent to.
fn not_yet() -> RpcError {
    RpcError::new(
        broca_wire::Code::UnknownSession,
        "nothing was sent to this session yet; a change applies to a session's plan",
    )
}
