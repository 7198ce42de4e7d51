//! An open session's runs and the commands it answers while no run is active.

use broca_session::{After, SessionCommand};
use broca_shards::registry::Inbox;
use broca_wal::SessionTriple;

use crate::shard::{Actor, Expiring, Shard};

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

    /// Has the session's actor answer one command while no run is active, then does what
    /// its answer asks of the shard: a new run driven (then the queued sends), the store told
    /// of an import, a close or an expiry at rest; `false` when the actor must close.
    pub(crate) async fn answer(
        &self,
        actor: &mut Actor,
        inbox: &Inbox<SessionCommand>,
        triple: &SessionTriple,
        cmd: SessionCommand,
    ) -> bool {
        match actor.answer(cmd, None).await {
            After::Serve => true,
            After::Moved => {
                self.mark_moved(triple, actor);
                true
            }
            After::Run => {
                // Held while its run is not over.
                self.note_retention(actor, triple);
                let done = self.running(inbox, triple, actor.run_admitted()).await;
                self.mark_moved(triple, actor);
                if let Err(e) = done {
                    self.host.storage.failed(&e);
                    tracing::error!("session {}: {e}", triple.address());
                    return false;
                }
                self.run_queued(actor, inbox, triple).await
            }
            After::Close => false,
            // At rest (a queued send would have started): answered once the WAL is closed.
            After::CloseAsked(reply) => {
                let key = triple.address().0;
                self.close_asked
                    .borrow_mut()
                    .entry(key)
                    .or_default()
                    .push(reply);
                false
            }
            After::Expire(reply) => self.expire(actor, triple, reply).await,
        }
    }
}

impl Shard {
    /// Tells the host when the session is due, when it has a retention, a storage policy
    /// or a release; one due already is expired at once (after the command in hand).
    pub(crate) fn note_retention(&self, actor: &Actor, triple: &SessionTriple) {
        let state = actor.state();
        if !self.keeper().note(triple, state) {
            return;
        }
        let expiry = state.expiry();
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
                self.keeper().note_due(triple, expiry);
                let _ = reply.send(None);
                return true;
            }
        };
        let addr = triple.address().to_string();
        let lineage = actor.writer().header().lineage_hex();
        if let Some(stone) = crate::retention::local::with(|r| r.standing(&addr, &lineage)) {
            // Tombstoned before, its deletion not finished: delete it now.
            self.expiring
                .borrow_mut()
                .insert(triple.address().0, Expiring { stone, reply });
            return false;
        }
        let stone = crate::retention::Tombstone {
            history_version: crate::retention::local::with(|r| r.history_version(&addr)),
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
        // Every shard keeps the tombstone before the deletion starts: a request of the
        // session on any shard answers `expired` from here on.
        self.host
            .tell_shards(|kept| crate::ShardMsg::Tomb {
                stone: stone.clone(),
                kept,
            })
            .await;
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
        let addr = stone.address.clone();
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
        crate::retention::local::with(|r| r.forget(&addr));
        self.keeper().publish();
        let _ = reply.send(Some(at));
    }
}

impl Shard {
    /// This shard's keeper of its sessions' retention.
    pub(crate) fn keeper(&self) -> Keeper {
        Keeper {
            host: self.host.clone(),
            shard: self.services.shard,
            stopped: self.stopped.clone(),
            sweeping: self.sweeping.clone(),
        }
    }

    /// Seeds this shard's part of retention from what the state dir held at start (the
    /// tombstones, and its own sessions' due times and policies), and starts its look.
    pub(crate) fn seed_retention(&self) {
        let me = self.services.shard;
        let host = &self.host;
        let seeded =
            crate::retention::local::ShardRetention::seeded(host.retention.loaded(), |t| {
                host.shard_of(t) == me
            });
        crate::retention::local::with(|r| *r = seeded);
        self.keeper().publish();
        crate::expiry::sweep(&self.host, self.stopped.clone(), self.sweeping.clone());
    }
}

/// What notes a shard's sessions' retention in its own part ([`crate::retention::local`]):
/// when each is due (its look started with the first, the host told the shard's earliest due
/// time), and which its policy has the archive pack. Held by the shard and by each session's
/// watch, which notes a release or a send's run before its answer leaves.
#[derive(Clone)]
pub(crate) struct Keeper {
    host: std::sync::Arc<crate::Host>,
    shard: usize,
    stopped: std::rc::Rc<broca_shards::timer::StopSignal>,
    sweeping: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Keeper {
    /// Notes the session `triple` as `state` has it now; `false` when nothing keeps it (no
    /// retention, no policy that acts, no release).
    pub(crate) fn note(&self, triple: &SessionTriple, state: &broca_core::Session) -> bool {
        let acts = state
            .policy
            .as_ref()
            .is_some_and(broca_core::replay::policy_acts);
        if state.retention.is_none() && !acts && state.released.is_none() {
            return false;
        }
        let days = state.policy.as_ref().map_or(0, |p| p.archive_after_days);
        if crate::retention::local::with(|r| r.note_archive(triple, days)) {
            if let Err(e) = crate::resume::start_archive_scheduler(&self.host, true) {
                tracing::error!("{e}");
            }
        }
        self.note_due(triple, state.expiry());
        true
    }

    /// Notes when the session `triple` is due; the shard's look starts with its first.
    pub(crate) fn note_due(&self, triple: &SessionTriple, expiry: broca_core::Expiry) {
        if crate::retention::local::with(|r| r.note(triple, expiry)) {
            crate::expiry::sweep(&self.host, self.stopped.clone(), self.sweeping.clone());
        }
        self.publish();
    }

    /// Tells the host the earliest time one of the shard's sessions is due.
    pub(crate) fn publish(&self) {
        let at = crate::retention::local::with(|r| r.earliest_due());
        self.host.retention.set_earliest_due(self.shard, at);
    }
}
