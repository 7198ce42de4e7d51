//! An open session's runs and the commands it answers while no run is active.

use broca_core::admission::{Prepared, Refusal, Unprepared};
use broca_session::{ActorError, Cancelled, SessionCommand};
use broca_shards::registry::Inbox;
use broca_wal::SessionTriple;
use broca_wire::RpcError;

use crate::sessions::Actor;
use crate::shard::Shard;

impl Shard {
    /// Runs `run` (a resumed or an admitted run) with the session marked busy, then hands
    /// the session to the store.
    pub(crate) async fn running<T>(
        &self,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
        run: impl std::future::Future<Output = T>,
    ) -> T {
        self.runs_active.set(self.runs_active.get() + 1);
        // The store hears of the run at its start too (sessions.list shows it active).
        self.mark_dirty(triple);
        let done = inbox.busy(run).await;
        let active = self.runs_active.get();
        assert!(active > 0, "a run that ends was counted when it began");
        self.runs_active.set(active - 1);
        self.mark_dirty(triple);
        done
    }

    /// Runs the session's queued sends, one after the other, while no run is active (or until
    /// the shard stops); `false` when the actor must close.
    pub(crate) async fn run_queued(
        &self,
        actor: &mut Actor,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
    ) -> bool {
        while !self.sessions.is_closing() && !self.host.is_stopping() {
            match actor.start_queued().await {
                Ok(false) => break,
                Ok(true) => {
                    let done = self.running(inbox, triple, actor.run_admitted()).await;
                    self.mark_moved(triple, actor);
                    if let Err(e) = done {
                        tracing::error!("session {}: {e}", triple.address());
                        return false;
                    }
                }
                Err(e) => {
                    tracing::error!("session {}: starting a queued send: {e}", triple.address());
                    return false;
                }
            }
        }
        true
    }

    /// Answers one command of an idle session (a send's run is driven here); `false` when
    /// the actor must close.
    pub(crate) async fn answer(
        &self,
        actor: &mut Actor,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
        cmd: SessionCommand,
    ) -> bool {
        match cmd {
            SessionCommand::Send { admission, reply } => {
                return self
                    .answer_send(actor, inbox, triple, *admission, reply)
                    .await;
            }
            SessionCommand::Status { run_id, reply } => {
                let _ = reply.send(actor.view(run_id.as_deref()));
            }
            SessionCommand::Cancel {
                caller, reply, at, ..
            } => {
                // No run is active here; the answer is still only for who may cancel.
                let now = matches!(at, broca_wire::CancelAt::Now);
                let answer = if broca_core::admission::may_cancel(&caller, actor.state(), now) {
                    Cancelled::NotActive
                } else {
                    Cancelled::NotOwner
                };
                let _ = reply.send(answer);
            }
            SessionCommand::Retract {
                submission_id,
                caller,
                reply,
            } => {
                let answer = actor.retract_for(&caller, &submission_id, None).await;
                let failed = matches!(&answer, Err(e) if !matches!(e, ActorError::Refused(_)));
                if let Err(e) = &answer {
                    self.host.storage.failed(e);
                }
                let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
                if failed {
                    return false;
                }
            }
            SessionCommand::Release { caller, reply } => {
                let answer = actor.release_for(&caller).await;
                let failed = matches!(&answer, Err(e) if !matches!(e, ActorError::Refused(_)));
                if let Err(e) = &answer {
                    self.host.storage.failed(e);
                }
                self.note_retention(actor, triple);
                let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
                if failed {
                    return false;
                }
            }
            SessionCommand::Barrier { reply } => {
                let _ = reply.send(actor.barrier().await.ok());
            }
            SessionCommand::Import { input, reply } => {
                return self.answer_import(actor, triple, *input, reply).await;
            }
            SessionCommand::LateResult { late, reply } => {
                let answer = actor.record_late(late).await;
                if let Err(e) = &answer {
                    self.host.storage.failed(e);
                }
                let failed = answer.is_err();
                let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
                if failed {
                    return false;
                }
            }
            SessionCommand::UserCommand {
                request,
                caller,
                reply,
            } => {
                let answer = actor.user_command(&caller, &request).await;
                return self.answered(answer, reply);
            }
            SessionCommand::CommandReplied {
                call_key,
                answer,
                reply,
            } => {
                let answer = actor.command_replied(&call_key, answer).await;
                return self.answered(answer, reply);
            }
            SessionCommand::CommandStatus {
                call_key,
                caller,
                reply,
            } => {
                let _ = reply.send(
                    actor
                        .command_status(&caller, &call_key)
                        .map_err(|e| e.to_rpc_error()),
                );
            }
            SessionCommand::CommandLate {
                call_key,
                entries,
                reply,
            } => {
                let answer = actor.command_late(&call_key, entries).await;
                return self.answered(answer, reply);
            }
            SessionCommand::Refresh {
                request,
                identity,
                plan,
                caller,
                reply,
            } => {
                let answer = actor.refresh(&caller, &request, &identity, plan).await;
                return self.answered(answer, reply);
            }
            SessionCommand::RefreshPolicy {
                request,
                caller,
                reply,
            } => {
                let answer = actor.refresh_policy(&caller, &request).await;
                return self.answered(answer, reply);
            }
            SessionCommand::HostStart {
                identity,
                plan,
                caller,
                reply,
            } => {
                let answer = actor.host_start(&caller, &identity, plan).await;
                return self.answered(answer, reply);
            }
            SessionCommand::Adopt {
                request,
                identity,
                required,
                caller,
                reply,
            } => {
                let answer = actor.adopt(&caller, &request, &identity, required).await;
                return self.answered(answer, reply);
            }
            SessionCommand::FlushPrefix {
                send_id,
                caller,
                reply,
            } => {
                let answer = actor.flush_prefix(&caller, &send_id).await;
                return self.answered(answer, reply);
            }
            SessionCommand::ApplyView {
                provider,
                view,
                reply,
            } => {
                let answer = actor.apply_view(provider, view).await;
                return self.answered(answer, reply);
            }
            SessionCommand::Expire { reply } => return self.expire(actor, triple, reply).await,
            // At rest (a queued send would have started): answered once the WAL is closed.
            SessionCommand::Close { reply } => {
                let key = triple.address().0;
                self.close_asked
                    .borrow_mut()
                    .entry(key)
                    .or_default()
                    .push(reply);
                return false;
            }
            SessionCommand::Upload { op, caller, reply } => {
                let answer = actor.upload(op, &caller).await;
                let failed = matches!(&answer, Err(e) if e.code == broca_wire::Code::Internal);
                let _ = reply.send(answer);
                if failed {
                    return false;
                }
            }
        }
        true
    }

    /// A send to an idle session: admitted (its run driven here, then the queued sends), or
    /// refused; `false` when the actor must close.
    async fn answer_send(
        &self,
        actor: &mut Actor,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
        admission: Result<Prepared, Unprepared>,
        reply: Reply<broca_session::SendReply>,
    ) -> bool {
        if self.host.is_stopping() {
            let _ = reply.send(Err(RpcError::refusal(&Refusal::ShuttingDown)));
            return true;
        }
        match actor.send_prepared(admission, None).await {
            Ok(r) => {
                // Held while its run is not over.
                self.note_retention(actor, triple);
                let new = !r.existing && r.pending.is_none();
                if new {
                    self.host.storage.wrote();
                }
                let _ = reply.send(Ok(r));
                if new {
                    let done = self.running(inbox, triple, actor.run_admitted()).await;
                    self.mark_moved(triple, actor);
                    if let Err(e) = done {
                        self.host.storage.failed(&e);
                        tracing::error!("session {}: {e}", triple.address());
                        return false;
                    }
                }
                self.run_queued(actor, inbox, triple).await
            }
            Err(e @ ActorError::Refused(_)) => {
                let _ = reply.send(Err(e.to_rpc_error()));
                true
            }
            Err(e) => {
                self.host.storage.failed(&e);
                tracing::error!("session {}: {e}", triple.address());
                let _ = reply.send(Err(e.to_rpc_error()));
                false
            }
        }
    }

    /// An import into an idle session; `false` when the actor must close.
    async fn answer_import(
        &self,
        actor: &mut Actor,
        triple: &SessionTriple,
        input: broca_session::ImportInput,
        reply: Reply<broca_session::ImportReply>,
    ) -> bool {
        match actor.import(input, Box::new(|_| {})).await {
            Ok(r) => {
                if !r.existing {
                    self.host.storage.wrote();
                    self.mark_moved(triple, actor);
                }
                let _ = reply.send(Ok(r));
                true
            }
            Err(e @ ActorError::Import(_)) => {
                let _ = reply.send(Err(e.to_rpc_error()));
                true
            }
            Err(e) => {
                self.host.storage.failed(&e);
                tracing::error!("session {}: {e}", triple.address());
                let _ = reply.send(Err(e.to_rpc_error()));
                false
            }
        }
    }
}

impl Shard {
    /// Sends a command's answer; `false` (the actor closes) when its WAL failed, which the
    /// storage's health counts. A refusal wrote nothing and keeps the actor.
    fn answered<T>(
        &self,
        answer: Result<T, ActorError>,
        reply: futures_channel::oneshot::Sender<Result<T, RpcError>>,
    ) -> bool {
        let failed = matches!(&answer, Err(e) if !matches!(e, ActorError::Refused(_)));
        if let Err(e) = &answer {
            if failed {
                self.host.storage.failed(e);
            }
        }
        let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
        !failed
    }
}

/// An expiring session: its tombstone, and who waits for its deletion.
pub(crate) struct Expiring {
    pub(crate) stone: crate::retention::Tombstone,
    pub(crate) reply: futures_channel::oneshot::Sender<Option<u64>>,
}

impl Shard {
    /// Tells the host when the session is due, when it has a retention, a storage policy
    /// or a release; one due already is expired at once (after the command in hand).
    pub(crate) fn note_retention(&self, actor: &Actor, triple: &SessionTriple) {
        let state = actor.state();
        let acts = state
            .policy
            .as_ref()
            .is_some_and(broca_core::replay::policy_acts);
        if state.retention.is_none() && !acts && state.released.is_none() {
            return;
        }
        if self
            .host
            .retention
            .note_archive(triple, state.policy.as_ref())
        {
            if let Err(e) = crate::resume::start_archive_scheduler(&self.host) {
                tracing::error!("{e}");
            }
        }
        let expiry = state.expiry();
        if self.host.retention.note(triple, expiry) {
            crate::expiry::wake_sweep(&self.host);
        }
        let key = triple.address().0;
        let Some(due) = expiry.due_at() else {
            self.expire_asked.borrow_mut().remove(&key);
            return;
        };
        let asked = self.expire_asked.borrow_mut().insert(key, due) == Some(due);
        if due <= broca_session::now_unix_ms()
            && !asked
            && !self.expiring.borrow().contains_key(&key)
        {
            let host = self.host.clone();
            let triple = triple.clone();
            glommio::spawn_local(async move {
                host.expire(&triple).await;
            })
            .detach();
        }
    }

    /// Expires the session if it is past its retention: its tombstone durable first, then
    /// `false` closes the actor, after which [`Shard::delete_expired`] deletes it and
    /// answers. A session not expired is answered `None` and stays open.
    async fn expire(
        &self,
        actor: &mut Actor,
        triple: &SessionTriple,
        reply: futures_channel::oneshot::Sender<Option<u64>>,
    ) -> bool {
        let now = broca_session::now_unix_ms();
        let state = actor.state();
        let expiry = state.expiry();
        let deleted = matches!(expiry, broca_core::Expiry::Delete(_));
        let at = match expiry.due_at() {
            Some(at) if at <= now => at,
            _ => {
                if self.host.retention.note(triple, expiry) {
                    crate::expiry::wake_sweep(&self.host);
                }
                let _ = reply.send(None);
                return true;
            }
        };
        let addr = triple.address().to_string();
        let lineage = actor.writer().header().lineage_hex();
        if let Some(stone) = self.host.retention.standing(&addr, &lineage) {
            // Tombstoned before, its deletion not finished: delete it now.
            self.expiring
                .borrow_mut()
                .insert(triple.address().0, Expiring { stone, reply });
            return false;
        }
        let stone = crate::retention::Tombstone {
            history_version: self.host.retention.history_version(&addr),
            address: addr,
            lineage,
            expired_at_ms: at,
            tombstoned_at_ms: now,
            runs: state.runs.iter().map(|r| r.run_id.clone()).collect(),
            deleted,
        };
        let host = self.host.clone();
        let written = {
            let stone = stone.clone();
            broca_io::blocking::run(broca_io::blocking::Kind::Retention, move || {
                host.retention.tombstone(&stone)
            })
            .await
        };
        if let Err(e) = written {
            tracing::error!(
                "session {}: its tombstone cannot be written ({e}); it expires at the next look",
                triple.address()
            );
            let _ = reply.send(None);
            return true;
        }
        let why = if deleted {
            "its storage policy or its release"
        } else {
            "its retention"
        };
        tracing::info!(
            "session {}: due at {at} ({why}); its content is deleted",
            triple.address()
        );
        broca_crash_points::reached("retention_tombstoned");
        self.expiring
            .borrow_mut()
            .insert(triple.address().0, Expiring { stone, reply });
        false
    }

    /// Deletes an expired session once its actor has closed, then answers its expiry. A
    /// deletion that fails is logged and done again at the next start.
    pub(crate) async fn delete_expired(&self, triple: &SessionTriple, expiring: Expiring) {
        let Expiring { stone, reply } = expiring;
        let host = self.host.clone();
        let at = stone.expired_at_ms;
        let deleted = broca_io::blocking::run(broca_io::blocking::Kind::Retention, move || {
            host.retention
                .delete(&stone, host.store.as_deref(), &host.reads)
        })
        .await;
        if let Err(e) = deleted {
            tracing::error!(
                "session {}: deleting its expired content: {e} (done again at the next start)",
                triple.address()
            );
        }
        let _ = reply.send(Some(at));
    }
}

/// A command's reply channel.
type Reply<T> = futures_channel::oneshot::Sender<Result<T, RpcError>>;
