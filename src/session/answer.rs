//! The one answer to each of a session's commands, whatever state the session is in: its
//! actor idle, or a run of it being driven ([`SessionActor::answer`], with the run's machine),
//! or no actor holding it at all ([`crate::answer_unopened`]). Whoever keeps the actor (a shard
//! of serve, `broca run`) routes commands here and never matches one itself; what it must do
//! once a command is answered comes back as an [`After`].

use futures_channel::oneshot;

use broca_core::admission::{Prepared, Refusal, Unprepared};
use broca_core::machine::{Event, RunMachine};
use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wire::{Caller, CancelAt, RpcError};

use crate::actor::{ActorError, SessionActor};
use crate::command::{Cancelled, ImportInput, ImportReply, Joins, SendReply, SessionCommand};

/// What the actor's keeper does once a command was answered.
#[derive(Debug)]
pub enum After {
    /// Goes on answering the session's commands.
    Serve,
    /// The session moved on outside a run (an import wrote): the store hears of it.
    Moved,
    /// A send admitted a new run: the keeper drives it ([`SessionActor::run_admitted`]), then
    /// the sends queued behind it. Never during a run.
    Run,
    /// The session's WAL failed: the actor closes, and the next command opens it again.
    /// During a run, the run meets the same failure at its next append.
    Close,
    /// Asked to close at rest: the actor closes its WAL, then `true` is answered. Never
    /// during a run (answered `false` then).
    CloseAsked(oneshot::Sender<bool>),
    /// Asked to expire at rest: the keeper's retention decides (a tombstone, then the
    /// deletion). Never during a run (answered `None` then: a session with a run not over
    /// never expires).
    Expire(oneshot::Sender<Option<u64>>),
}

/// A command's reply channel.
type Reply<T> = oneshot::Sender<Result<T, RpcError>>;

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Answers `cmd`, with `run` the machine of the run being driven (`None`: the session is
    /// idle). Every command has this one answer in both states; what differs is only what a
    /// run must hear of it (a steer, a cancel) and what waits for rest (a close, an expiry).
    pub async fn answer(&mut self, cmd: SessionCommand, run: Option<&mut RunMachine>) -> After {
        // A session never written answers as it does with no actor holding it.
        if run.is_none() && self.state.is_new() && crate::unopened::as_never_written(&cmd) {
            return match crate::unopened::never_written(cmd) {
                crate::Unopened::Expire(reply) => After::Expire(reply),
                _ => After::Serve,
            };
        }
        match cmd {
            SessionCommand::Send { admission, reply } => {
                self.answer_send(*admission, reply, run).await
            }
            SessionCommand::Status { run_id, reply } => {
                let _ = reply.send(self.view(run_id.as_deref()));
                After::Serve
            }
            SessionCommand::Cancel {
                run_id,
                at,
                caller,
                reply,
            } => {
                let _ = reply.send(self.cancel(&run_id, at, &caller, run));
                After::Serve
            }
            SessionCommand::Barrier { reply } => {
                let _ = reply.send(self.barrier().await.ok());
                After::Serve
            }
            SessionCommand::Import { input, reply } => {
                self.answer_import(*input, reply, run.map(|m| m.run_id().to_string()))
                    .await
            }
            SessionCommand::Upload { op, caller, reply } => {
                let answer = self.upload(op, &caller).await;
                let failed = matches!(&answer, Err(e) if e.code == broca_wire::Code::Internal);
                let _ = reply.send(answer);
                if failed {
                    After::Close
                } else {
                    After::Serve
                }
            }
            SessionCommand::Expire { reply } if run.is_some() => {
                let _ = reply.send(None);
                After::Serve
            }
            SessionCommand::Expire { reply } => After::Expire(reply),
            SessionCommand::Close { reply } if run.is_some() => {
                let _ = reply.send(false);
                After::Serve
            }
            SessionCommand::Close { reply } => After::CloseAsked(reply),
            recorded => self.answer_recorded(recorded, run).await,
        }
    }

    /// Answers the commands that record (or refuse) the same way whether a run is active:
    /// retractions, releases, late results, person-only commands, changes, adoptions, views.
    async fn answer_recorded(
        &mut self,
        cmd: SessionCommand,
        run: Option<&mut RunMachine>,
    ) -> After {
        use SessionCommand as C;
        match cmd {
            C::Retract {
                submission_id,
                caller,
                reply,
            } => {
                let answer = self.retract_for(&caller, &submission_id, run).await;
                self.replied(answer, reply)
            }
            C::Release { caller, reply } => {
                let answer = self.release_for(&caller).await;
                self.watch.kept(&self.state);
                self.replied(answer, reply)
            }
            C::LateResult { late, reply } => {
                let answer = self.record_late(late).await;
                self.replied(answer, reply)
            }
            C::UserCommand {
                request,
                caller,
                reply,
            } => {
                let answer = self.user_command(&caller, &request).await;
                self.replied(answer, reply)
            }
            C::CommandReplied {
                call_key,
                answer,
                reply,
            } => {
                let answer = self.command_replied(&call_key, answer).await;
                self.replied(answer, reply)
            }
            C::CommandStatus {
                call_key,
                caller,
                reply,
            } => self.replied(self.command_status(&caller, &call_key), reply),
            C::CommandLate {
                call_key,
                entries,
                reply,
            } => {
                let answer = self.command_late(&call_key, entries).await;
                self.replied(answer, reply)
            }
            other => self.answer_changes(other).await,
        }
    }

    /// Answers the commands that change what the session is: refreshes, its host's start,
    /// adoptions, a flushed prefix, a compaction provider's view.
    async fn answer_changes(&mut self, cmd: SessionCommand) -> After {
        use SessionCommand as C;
        match cmd {
            C::Refresh {
                request,
                identity,
                plan,
                caller,
                reply,
            } => {
                let answer = self.refresh(&caller, &request, &identity, plan).await;
                self.replied(answer, reply)
            }
            C::RefreshPolicy {
                request,
                caller,
                reply,
            } => {
                let answer = self.refresh_policy(&caller, &request).await;
                self.replied(answer, reply)
            }
            C::HostStart {
                identity,
                plan,
                caller,
                reply,
            } => {
                let answer = self.host_start(&caller, &identity, plan).await;
                self.replied(answer, reply)
            }
            C::Adopt {
                request,
                identity,
                required,
                caller,
                reply,
            } => {
                let answer = self.adopt(&caller, &request, &identity, required).await;
                self.replied(answer, reply)
            }
            C::FlushPrefix {
                send_id,
                caller,
                reply,
            } => {
                let answer = self.flush_prefix(&caller, &send_id).await;
                self.replied(answer, reply)
            }
            C::ApplyView {
                provider,
                view,
                reply,
            } => {
                let answer = self.apply_view(provider, view).await;
                self.replied(answer, reply)
            }
            other => unreachable!("{} is answered by `answer`", other.name()),
        }
    }

    /// Sends a command's answer: a refusal wrote nothing and keeps the actor; any other
    /// failure is the WAL's, which the watch counts and which closes the actor.
    fn replied<V>(&self, answer: Result<V, ActorError>, reply: Reply<V>) -> After {
        let failed = matches!(&answer, Err(e) if !matches!(e, ActorError::Refused(_)));
        if let (true, Err(e)) = (failed, &answer) {
            self.watch.failed(e);
            tracing::error!("session {}: {e}", self.triple.address());
        }
        let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
        if failed {
            After::Close
        } else {
            After::Serve
        }
    }

    /// A send: refused while the process stops; else admitted. Idle, a new run is the
    /// keeper's to drive ([`After::Run`]); during a run, admission queues, steers, interrupts
    /// or answers a repeat, never a second run, and a steer's or an interrupt's record is
    /// durable before the run hears of it.
    async fn answer_send(
        &mut self,
        admission: Result<Prepared, Unprepared>,
        reply: Reply<SendReply>,
        mut run: Option<&mut RunMachine>,
    ) -> After {
        if self.watch.stopping() {
            let _ = reply.send(Err(RpcError::refusal(&Refusal::ShuttingDown)));
            return After::Serve;
        }
        let idle = run.is_none();
        let answer = self.send_prepared(admission, run.as_deref_mut()).await;
        if let (Some(m), Ok(admitted)) = (run, &answer) {
            let now = crate::now_unix_ms();
            match admitted.joins.clone() {
                Some(Joins::Steer { seq, blocks }) => m.handle(Event::Steer { seq, blocks }, now),
                Some(Joins::Interrupt) => m.handle(Event::Cancel, now),
                Some(Joins::Ordered(waiting)) => m.handle(Event::Ordered(waiting), now),
                None => {}
            }
        }
        let new = matches!(&answer, Ok(r) if idle && !r.existing && r.pending.is_none());
        if new {
            self.watch.wrote();
            // Held while its run is not over.
            self.watch.kept(&self.state);
        }
        match self.replied(answer, reply) {
            After::Serve if new => After::Run,
            after => after,
        }
    }

    /// `run.cancel`: the owner's (or an interrupt-granted plan sender's, at `now`), of the
    /// run being driven only.
    fn cancel(
        &self,
        run_id: &str,
        at: CancelAt,
        caller: &Caller,
        run: Option<&mut RunMachine>,
    ) -> Cancelled {
        let now = matches!(at, CancelAt::Now);
        if !broca_core::admission::may_cancel(caller, &self.state, now) {
            return Cancelled::NotOwner;
        }
        let Some(m) = run.filter(|m| m.run_id() == run_id) else {
            return Cancelled::NotActive;
        };
        let event = match at {
            CancelAt::Now => Event::Cancel,
            CancelAt::StepBoundary => Event::CancelAtStepBoundary,
        };
        m.handle(event, crate::now_unix_ms());
        Cancelled::Ack
    }

    /// An import: refused while run `running` is active; a refused one wrote nothing.
    async fn answer_import(
        &mut self,
        input: ImportInput,
        reply: Reply<ImportReply>,
        running: Option<String>,
    ) -> After {
        if let Some(run_id) = running {
            let busy = crate::import::busy(input.file, &run_id);
            let _ = reply.send(Err(busy.to_rpc_error()));
            return After::Serve;
        }
        let answer = self.import(input, Box::new(|_| {})).await;
        let wrote = matches!(&answer, Ok(r) if !r.existing);
        let refused = matches!(&answer, Err(ActorError::Import(_)));
        if wrote {
            self.watch.wrote();
        }
        if let (false, Err(e)) = (refused, &answer) {
            self.watch.failed(e);
            tracing::error!("session {}: {e}", self.triple.address());
        }
        let failed = answer.is_err() && !refused;
        let _ = reply.send(answer.map_err(|e| e.to_rpc_error()));
        match (failed, wrote) {
            (true, _) => After::Close,
            (false, true) => After::Moved,
            (false, false) => After::Serve,
        }
    }
}
