//! One shard's sessions: an actor per live session, started on the first command for it
//! (opening its WAL under the lease and resuming a run a crash left open) and closed after it
//! has been idle for a while, so an idle session costs no memory; the next command rebuilds
//! it from the WAL.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use broca_io::net::{ClientConfig, HttpClient};
use broca_io::{CommitStats, Committer};
use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use crate::session::{ActorError, SessionActor, SessionCommand};
use broca_provider::transport::HttpModelClient;
use broca_tools::Router;

use crate::subc_tools::Tools;
use broca_wal::{SessionTriple, WalError};
use broca_wire::RpcError;

use super::hub::{self, Hub, SubFrom, SubItem};
use super::{ServeCtx, ShardMsg};

#[path = "answer.rs"]
mod answer;
#[path = "unopened.rs"]
mod unopened;
use unopened::{fail, refuse_closing, view_from_wal};

/// Commands that may wait for one session's actor.
pub(crate) const INBOX_MAX: usize = 256;

/// How often a shard out of file descriptors says so in its log.
const SHORT_LOG_EVERY: Duration = Duration::from_secs(10);
/// Runs a shard resumes at once (a crash can leave thousands open: they resume in turn).
pub(crate) const RESUMES_AT_ONCE: usize = 16;
/// Batches of WALs that may wait for the store's thread.
pub(crate) const PROJECTOR_QUEUE_MAX: usize = 64;
/// Sessions whose seek points a shard keeps once their hub is gone (8 points of 16 bytes each).
const SEEK_SESSIONS_MAX: usize = 16_384;

/// One shard's counters, for /metrics.
#[derive(Debug, Clone, Default)]
pub struct ShardStats {
    pub shard: usize,
    pub sessions_live: usize,
    /// Idle sessions closed to stay within the open-sessions limit.
    pub sessions_evicted: u64,
    /// Commands refused because every open session was busy at the limit.
    pub sessions_refused_at_limit: u64,
    pub runs_active: usize,
    pub commit: CommitStats,
    pub provider_bytes_in: u64,
    pub provider_bytes_out: u64,
    pub provider_connects: u64,
    /// Failed model attempts by error class.
    pub model_errors: Vec<(broca_protocol::ErrorClass, u64)>,
    /// Accept-loop wakes that found nothing to do (an idle daemon has none).
    pub accept_wakes: u64,
    /// Failed accepts.
    pub accept_errors: u64,
    /// Connections closed with a 503 at once for lack of file descriptors.
    pub accept_shed: u64,
    /// Commands refused because their session's queue was full.
    pub inbox_full: u64,
    /// Batches kept for the next tick because the store's queue was full.
    pub projector_full: u64,
    /// Sessions that could not open their WAL for want of a file descriptor.
    pub out_of_descriptors: u64,
}

type Actor = SessionActor<HttpModelClient, Tools>;

/// A live session: its actor's command channel and what the open-sessions limit needs.
struct Live {
    tx: LocalSender<SessionCommand>,
    last_used: Cell<Instant>,
    /// A run is active (the session cannot be closed to make room).
    busy: Cell<bool>,
    /// Told to close to make room.
    evicting: Cell<bool>,
}

pub(crate) struct Registry {
    shard: usize,
    ctx: Arc<ServeCtx>,
    sessions: RefCell<HashMap<[u8; 16], Rc<Live>>>,
    open_max: usize,
    evicted: Cell<u64>,
    refused_at_limit: Cell<u64>,
    model: Rc<HttpModelClient>,
    http: Rc<HttpClient>,
    tools: Rc<Tools>,
    committer: Committer,
    runs_active: Cell<usize>,
    /// The shard stops: actors end after their run and take no new ones.
    closing: Cell<bool>,
    hubs: RefCell<HashMap<[u8; 16], Rc<Hub>>>,
    /// Seek points of sessions whose hub is gone (see [`Hub::take_seeks`]).
    seeks: RefCell<HashMap<[u8; 16], super::hub::SeekPoints>>,
    /// Sessions whose WAL moved on since the store last projected them.
    dirty: RefCell<std::collections::HashSet<SessionTriple>>,
    /// This shard's accept loops (`None` until started, or when it has no listener).
    acceptor: RefCell<Option<super::http::Acceptor>>,
    inbox_full: Cell<u64>,
    projector_full: Cell<u64>,
    /// Sessions that could not open their WAL for want of a descriptor, and those not yet
    /// logged while a [`SHORT_LOG_EVERY`] window is open (`None`: none is).
    out_of_descriptors: Cell<u64>,
    short_unlogged: Rc<Cell<Option<u64>>>,
    /// Runs being resumed at once (each holds a permit while its model is called).
    resumes: glommio::sync::Semaphore,
}

/// A shard's life: accept connections, serve the mesh, stop when told.
pub(crate) async fn shard_main(
    shard: usize,
    ctx: Arc<ServeCtx>,
    mut rx: mpsc::Receiver<ShardMsg>,
    listeners: Option<(
        std::net::TcpListener,
        Option<std::os::unix::net::UnixListener>,
    )>,
    front: Option<super::subc::SubcConn>,
) -> Result<(), String> {
    let http = HttpClient::new(ClientConfig::new(ctx.tls.clone(), ctx.proxy.clone()));
    let model = Rc::new(HttpModelClient::new(
        http.clone(),
        ctx.opts.endpoints.clone(),
        Box::new(ctx.secrets()),
    ));
    let reg = Rc::new(Registry {
        shard,
        ctx: ctx.clone(),
        sessions: RefCell::new(HashMap::new()),
        open_max: ctx.opts.open_sessions_max.unwrap_or(4096).max(1),
        evicted: Cell::new(0),
        refused_at_limit: Cell::new(0),
        model,
        http,
        tools: Rc::new(Tools {
            mcp: Router::new(
                ctx.tools.clone(),
                broca_tools::tool_http_client(ctx.tls.clone(), ctx.proxy.clone()),
            ),
            modules: ctx.module_tools.clone(),
        }),
        committer: Committer::default(),
        runs_active: Cell::new(0),
        closing: Cell::new(false),
        hubs: RefCell::new(HashMap::new()),
        seeks: RefCell::new(HashMap::new()),
        dirty: RefCell::new(std::collections::HashSet::new()),
        acceptor: RefCell::new(None),
        inbox_full: Cell::new(0),
        projector_full: Cell::new(0),
        out_of_descriptors: Cell::new(0),
        short_unlogged: Rc::new(Cell::new(None)),
        resumes: glommio::sync::Semaphore::new(RESUMES_AT_ONCE as u64),
    });
    if let Err(e) =
        broca_io::log::warm_device_cache(&ctx.wal_dir, &format!(".device-probe-{shard}")).await
    {
        tracing::warn!(
            "{}: opening a probe file with O_DIRECT: {e}",
            ctx.wal_dir.display()
        );
    }
    if ctx.projector.is_some() {
        glommio::spawn_local(project_dirty(reg.clone())).detach();
    }
    let catalog = &ctx.opts.catalog;
    if shard == 0
        && !ctx.opts.catalog_refresh.is_zero()
        && (catalog.url.is_some() || catalog.file.is_some())
    {
        glommio::spawn_local(refresh_catalog(reg.clone())).detach();
    }
    let accept = match listeners {
        Some((tcp, unix)) => Some(super::http::start(ctx.clone(), tcp, unix)?),
        None => None,
    };
    *reg.acceptor.borrow_mut() = accept;
    let closer = match front {
        Some(conn) => Some(super::subc::run(ctx.clone(), conn).await?),
        None => None,
    };
    while let Some(msg) = rx.next().await {
        match msg {
            ShardMsg::Session { triple, cmd } => reg.dispatch(triple, cmd),
            ShardMsg::Stats(reply) => {
                let _ = reply.send(reg.stats());
            }
            ShardMsg::Subscribe {
                triple,
                from,
                tx,
                gone,
            } => {
                let reg = reg.clone();
                glommio::spawn_local(async move { reg.subscribe(triple, from, tx, gone).await })
                    .detach();
            }
            ShardMsg::Signal => {
                // Shard 0 turns a signal into a stop of every shard; connections are served
                // (sends refused) until every shard has stopped.
                glommio::spawn_local(stop_every_shard(reg.clone())).detach();
            }
            ShardMsg::End => break,
            ShardMsg::Resume { triple } => reg.resume(triple),
            ShardMsg::Stop(done) => {
                let reg = reg.clone();
                glommio::spawn_local(async move {
                    reg.stop().await;
                    let _ = done.send(());
                })
                .detach();
            }
        }
    }
    if let Some(a) = reg.acceptor.borrow().as_ref() {
        a.stop();
    }
    if let Some(c) = closer {
        c.goodbye().await;
    }
    Ok(())
}

/// Shard 0's answer to SIGTERM/SIGINT: stop every shard, then end the mesh (each shard's
/// loop, and with it its accept loops, ends).
async fn stop_every_shard(reg: Rc<Registry>) {
    let ctx = &reg.ctx;
    let mut waits = Vec::new();
    for shard in 0..ctx.mesh.shards() {
        let (done, wait) = oneshot::channel();
        if ctx.mesh.send(shard, ShardMsg::Stop(done)).await.is_ok() {
            waits.push(wait);
        }
    }
    for w in waits {
        let _ = w.await;
    }
    for shard in 0..ctx.mesh.shards() {
        let _ = ctx.mesh.send(shard, ShardMsg::End).await;
    }
}

impl Registry {
    fn hub(&self, addr: [u8; 16]) -> Rc<Hub> {
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

    fn drop_hub_if_idle(&self, addr: [u8; 16]) {
        let mut hubs = self.hubs.borrow_mut();
        if hubs.get(&addr).is_some_and(|h| h.is_idle())
            && !self.sessions.borrow().contains_key(&addr)
        {
            if let Some(hub) = hubs.remove(&addr) {
                // A subscriber that reconnects after the session went idle still starts near
                // its cursor: the points outlive the hub (a bounded number of sessions' worth).
                let mut seeks = self.seeks.borrow_mut();
                if seeks.len() >= SEEK_SESSIONS_MAX {
                    if let Some(&any) = seeks.keys().next() {
                        seeks.remove(&any);
                    }
                }
                seeks.insert(addr, hub.take_seeks());
            }
        }
    }

    async fn subscribe(
        self: Rc<Self>,
        triple: SessionTriple,
        from: SubFrom,
        tx: futures_channel::mpsc::Sender<SubItem>,
        gone: oneshot::Receiver<()>,
    ) {
        let addr = triple.address().0;
        let hub = self.hub(addr);
        let live = self.sessions.borrow().contains_key(&addr);
        let reg = self.clone();
        let t = triple.clone();
        let barrier = async move {
            if !live {
                return None;
            }
            let (reply, wait) = oneshot::channel();
            reg.dispatch(t, SessionCommand::Barrier { reply });
            wait.await.ok().flatten()
        };
        let wal = broca_wal_writer::wal_path(&self.ctx.wal_dir, &triple);
        hub::run(hub, wal, from, barrier, tx, gone).await;
        self.drop_hub_if_idle(addr);
    }

    fn stats(&self) -> ShardStats {
        let h = self.http.stats();
        let (accept_wakes, accept_errors, accept_shed) = self
            .acceptor
            .borrow()
            .as_ref()
            .map_or((0, 0, 0), |a| a.counts());
        ShardStats {
            shard: self.shard,
            sessions_live: self.sessions.borrow().len(),
            sessions_evicted: self.evicted.get(),
            sessions_refused_at_limit: self.refused_at_limit.get(),
            runs_active: self.runs_active.get(),
            commit: self.committer.stats(),
            provider_bytes_in: h.bytes_in,
            provider_bytes_out: h.bytes_out,
            provider_connects: h.connects,
            model_errors: self.model.errors().snapshot(),
            accept_wakes,
            accept_errors,
            accept_shed,
            inbox_full: self.inbox_full.get(),
            projector_full: self.projector_full.get(),
            out_of_descriptors: self.out_of_descriptors.get(),
        }
    }

    /// Hands `cmd` to the session's actor, starting it if needed. A read of a session whose
    /// actor is not open is answered from its WAL as a reader: it takes no lease and writes
    /// nothing.
    fn dispatch(self: &Rc<Self>, triple: SessionTriple, cmd: SessionCommand) {
        if self.closing.get() {
            refuse_closing(cmd);
            return;
        }
        let addr = triple.address().0;
        let existing = self.sessions.borrow().get(&addr).cloned();
        let live = match existing {
            Some(live) => live,
            // Closing a session that is not open: nothing to do (never open it for that).
            None if matches!(cmd, SessionCommand::Close | SessionCommand::Shutdown) => return,
            None if matches!(cmd, SessionCommand::Status { .. }) => {
                if let SessionCommand::Status { run_id, reply } = cmd {
                    let path = broca_wal_writer::wal_path(&self.ctx.wal_dir, &triple);
                    glommio::spawn_local(view_from_wal(path, run_id, reply)).detach();
                }
                return;
            }
            None if !matches!(&cmd, SessionCommand::Send { admission, .. } if admission.is_ok())
                && !matches!(&cmd, SessionCommand::Import { .. })
                && !broca_wal::archive::exists(&broca_wal_writer::wal_path(
                    &self.ctx.wal_dir,
                    &triple,
                )) =>
            {
                // Nothing was ever sent to this session: answer without creating its WAL (a
                // refused send's send_id names no run here either).
                match cmd {
                    SessionCommand::Status { reply, .. } => drop(reply.send(None)),
                    SessionCommand::Cancel { reply, .. } => {
                        let _ = reply.send(crate::session::Cancelled::NotActive);
                    }
                    SessionCommand::Retract { reply, .. } => {
                        let _ = reply.send(Ok(crate::session::Retracted::NotPending));
                    }
                    SessionCommand::Barrier { reply } => drop(reply.send(None)),
                    SessionCommand::Send { admission, reply } => {
                        if let Err(u) = *admission {
                            drop(reply.send(Err(RpcError::refusal(&u.refusal))));
                        }
                    }
                    _ => {}
                }
                return;
            }
            None => match self.start_actor(triple) {
                Some(live) => live,
                None => {
                    self.refused_at_limit.set(self.refused_at_limit.get() + 1);
                    fail(cmd, &self.at_limit());
                    return;
                }
            },
        };
        live.last_used.set(Instant::now());
        // The inbox is unbounded (a bounded one reserves its whole capacity up front, 24 KiB
        // a session) and bounded here instead; the registry's own Close and Shutdown (to make
        // room, to stop) are sent past this bound.
        if live.tx.len() >= INBOX_MAX {
            self.inbox_full.set(self.inbox_full.get() + 1);
            fail(cmd, &inbox_full());
            return;
        }
        match live.tx.try_send(cmd) {
            Ok(()) => {}
            Err(glommio::GlommioError::Closed(glommio::ResourceType::Channel(cmd))) => {
                refuse_closing(cmd)
            }
            // An unbounded channel is never full.
            Err(_) => {}
        }
    }

    /// Starts the actor of `triple` (it opens the WAL under the lease and resumes a run a
    /// crash left open); `None` when the open-sessions limit leaves no room.
    fn start_actor(self: &Rc<Self>, triple: SessionTriple) -> Option<Rc<Live>> {
        if !self.make_room() {
            return None;
        }
        let (tx, rx) = local_channel::new_unbounded();
        let live = Rc::new(Live {
            tx,
            last_used: Cell::new(Instant::now()),
            busy: Cell::new(false),
            evicting: Cell::new(false),
        });
        let addr = triple.address().0;
        self.sessions.borrow_mut().insert(addr, live.clone());
        let (reg, l) = (self.clone(), live.clone());
        glommio::spawn_local(async move { reg.actor(triple, Rc::new(rx), l).await }).detach();
        Some(live)
    }

    fn at_limit(&self) -> RpcError {
        RpcError::new(
            broca_wire::Code::SessionLimit,
            format!(
                "all {} sessions this shard keeps open are running; retry later (raise \
                 open_sessions_max or the open-files limit)",
                self.open_max
            ),
        )
    }

    /// A session a crash left with an open run, found at start: its actor opens and resumes
    /// the run in the background (at most [`RESUMES_AT_ONCE`] resumes at a time).
    fn resume(self: &Rc<Self>, triple: SessionTriple) {
        let addr = triple.address().0;
        if self.closing.get() || self.sessions.borrow().contains_key(&addr) {
            return; // stopping, or already open (it resumed when it opened)
        }
        if self.start_actor(triple.clone()).is_none() {
            tracing::warn!(
                "session {}: its open run is not resumed now (every session this shard keeps \
                 open is running); it resumes when the session is next used",
                triple.address()
            );
        }
    }

    /// Keeps the open sessions within the limit before one more opens: past it, the least
    /// recently used idle sessions (a sixty-fourth of the limit at a time) are told to close.
    /// `false` when every open session is running a run, so nothing can make room.
    fn make_room(&self) -> bool {
        let sessions = self.sessions.borrow();
        let closing = sessions.values().filter(|l| l.evicting.get()).count();
        if sessions.len() - closing < self.open_max {
            return true;
        }
        let mut idle: Vec<(Instant, &Rc<Live>)> = sessions
            .values()
            .filter(|l| !l.busy.get() && !l.evicting.get())
            .map(|l| (l.last_used.get(), l))
            .collect();
        if idle.is_empty() {
            return false;
        }
        let batch = (self.open_max / 64).max(1);
        if idle.len() > batch {
            idle.select_nth_unstable_by_key(batch - 1, |(t, _)| *t);
            idle.truncate(batch);
        }
        for (_, live) in idle {
            live.evicting.set(true);
            let _ = live.tx.try_send(SessionCommand::Close);
            self.evicted.set(self.evicted.get() + 1);
        }
        true
    }

    /// One session's actor: open, resume, answer commands in order, run sends, close when
    /// idle, told to make room, or stopping.
    async fn actor(
        self: Rc<Self>,
        triple: SessionTriple,
        rx: Rc<LocalReceiver<SessionCommand>>,
        live: Rc<Live>,
    ) {
        let addr = triple.address().0;
        // The steps that are large futures (opening, resuming, a run, closing) are boxed: an
        // open session waiting for its next command holds only this loop's own state, and a
        // running one the step it is in (BENCHMARKS.md, memory per session).
        let Some(mut actor) = Box::pin(self.open_actor(&triple, &rx)).await else {
            return;
        };
        if actor.state().open.is_some() {
            let _slot = self.resumes.acquire_permit(1).await;
            let resumed = Box::pin(self.running(&live, &triple, actor.resume())).await;
            if let Err(e) = resumed {
                tracing::error!("session {}: resuming: {e}", triple.address());
            }
        }
        let mut open = Box::pin(self.run_queued(&mut actor, &live, &triple)).await;
        let idle = self.ctx.opts.idle;
        while open && !self.closing.get() {
            let deadline = Instant::now() + idle;
            let next = futures_lite::future::or(async { Some(rx.recv().await) }, async {
                glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
                None
            })
            .await;
            // Idle (free the memory), or the channel closed.
            let Some(Some(cmd)) = next else { break };
            open = Box::pin(self.answer(&mut actor, &live, &triple, cmd)).await;
        }
        if let Err(e) = Box::pin(actor.close()).await {
            tracing::error!("session {}: closing: {e}", triple.address());
        }
        self.sessions.borrow_mut().remove(&addr);
        self.drop_hub_if_idle(addr);
        // Commands that came in while this actor closed go to a new one (or are refused).
        while let Some(cmd) = queued(&rx).await {
            self.dispatch(triple.clone(), cmd);
        }
    }

    /// Opens the session's actor, wired to its hub (appends published once durable, display
    /// deltas passed on); when it cannot be opened, every queued command is answered so.
    async fn open_actor(
        &self,
        triple: &SessionTriple,
        rx: &Rc<LocalReceiver<SessionCommand>>,
    ) -> Option<Actor> {
        let addr = triple.address().0;
        let opened = SessionActor::open(
            &self.ctx.wal_dir,
            triple,
            self.model.clone(),
            self.tools.clone(),
            self.ctx.tools.specs(),
            crate::crash::log_config(),
            self.committer.clone(),
        )
        .await;
        let mut actor: Actor = match opened {
            Ok(a) => a,
            Err(e) => {
                if matches!(e, ActorError::Wal(WalError::OutOfDescriptors { .. })) {
                    self.out_of_descriptors_met(triple, &e);
                } else {
                    tracing::error!("session {}: {e}", triple.address());
                }
                self.sessions.borrow_mut().remove(&addr);
                let err = RpcError::new(
                    broca_wire::Code::SessionUnavailable,
                    format!("the session cannot be opened: {e}"),
                );
                while let Some(cmd) = queued(rx).await {
                    fail(cmd, &err);
                }
                return None;
            }
        };
        actor.set_inbox(rx.clone());
        let hub = self.hub(addr);
        hub.set_watch(actor.writer().watch());
        hub.set_start(actor.writer().next_seq(), actor.writer().log().end());
        let h = hub.clone();
        actor.set_on_append(Box::new(move |seq, end, record| {
            h.on_append(seq, end, record)
        }));
        actor.set_display(Box::new(move |text| hub.display(text)));
        Some(actor)
    }

    /// Logs a session that could not open its WAL for want of a descriptor: the first at
    /// once, then, while more meet it, one line per [`SHORT_LOG_EVERY`] with how many (a
    /// daemon out of descriptors meets it at every new session; each is answered 503).
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

    /// Stops the shard: no new runs; active runs get the grace period; then every session is
    /// told to stop (sealing its run Interrupted) and closed.
    async fn stop(&self) {
        let deadline = Instant::now() + self.ctx.opts.grace;
        while self.runs_active.get() > 0 && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        self.closing.set(true);
        let senders: Vec<_> = self.sessions.borrow().values().cloned().collect();
        for live in senders {
            let _ = live.tx.try_send(SessionCommand::Shutdown);
        }
        let bound = Instant::now() + Duration::from_secs(30);
        while !self.sessions.borrow().is_empty() && Instant::now() < bound {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Assembles the catalog again every `catalog_refresh` (shard 0): its service asked, its file
/// read, the last good copies kept as at start. Admission resolves in the new one; a run
/// already admitted uses the entry it froze.
async fn refresh_catalog(reg: Rc<Registry>) {
    let every = reg.ctx.opts.catalog_refresh;
    loop {
        glommio::timer::sleep(every).await;
        if reg.closing.get() {
            return;
        }
        let (catalog, notes) = crate::catalog_service::load(
            &reg.ctx.opts.catalog,
            &reg.http,
            reg.ctx.module_tools.as_deref(),
        )
        .await;
        for n in notes {
            tracing::warn!("catalog refresh: {n}");
        }
        broca_catalog::install(catalog);
    }
}

/// The refusal of a command whose session has [`INBOX_MAX`] commands waiting.
fn inbox_full() -> RpcError {
    RpcError::new(
        broca_wire::Code::SessionQueueFull,
        format!("the session has {INBOX_MAX} commands waiting; retry shortly"),
    )
}

/// How often a shard hands its sessions that moved on to the store.
const PROJECT_EVERY: Duration = Duration::from_millis(100);

/// Hands this shard's sessions that moved on to the store's thread, a batch every
/// [`PROJECT_EVERY`].
async fn project_dirty(reg: Rc<Registry>) {
    loop {
        glommio::timer::sleep(PROJECT_EVERY).await;
        let batch: Vec<SessionTriple> = reg.dirty.borrow_mut().drain().collect();
        if batch.is_empty() {
            if reg.closing.get() {
                return;
            }
            continue;
        }
        let paths: Vec<_> = batch
            .iter()
            .map(|t| broca_wal_writer::wal_path(&reg.ctx.wal_dir, t))
            .collect();
        if let Some(tx) = &reg.ctx.projector {
            let sent = tx.lock().expect("the projector lock").try_send(paths);
            if let Err(std::sync::mpsc::TrySendError::Full(_)) = sent {
                // The store is behind: these sessions go with the next batch.
                reg.projector_full.set(reg.projector_full.get() + 1);
                reg.dirty.borrow_mut().extend(batch);
            }
        }
    }
}

/// A command already queued, without waiting.
async fn queued(rx: &LocalReceiver<SessionCommand>) -> Option<SessionCommand> {
    futures_lite::future::poll_once(rx.recv()).await.flatten()
}
