//! One shard's life: its services, its sessions (a registry of session actors,
//! `crate::sessions`), its subscribers' hubs, its part of the front, and the mesh messages it
//! answers until every shard has stopped.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use broca_io::net::ClientConfig;
use futures_channel::{mpsc, oneshot};

use broca_session::hub::{Hub, SeekPoints, SubFrom, SubItem};
use broca_session::SessionCommand;
use broca_shards::registry::{Limits, Registry};
use broca_shards::services::Services;
use broca_shards::timer::{every, StopSignal};
use broca_tools::{Router, Tools};
use broca_transport::HttpModelClient;
use broca_wal::SessionTriple;

use crate::metrics::ShardStats;
use crate::{Host, Running, ShardFront, ShardMsg};

/// Commands that may wait for one session's actor.
pub(crate) const INBOX_MAX: usize = 256;
/// Commands a shard keeps waiting for room (every open session running, or descriptors
/// short) before it refuses a new session's command 503 `session_limit`.
pub(crate) const WAITING_FOR_ROOM_MAX: usize = 65_536;
/// Runs a shard resumes at once (a crash can leave thousands open: they resume in turn).
pub(crate) const RESUMES_AT_ONCE: usize = 16;
/// Sessions whose seek points a shard keeps once their hub is gone (8 points of 16 bytes each).
const SEEK_SESSIONS_MAX: usize = 16_384;
/// How often a shard hands its sessions that moved on to the store.
const PROJECT_EVERY: Duration = Duration::from_millis(100);

/// A session's key on its shard: its address.
pub(crate) type Key = [u8; 16];

/// A shard's session actor.
pub(crate) type Actor =
    broca_session::SessionActor<broca_transport::HttpModelClient, broca_tools::Tools>;

/// An expiring session: its tombstone, and who waits for its deletion.
pub(crate) struct Expiring {
    pub(crate) stone: crate::retention::Tombstone,
    pub(crate) reply: futures_channel::oneshot::Sender<Option<u64>>,
}

/// One shard: its services, its sessions and everything that serves them.
pub(crate) struct Shard {
    pub(crate) host: Arc<Host>,
    pub(crate) services: Services,
    /// The session actors, by address.
    pub(crate) sessions: Registry<Key, SessionCommand>,
    pub(crate) model: Rc<HttpModelClient>,
    pub(crate) tools: Rc<Tools>,
    pub(crate) runs_active: Cell<usize>,
    /// Runs ended and calls answered, by how.
    pub(crate) outcomes: Rc<crate::metrics::Outcomes>,
    hubs: RefCell<HashMap<Key, Rc<Hub>>>,
    /// Seek points of sessions whose hub is gone (see [`Hub::take_seeks`]).
    seeks: RefCell<HashMap<Key, SeekPoints>>,
    /// A task hands back the commands that waited for room too long (armed while any wait).
    pub(crate) room_sweep: Cell<bool>,
    /// Sessions whose WAL moved on since the store last projected them, with the messages
    /// their actors hold once a run ended (the store's thread shares them; see
    /// [`broca_store::Moved`]).
    dirty: RefCell<HashMap<SessionTriple, Vec<Arc<broca_protocol::Message>>>>,
    /// A hand-off to the store is due ([`PROJECT_EVERY`] after the first session marked
    /// since the last one): an idle shard has none, and no timer wakes it.
    project_armed: Cell<bool>,
    /// Tells the shard's hand-off task that a hand-off is due.
    project_wake: glommio::channels::local_channel::LocalSender<()>,
    project_woken: RefCell<Option<glommio::channels::local_channel::LocalReceiver<()>>>,
    /// This shard's part of the front, once started.
    front: RefCell<Option<Box<dyn Running>>>,
    projector_full: Cell<u64>,
    /// Sessions that could not open their WAL for want of a descriptor, and those not yet
    /// logged while a report window is open (`None`: none is).
    pub(crate) out_of_descriptors: Cell<u64>,
    pub(crate) short_unlogged: Rc<Cell<Option<u64>>>,
    /// Runs being resumed at once (each holds a permit while its model is called).
    pub(crate) resumes: glommio::sync::Semaphore,
    /// Set when the shard stops: its periodic tasks end.
    pub(crate) stopped: Rc<StopSignal>,
    /// Sessions whose tombstone is written and whose actor is closing: deleted once it has
    /// closed, then the expiry is answered.
    pub(crate) expiring: RefCell<HashMap<Key, Expiring>>,
    /// The due time each session was last asked to expire at as its actor noted it (one ask
    /// per due time: a failed one is tried again by shard 0's look).
    pub(crate) expire_asked: RefCell<HashMap<Key, u64>>,
    /// The sessions asked to close at rest (`SessionCommand::Close`): answered once closed.
    pub(crate) close_asked: RefCell<HashMap<Key, Vec<futures_channel::oneshot::Sender<bool>>>>,
    /// Its look for its sessions past their retention is running.
    pub(crate) sweeping: Rc<Cell<bool>>,
}

impl Shard {
    fn new(shard: usize, host: Arc<Host>) -> Shard {
        let services = Services::new(
            shard,
            ClientConfig::new(host.tls.clone(), host.proxy.clone()),
        );
        let model = Rc::new(HttpModelClient::new(
            services.http.clone(),
            host.opts.endpoints.clone(),
            Box::new(host.secrets()),
        ));
        let limits = Limits {
            open_max: host.opts.open_sessions_max.unwrap_or(4096).max(1),
            waiting_max: WAITING_FOR_ROOM_MAX,
            inbox_max: INBOX_MAX,
            idle: host.opts.idle,
        };
        let (project_wake, project_woken) = glommio::channels::local_channel::new_bounded(1);
        let tools = Rc::new(Tools {
            mcp: Router::new(
                host.tools.clone(),
                broca_tools::tool_http_client(host.tls.clone(), host.proxy.clone()),
            ),
            modules: host.module_tools.clone(),
        });
        Shard {
            services,
            sessions: Registry::new(limits),
            model,
            tools,
            runs_active: Cell::new(0),
            outcomes: Rc::default(),
            hubs: RefCell::new(HashMap::new()),
            seeks: RefCell::new(HashMap::new()),
            dirty: RefCell::new(HashMap::new()),
            project_armed: Cell::new(false),
            project_wake,
            project_woken: RefCell::new(Some(project_woken)),
            front: RefCell::new(None),
            projector_full: Cell::new(0),
            out_of_descriptors: Cell::new(0),
            short_unlogged: Rc::new(Cell::new(None)),
            resumes: glommio::sync::Semaphore::new(RESUMES_AT_ONCE as u64),
            stopped: Rc::new(StopSignal::default()),
            expiring: RefCell::default(),
            expire_asked: RefCell::default(),
            close_asked: RefCell::default(),
            sweeping: Rc::default(),
            room_sweep: Cell::new(false),
            host,
        }
    }

    /// The session's hub, made on first use (with the seek points a former hub kept).
    pub(crate) fn hub(&self, addr: Key) -> Rc<Hub> {
        self.hubs
            .borrow_mut()
            .entry(addr)
            .or_insert_with(|| {
                let hub = Rc::new(Hub::default());
                if let Some(seeks) = self.seeks.borrow_mut().remove(&addr) {
                    hub.restore_seeks(seeks);
                }
                hub
            })
            .clone()
    }

    /// Drops the session's hub once nobody subscribes and no actor is open, keeping its seek
    /// points (a bounded number of sessions' worth): a subscriber that reconnects after the
    /// session went idle still starts near its cursor.
    pub(crate) fn drop_hub_if_idle(&self, addr: Key) {
        let mut hubs = self.hubs.borrow_mut();
        let idle = hubs.get(&addr).is_some_and(|h| h.is_idle());
        if !idle || self.sessions.is_live(&addr) {
            return;
        }
        let Some(hub) = hubs.remove(&addr) else {
            return;
        };
        let mut seeks = self.seeks.borrow_mut();
        if seeks.len() >= SEEK_SESSIONS_MAX {
            if let Some(&any) = seeks.keys().next() {
                seeks.remove(&any);
            }
        }
        seeks.insert(addr, hub.take_seeks());
        assert!(seeks.len() <= SEEK_SESSIONS_MAX);
    }

    async fn subscribe(
        self: Rc<Self>,
        triple: SessionTriple,
        from: SubFrom,
        tx: mpsc::Sender<SubItem>,
        gone: oneshot::Receiver<()>,
    ) {
        let addr = triple.address().0;
        let hub = self.hub(addr);
        let live = self.sessions.is_live(&addr);
        let shard = self.clone();
        let t = triple.clone();
        let barrier = async move {
            if !live {
                return None;
            }
            let (reply, wait) = oneshot::channel();
            shard.dispatch(t, SessionCommand::Barrier { reply });
            wait.await.ok().flatten()
        };
        let wal = broca_wal_writer::wal_path(&self.host.wal_dir, &triple);
        broca_session::subscribe(hub, wal, from, barrier, tx, gone).await;
        self.drop_hub_if_idle(addr);
    }

    fn stats(&self) -> ShardStats {
        let h = self.services.http.stats();
        let (accept_wakes, accept_errors, accept_shed) = self
            .front
            .borrow()
            .as_ref()
            .map_or((0, 0, 0), |f| f.counts());
        let sessions = self.sessions.stats();
        ShardStats {
            shard: self.services.shard,
            sessions_live: sessions.live,
            sessions_evicted: sessions.evicted,
            sessions_refused_at_limit: sessions.refused_at_limit,
            sessions_waited_for_room: sessions.waited_for_room,
            sessions_waiting_for_room: sessions.waiting_for_room,
            sessions_waited_too_long: sessions.waited_too_long,
            runs_active: self.runs_active.get(),
            commit: self.services.committer.stats(),
            provider_bytes_in: h.bytes_in,
            provider_bytes_out: h.bytes_out,
            provider_connects: h.connects,
            render_prefix: broca_provider::prefix::stats(),
            model_errors: self.model.errors().snapshot(),
            accept_wakes,
            accept_errors,
            accept_shed,
            inbox_full: sessions.inbox_full,
            projector_full: self.projector_full.get(),
            out_of_descriptors: self.out_of_descriptors.get(),
            commands_waiting: sessions.waiting,
            egress: self.services.http.origin_stats(),
            ..ShardStats::default()
        }
        .with_outcomes(&self.outcomes)
    }

    /// The last seq appended in this process to each of `addrs` this shard has a hub or
    /// kept seek points for.
    fn heads(&self, addrs: &[Key]) -> Vec<(Key, u64)> {
        let (hubs, seeks) = (self.hubs.borrow(), self.seeks.borrow());
        addrs
            .iter()
            .filter_map(|a| {
                let last = match hubs.get(a) {
                    Some(hub) => hub.last_seq(),
                    None => seeks.get(a).and_then(|s| s.last_seq()),
                };
                last.map(|seq| (*a, seq))
            })
            .collect()
    }

    /// Answers one mesh message; `false` once the shard's loop is to end.
    fn on_message(self: &Rc<Self>, msg: ShardMsg) -> bool {
        match msg {
            ShardMsg::Session { triple, cmd } => self.dispatch(triple, cmd),
            ShardMsg::Stats(reply) => drop(reply.send(self.stats())),
            ShardMsg::Heads(addrs, reply) => drop(reply.send(self.heads(&addrs))),
            ShardMsg::Subscribe {
                triple,
                from,
                tx,
                gone,
            } => {
                let me = self.clone();
                glommio::spawn_local(me.subscribe(triple, from, tx, gone)).detach();
            }
            // Shard 0 turns a signal into a stop of every shard; connections are served
            // (sends refused) until every shard has stopped.
            ShardMsg::Signal => {
                glommio::spawn_local(stop_every_shard(self.clone())).detach();
            }
            ShardMsg::End => return false,
            ShardMsg::Tomb { stone, kept } => {
                crate::retention::local::with(|r| r.put(stone, false));
                let _ = kept.send(());
            }
            ShardMsg::Superseded {
                addr,
                lineage,
                noted,
            } => {
                crate::retention::local::with(|r| r.supersede(&addr, &lineage));
                let _ = noted.send(());
            }
            ShardMsg::Archived(reply) => {
                let _ = reply.send(crate::retention::local::with(|r| r.archived()));
            }
            ShardMsg::Resume { triple } => self.resume(triple),
            ShardMsg::Stop(done) => {
                let me = self.clone();
                glommio::spawn_local(async move {
                    me.stop().await;
                    let _ = done.send(());
                })
                .detach();
            }
        }
        true
    }

    /// Starts what runs beside the sessions: the hand-off to the store, the catalog's
    /// refresh (shard 0), and the warming of the device cache.
    async fn start_background(self: &Rc<Self>) {
        let host = &self.host;
        let probe = format!(".device-probe-{}", self.services.shard);
        if let Err(e) = broca_io::log::warm_device_cache(&host.wal_dir, &probe).await {
            let dir = host.wal_dir.display();
            tracing::warn!("{dir}: opening a probe file with O_DIRECT: {e}");
        }
        if let (Some(_), Some(woken)) = (&host.projector, self.project_woken.take()) {
            // Woken by the first session marked since the last hand-off, it hands the batch
            // over PROJECT_EVERY later: sessions marked meanwhile ride along, and an idle
            // shard sleeps.
            let me = self.clone();
            let stop = self.stopped.clone();
            glommio::spawn_local(async move {
                while stop.or_stop(woken.recv()).await.flatten().is_some() {
                    if stop
                        .or_stop(glommio::timer::sleep(PROJECT_EVERY))
                        .await
                        .is_none()
                    {
                        return;
                    }
                    me.project_armed.set(false);
                    me.project_dirty();
                }
            })
            .detach();
        }
        let catalog = &host.opts.catalog;
        let refresh = host.opts.catalog_refresh;
        // A catalog service, a file or the daemon's catalog module: each can change while
        // broca serves (a module's answer of the version read last is not read again).
        let refreshed = catalog.url.is_some() || catalog.file.is_some() || catalog.module.is_some();
        self.pick_up_tool_modules();
        self.sweep_late_results();
        self.seed_retention();
        if self.services.shard == 0 && !refresh.is_zero() && refreshed {
            let me = self.clone();
            every(refresh, self.stopped.clone(), move || {
                let me = me.clone();
                async move {
                    me.refresh_catalog().await;
                    true
                }
            });
        }
    }

    /// Module mode, shard 0: the tool modules that did not answer at start are asked again
    /// every `module_retry` until each has; a module's tools are offered from its answer on,
    /// to every send admitted after it (a run already admitted keeps the tools it froze).
    fn pick_up_tool_modules(&self) {
        let host = &self.host;
        let (Some(modules), Some(cfg)) = (host.module_tools.clone(), host.opts.tools.as_ref())
        else {
            return;
        };
        let missing = || {
            host.tool_modules_missing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        };
        if self.services.shard != 0 || missing().is_empty() {
            return;
        }
        let host = host.clone();
        every(cfg.module_retry, self.stopped.clone(), move || {
            let (host, modules) = (host.clone(), modules.clone());
            async move {
                let waiting = host
                    .tool_modules_missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                for module in waiting {
                    let Ok(specs) = modules.catalog_of(&module).await else {
                        continue;
                    };
                    for p in host.tools.add(specs) {
                        tracing::error!("{p}; its tools are not offered");
                    }
                    tracing::info!(module = %module, "tool module up after broca started: its tools are offered");
                    host.tool_modules_missing
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .retain(|m| *m != module);
                }
                !host
                    .tool_modules_missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty()
            }
        });
    }

    /// Module mode, shard 0: the late results of the tool modules that serve them are read at
    /// start and every `late_poll` (those no call waits for are recorded in their sessions).
    fn sweep_late_results(&self) {
        let host = &self.host;
        let (Some(modules), Some(cfg)) = (host.module_tools.clone(), host.opts.tools.as_ref())
        else {
            return;
        };
        if self.services.shard != 0 || cfg.modules.is_empty() {
            return;
        }
        let first = modules.clone();
        glommio::spawn_local(async move { first.sweep_late().await }).detach();
        every(cfg.late_poll, self.stopped.clone(), move || {
            let modules = modules.clone();
            async move {
                modules.sweep_late().await;
                true
            }
        });
    }

    /// Assembles the catalog again (shard 0): its service asked, its file read, the last good
    /// copies kept as at start. Admission resolves in the new one; a run already admitted
    /// uses the entry it froze.
    async fn refresh_catalog(&self) {
        let host = &self.host;
        let modules = host.module_tools.as_deref();
        let (catalog, notes) =
            crate::start::load(&host.opts.catalog, &self.services.http, modules).await;
        for n in notes {
            tracing::warn!("catalog refresh: {n}");
        }
        broca_catalog::install(catalog);
    }

    /// Marks the session as moved on: the store's thread gets it with the next hand-off,
    /// which this arms when none is due.
    pub(crate) fn mark_dirty(&self, triple: &SessionTriple) {
        self.dirty.borrow_mut().entry(triple.clone()).or_default();
        if self.host.projector.is_some() && !self.project_armed.replace(true) {
            // Bounded by one: a wake already waiting says the same.
            let _ = self.project_wake.try_send(());
        }
    }

    /// Marks the session as moved on, and hands the store's thread the messages its actor
    /// holds with it: its follower keeps these copies instead of its own where they are
    /// equal, so the conversation is in memory once.
    pub(crate) fn mark_moved(&self, triple: &SessionTriple, actor: &Actor) {
        self.mark_dirty(triple);
        if let Some(held) = self.dirty.borrow_mut().get_mut(triple) {
            held.clone_from(&actor.state().transcript);
        }
    }

    /// Hands this shard's sessions that moved on to the store's thread, one batch.
    pub(crate) fn project_dirty(&self) {
        let batch: Vec<_> = self.dirty.borrow_mut().drain().collect();
        let Some(tx) = &self.host.projector else {
            return;
        };
        if batch.is_empty() {
            return;
        }
        let wal_dir = &self.host.wal_dir;
        let moved: Vec<_> = batch
            .iter()
            .map(|(t, messages)| broca_store::Moved {
                path: broca_wal_writer::wal_path(wal_dir, t),
                messages: messages.clone(),
            })
            .collect();
        // Counted before the send: the store's thread counts it off when it takes it.
        crate::start::STORE_QUEUE.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let sent = tx.lock().unwrap_or_else(|e| e.into_inner()).try_send(moved);
        if sent.is_err() {
            crate::start::STORE_QUEUE.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        if let Err(std::sync::mpsc::TrySendError::Full(_)) = sent {
            // The store is behind: these sessions go with the next batch.
            self.projector_full.set(self.projector_full.get() + 1);
            let mut dirty = self.dirty.borrow_mut();
            for (t, messages) in batch {
                dirty.entry(t).or_insert(messages);
            }
            drop(dirty);
            if !self.project_armed.replace(true) {
                let _ = self.project_wake.try_send(());
            }
        }
    }
}

/// What runs once every shard has started its part of the front (serve.json and the ready
/// line): run by the last shard to arrive. A failure stops the daemon.
pub(crate) struct StartGate {
    left: std::sync::atomic::AtomicUsize,
    then: std::sync::Mutex<Option<Box<dyn FnOnce() -> Result<(), crate::StartError> + Send>>>,
}

impl StartGate {
    pub(crate) fn new(
        shards: usize,
        then: Box<dyn FnOnce() -> Result<(), crate::StartError> + Send>,
    ) -> StartGate {
        StartGate {
            left: std::sync::atomic::AtomicUsize::new(shards),
            then: std::sync::Mutex::new(Some(then)),
        }
    }

    /// A shard has started; the last one runs what waited for them all.
    fn arrived(&self) -> Result<(), crate::StartError> {
        use std::sync::atomic::Ordering;
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return Ok(());
        }
        let then = self.then.lock().unwrap_or_else(|e| e.into_inner()).take();
        then.map_or(Ok(()), |f| f())
    }
}

/// A shard's life: start its front's part and its background, serve the mesh, stop when
/// told.
pub(crate) async fn shard_main(
    shard: usize,
    host: Arc<Host>,
    mut rx: broca_shards::mesh::Inbound<ShardMsg>,
    front: Option<Box<dyn ShardFront>>,
    gate: Arc<StartGate>,
) -> Result<(), crate::StartError> {
    let me = Rc::new(Shard::new(shard, host.clone()));
    me.start_background().await;
    if let Some(front) = front {
        let running = front.start(host.clone()).await?;
        *me.front.borrow_mut() = Some(running);
    }
    if let Err(e) = gate.arrived() {
        tracing::error!("{e}; stopping");
        broca_io::errln!("broca: {e}");
        let host = host.clone();
        glommio::spawn_local(async move {
            host.stop(&e.message).await;
        })
        .detach();
    }
    while let Some(msg) = rx.next().await {
        if !me.on_message(msg) {
            break;
        }
    }
    me.stopped.stop();
    let front = me.front.borrow_mut().take();
    if let Some(front) = front {
        front.stop().await;
    }
    Ok(())
}

/// Shard 0's answer to a signal: stop every shard, then end the mesh (each shard's loop, and
/// with it its front's part, ends).
async fn stop_every_shard(me: Rc<Shard>) {
    let mesh = &me.host.mesh;
    let mut waits = Vec::new();
    for shard in 0..mesh.shards() {
        let (done, wait) = oneshot::channel();
        if mesh.send(shard, ShardMsg::Stop(done)).await.is_ok() {
            waits.push(wait);
        }
    }
    for w in waits {
        let _ = w.await;
    }
    for shard in 0..mesh.shards() {
        let _ = mesh.send(shard, ShardMsg::End).await;
    }
}
