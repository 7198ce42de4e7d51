//! `broca serve`: the daemon. One pinned executor per shard; a session address picks its
//! shard, which owns the session's actor, its WAL appends (one group-commit scheduler per
//! shard) and its provider connections (one HTTP client per shard). Shard 0 also accepts the
//! management connections (TCP and the Unix socket) and routes each session-bound command to
//! the owning shard over the shard mesh; replies come back on one-shot channels.
//!
//! Shutdown: SIGTERM or SIGINT stops admission (new sends are refused `shutting_down`),
//! gives active runs `--grace-secs` to finish, seals the rest Interrupted, closes every WAL,
//! removes serve.json and re-raises the signal, so a supervisor sees broca die of it.

mod accept;
mod claim;
mod http;
mod hub;
mod mesh;
mod metrics;
mod registry;
mod rpc;
mod start;
pub mod subc;
mod subscribe;
pub mod vault;

pub use rpc::check_request;

use start::{load_catalog, open_store, start_tools, OpenedStore};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broca_io::http_server::ServerLimits;
use broca_io::net::proxy::ProxyConfig;
use futures_channel::mpsc;

use broca_provider::transport::Endpoints;
use broca_wal::SessionTriple;

pub use registry::ShardStats;

use super::session::SessionCommand;

/// How serve runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub state_dir: PathBuf,
    pub listen: SocketAddr,
    pub socket: Option<PathBuf>,
    pub shards: usize,
    pub grace: Duration,
    /// An idle session's actor is closed (and its memory freed) after this long.
    pub idle: Duration,
    /// Sessions open at once per shard (each holds its WAL open); `None` derives it from
    /// the open-files limit. Past it, the least recently used idle sessions are closed.
    pub open_sessions_max: Option<usize>,
    /// Where the catalog comes from.
    pub catalog: broca_catalog::load::Sources,
    /// How often the catalog is assembled again (its service asked, its file read): a run
    /// already admitted keeps the entry it froze. Zero: never.
    pub catalog_refresh: Duration,
    /// Pack sessions idle this long in the background (`archive_after_days`); `None`: off.
    pub archive_after: Option<Duration>,
    /// How often the background pack runs (`archive_every_secs`, default an hour).
    pub archive_every: Duration,
    /// The MCP tool servers to start (`--tools-config`).
    pub tools: Option<broca_tools::config::ToolsConfig>,
    pub limits: ServerLimits,
    /// How long a request may take to arrive once it has begun (then 408).
    pub request_timeout: Duration,
    pub endpoints: Endpoints,
    /// Module mode: register with the subconscious daemon and serve its routes instead of
    /// listening (`broca module --subc FILE`).
    pub subc: Option<SubcOptions>,
}

/// Module mode's settings.
#[derive(Debug, Clone)]
pub struct SubcOptions {
    /// The daemon's owner-only connection file.
    pub connection_file: PathBuf,
    /// The module id broca registers as (`SUBC_MODULE_ID`, default `ck-broca`).
    pub module_id: String,
    /// The launch nonce the daemon handed this process, if any (never logged).
    pub launch_nonce: Option<String>,
}

/// A message between shards.
pub(crate) enum ShardMsg {
    /// A command for the session `triple` (owned by the receiving shard).
    Session {
        triple: SessionTriple,
        cmd: SessionCommand,
    },
    /// The shard's counters.
    Stats(futures_channel::oneshot::Sender<ShardStats>),
    /// A signal asked the daemon to stop (sent to shard 0, which stops every shard).
    Signal,
    /// Stop: wait for active runs up to the grace, seal the rest, close every session.
    Stop(futures_channel::oneshot::Sender<()>),
    /// Every shard has stopped: end this shard's loop.
    End,
    /// The session `triple` (owned by the receiving shard) has a run a crash left open:
    /// resume it.
    Resume { triple: SessionTriple },
    /// Subscribe to the session `triple` (owned by the receiving shard).
    Subscribe {
        triple: SessionTriple,
        from: hub::SubFrom,
        tx: mpsc::Sender<hub::SubItem>,
        /// Resolves when the subscriber's connection ends.
        gone: futures_channel::oneshot::Receiver<()>,
    },
}

/// What every shard shares.
pub(crate) struct ServeCtx {
    pub opts: ServeOptions,
    pub wal_dir: PathBuf,
    /// The bearer handle TCP clients present.
    pub handle: String,
    pub mesh: mesh::Mesh,
    /// Admission is closed.
    pub stopping: AtomicBool,
    /// The signal that asked for the stop (0: none yet).
    pub signal: AtomicI32,
    pub tls: Arc<broca_io::net::rustls::ClientConfig>,
    pub proxy: ProxyConfig,
    /// The MCP tool servers every shard routes to.
    pub tools: Arc<broca_tools::ToolServers>,
    /// Module mode: the daemon's tool_provider modules (their tools are in `tools`' specs).
    pub module_tools: Option<Arc<crate::subc_tools::ModuleTools>>,
    /// The projections of the WALs (`None` when the store cannot be opened: then nothing is
    /// read from it, and the WALs serve everything).
    pub store: Option<Arc<broca_store::Store>>,
    /// Hands WALs that moved on to the store's own thread (it catches them up there, so
    /// store writes and their syncs never queue ahead of a shard's blocking work).
    pub projector: Option<Mutex<std::sync::mpsc::SyncSender<Vec<PathBuf>>>>,
    /// Admission's checks of families and credentials (the shards' model clients resolve
    /// the same credentials the same way).
    pub checks: broca_provider::Checks,
    /// Module mode: the daemon connection ended unannounced (broca stops, and exits
    /// non-zero).
    pub subc_lost: AtomicBool,
    /// Module mode: the claustrum vault that `vault:` credentials resolve through.
    pub vault: Option<vault::SharedVault>,
}

impl ServeCtx {
    /// The credentials this daemon resolves: the state dir's, and the vault's in module mode.
    pub fn secrets(&self) -> broca_provider::credential::StateSecrets {
        secrets(&self.opts.state_dir, self.vault.as_ref())
    }
}

fn secrets(
    state_dir: &Path,
    vault: Option<&vault::SharedVault>,
) -> broca_provider::credential::StateSecrets {
    let s = broca_provider::credential::StateSecrets::new(state_dir);
    match vault {
        Some(v) => s.with_vault(Box::new(v.clone())),
        None => s,
    }
}

impl ServeCtx {
    /// The shard that owns `triple`.
    pub fn shard_of(&self, triple: &SessionTriple) -> usize {
        let a = triple.address().0;
        let key = u64::from_le_bytes(a[..8].try_into().expect("eight bytes"));
        broca_shards::shard_for(key, self.mesh.shards())
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Sends a command to the session's shard: refused when that shard's queue is full or
    /// the shard is gone.
    pub fn route(&self, triple: SessionTriple, cmd: SessionCommand) -> Result<(), mesh::MeshError> {
        let shard = self.shard_of(&triple);
        self.mesh.try_send(shard, ShardMsg::Session { triple, cmd })
    }
}

/// What serve prepared in its state dir.
struct PreparedState {
    /// Held for the daemon's life: no other serve uses this state dir meanwhile.
    lock: claim::StateLock,
    wal_dir: PathBuf,
    handle: String,
    handle_file: PathBuf,
}

/// Creates (0700) or checks the state dir and its `wal/` folder, takes the state dir's lock
/// (refused while another serve holds it), and makes the handle file.
fn prepare_state(opts: &ServeOptions) -> Result<PreparedState, String> {
    let dir = &opts.state_dir;
    broca_owner_only::create_dir(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    broca_owner_only::check_dir(dir)?;
    let lock = claim::lock_state_dir(dir)?;
    let wal_dir = dir.join("wal");
    broca_owner_only::create_dir(&wal_dir)
        .map_err(|e| format!("cannot create {}: {e}", wal_dir.display()))?;
    broca_owner_only::check_dir(&wal_dir)?;
    let mut raw = [0u8; 32];
    getrandom(&mut raw)?;
    let handle: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let handle_file = dir.join("serve.handle");
    broca_owner_only::write_file(&handle_file, handle.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", handle_file.display()))?;
    Ok(PreparedState {
        lock,
        wal_dir,
        handle,
        handle_file,
    })
}

fn getrandom(buf: &mut [u8]) -> Result<(), String> {
    let mut f = std::fs::File::open("/dev/urandom").map_err(|e| format!("/dev/urandom: {e}"))?;
    std::io::Read::read_exact(&mut f, buf).map_err(|e| format!("/dev/urandom: {e}"))
}

/// Blocks SIGTERM and SIGINT in this thread (the shards inherit the mask) and waits for them
/// on a thread of their own.
/// Where a signal goes: the daemon once it runs; before that, the signal is kept for it.
#[derive(Default)]
struct SignalSlot {
    ctx: Option<Arc<ServeCtx>>,
    /// A signal that came before the daemon was ready (0: none).
    early: i32,
}

/// Stops the daemon for `sig` (the first signal wins; later ones change nothing).
fn stop_for_signal(ctx: &ServeCtx, sig: i32) {
    tracing::warn!("signal {sig}: stopping admission; active runs get the grace period");
    let first = ctx
        .signal
        .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    ctx.stopping.store(true, Ordering::Release);
    if first {
        let _ = ctx.mesh.send_blocking(0, ShardMsg::Signal);
    }
}

fn catch_signals(slot: Arc<Mutex<SignalSlot>>) -> Result<(), String> {
    // SAFETY: plain libc signal-set calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err("cannot block SIGTERM/SIGINT".into());
        }
        let set = set;
        std::thread::Builder::new()
            .name("broca-signals".into())
            .spawn(move || loop {
                let mut sig = 0;
                if libc::sigwait(&set, &mut sig) == 0 {
                    let mut slot = slot.lock().expect("the signal slot");
                    match slot.ctx.as_ref() {
                        Some(ctx) => stop_for_signal(ctx, sig),
                        // Still starting (in module mode the daemon may ask before broca is
                        // ready): the daemon stops as soon as it is.
                        None if slot.early == 0 => slot.early = sig,
                        None => {}
                    }
                }
            })
            .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    }
    Ok(())
}

/// Raises this process's open-files soft limit to its hard limit (each open session holds its
/// WAL open); returns the soft limit in force.
fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write plain structs for this process.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Sessions each shard keeps open by default: three quarters of the open-files limit shared
/// by the shards (the rest is for connections and everything else), from 64 to 16,384.
fn open_sessions_budget(open_files: u64, shards: usize) -> usize {
    let per_shard = open_files.saturating_mul(3) / 4 / shards.max(1) as u64;
    per_shard.clamp(64, 16_384) as usize
}

/// Runs the daemon until a signal stops it. Returns the signal, for the caller to re-raise
/// once everything is closed. `Err` is one line naming what kept it from starting.
pub fn serve(mut opts: ServeOptions) -> Result<i32, String> {
    if opts.shards == 0 {
        return Err("--shards must be at least 1".into());
    }
    size_open_sessions(&mut opts)?;
    let slot: Arc<Mutex<SignalSlot>> = Arc::new(Mutex::new(SignalSlot::default()));
    catch_signals(slot.clone())?;
    let PreparedState {
        lock: state_lock,
        wal_dir,
        handle,
        handle_file,
    } = prepare_state(&opts)?;
    let proxy = ProxyConfig::from_env()?;
    let tls = broca_io::net::tls::default_client_config()?;
    // Module mode registers with the daemon first: one that cannot be reached or refuses is
    // an error at once, never a fall back to listening.
    let (listeners, front) = match &opts.subc {
        Some(m) => {
            let mut services = vec![broca_subc::vault::CLAUSTRUM.to_string()];
            services.extend(opts.catalog.module.clone());
            let consumes = broca_subc::manifest::Consumes {
                tool_modules: opts
                    .tools
                    .iter()
                    .flat_map(|t| t.modules.iter().map(|m| m.module.clone()))
                    .collect(),
                services,
            };
            let hello = broca_subc::manifest::hello(
                &m.module_id,
                env!("CARGO_PKG_VERSION"),
                m.launch_nonce.clone(),
                &consumes,
            );
            let r = broca_subc::connect::connect(&m.connection_file, &hello)
                .map_err(|e| e.to_string())?;
            let conn = subc::SubcConn {
                stream: r.stream,
                decoder: r.decoder,
            };
            (None, Some(conn))
        }
        None => (Some(Listeners::bind(&opts)?), None),
    };
    // Module mode reaches tool modules and the catalog module over routes of its own.
    let module_tools = opts.subc.as_ref().map(|m| {
        let cfg = opts.tools.clone().unwrap_or_default();
        crate::subc_tools::ModuleTools::new(
            m.connection_file.clone(),
            m.module_id.clone(),
            m.launch_nonce.clone(),
            cfg.modules,
            cfg.result_bytes_max,
        )
    });
    load_catalog(&opts, &tls, &proxy, module_tools.clone())?;
    let OpenedStore {
        store,
        projector,
        caught_up,
    } = open_store(&opts.state_dir, &wal_dir)?;
    let tools = start_tools(&opts, &tls, &proxy, module_tools.clone())?;
    let vault = opts.subc.as_ref().map(|m| {
        vault::SharedVault(Arc::new(vault::ClaustrumVault::new(
            broca_subc::vault::VaultClient::new(
                m.connection_file.clone(),
                m.module_id.clone(),
                m.launch_nonce.clone(),
            ),
        )))
    });
    let (mesh, receivers) = mesh::Mesh::new(opts.shards);
    let ctx = Arc::new(ServeCtx {
        opts: opts.clone(),
        wal_dir,
        handle,
        mesh,
        stopping: AtomicBool::new(false),
        signal: AtomicI32::new(0),
        tls,
        proxy,
        tools,
        module_tools,
        store,
        projector,
        checks: broca_provider::Checks::new(Box::new(secrets(&opts.state_dir, vault.as_ref()))),
        subc_lost: AtomicBool::new(false),
        vault,
    });
    {
        let mut slot = slot.lock().expect("the signal slot");
        slot.ctx = Some(ctx.clone());
        if slot.early != 0 {
            stop_for_signal(&ctx, slot.early);
        }
    }
    let serve_json = serve_json(&opts.state_dir);
    let info = match &listeners {
        Some(l) => serde_json::json!({
            "pid": std::process::id(),
            "listen": l.listen.to_string(),
            "socket": l.socket.display().to_string(),
            "handle_file": handle_file.display().to_string(),
        }),
        None => serde_json::json!({"pid": std::process::id(), "module": true}),
    };
    broca_owner_only::write_file(&serve_json, info.to_string().as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", serve_json.display()))?;
    let socket = listeners.as_ref().map(|l| l.socket.clone());
    resume_open_runs(ctx.clone(), caught_up)?;
    start_archive_scheduler(&ctx)?;
    match (&listeners, &opts.subc) {
        (Some(l), _) => crate::outln!("broca listening on http://{}", l.listen),
        (None, Some(m)) => crate::outln!("broca registered with the daemon as {}", m.module_id),
        (None, None) => {}
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let result = run_shards(&ctx, receivers, listeners, front);
    // This daemon still holds the state dir's lock: serve.json and the socket are its own.
    let _ = std::fs::remove_file(&serve_json);
    if let Some(socket) = &socket {
        let _ = std::fs::remove_file(socket);
    }
    drop(state_lock);
    ctx.tools.stop();
    if let Some(m) = &ctx.module_tools {
        m.stop();
    }
    result?;
    if ctx.subc_lost.load(Ordering::Acquire) {
        return Err(
            "the daemon connection ended unannounced: admission stopped, active runs got the \
             grace period and the rest were sealed interrupted"
                .into(),
        );
    }
    Ok(ctx.signal.load(Ordering::Acquire))
}

/// Packs the sessions idle for `archive_after` every `archive_every`, on a thread of its own
/// (never on a shard): a session whose actor is open holds its WAL's lease and is left live; a
/// send to a packed session restores its WAL first.
fn start_archive_scheduler(ctx: &Arc<ServeCtx>) -> Result<(), String> {
    let Some(idle) = ctx.opts.archive_after else {
        return Ok(());
    };
    let ctx = ctx.clone();
    let every = ctx.opts.archive_every.max(Duration::from_secs(1));
    std::thread::Builder::new()
        .name("archive".into())
        .spawn(move || loop {
            let until = std::time::Instant::now() + every;
            while std::time::Instant::now() < until {
                if ctx.stopping.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200).min(every));
            }
            let opts = broca_archive::PackOptions {
                idle,
                dry_run: false,
            };
            let started = std::time::Instant::now();
            match broca_archive::pack(&ctx.opts.state_dir, &opts, &mut |_| {}) {
                Ok(r) if !r.packed.is_empty() => tracing::info!(
                    sessions = r.packed.len(),
                    bytes = r.bytes,
                    containers = r.containers.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "packed idle sessions"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!("archive pack: {e}"),
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the archive thread: {e}"))
}

/// Finds the runs a crash left open and has their shards resume them, in the background:
/// from the store's run index once the store has caught up with the WALs, or, without a
/// store, from the WALs themselves. Admission is open meanwhile; a read of a run being
/// resumed answers at once from the WAL (`active`).
fn resume_open_runs(
    ctx: Arc<ServeCtx>,
    caught_up: Option<std::sync::mpsc::Receiver<()>>,
) -> Result<(), String> {
    std::thread::Builder::new()
        .name("resume".into())
        .spawn(move || {
            let sessions = match (&ctx.store, caught_up) {
                (Some(store), Some(caught_up)) => {
                    let _ = caught_up.recv();
                    match store.sessions_with_open_runs() {
                        Ok(addrs) => addrs
                            .iter()
                            .filter_map(|a| session_of(&ctx.wal_dir.join(wal_name(a))))
                            .collect(),
                        Err(e) => {
                            tracing::error!("{e}; looking for open runs in the WALs instead");
                            open_runs_in_wals(&ctx.wal_dir)
                        }
                    }
                }
                _ => open_runs_in_wals(&ctx.wal_dir),
            };
            if !sessions.is_empty() {
                tracing::warn!(runs = sessions.len(), "resuming the runs a crash left open");
            }
            for triple in sessions {
                let shard = ctx.shard_of(&triple);
                if ctx
                    .mesh
                    .send_blocking(shard, ShardMsg::Resume { triple })
                    .is_err()
                {
                    return; // the shards stopped
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the resume thread: {e}"))
}

fn wal_name(addr: &[u8; 16]) -> String {
    broca_wal::SessionAddr(*addr).wal_file_name()
}

/// The session a WAL belongs to, from its header.
fn session_of(path: &Path) -> Option<SessionTriple> {
    broca_wal::reader::PagedReader::open_if_any(path)
        .ok()
        .flatten()
        .map(|r| r.header().triple.clone())
}

/// The sessions whose WAL ends with a run open (every WAL read: without a store only).
fn open_runs_in_wals(wal_dir: &Path) -> Vec<SessionTriple> {
    let Ok(files) = broca_store::wal_files(wal_dir) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|path| {
            let read = match broca_core::read_session(path, broca_core::Keep::State) {
                Ok(read) => read?,
                Err(e) => {
                    tracing::error!("looking for an open run: {e}");
                    return None;
                }
            };
            let s = &read.session;
            (s.open.is_some() || !s.queued.is_empty()).then_some(read.triple)
        })
        .collect()
}

/// Raises the open-files limit and sets `open_sessions_max` from it when the options do not.
fn size_open_sessions(opts: &mut ServeOptions) -> Result<(), String> {
    let files = raise_open_files_limit();
    let budget = open_sessions_budget(files, opts.shards);
    match opts.open_sessions_max {
        None => opts.open_sessions_max = Some(budget),
        Some(0) => return Err("open_sessions_max must be at least 1".into()),
        Some(n) if n > budget => tracing::warn!(
            "open_sessions_max {n} per shard is more than the open-files limit ({files}) \
             leaves room for; opening sessions may fail with `too many open files`"
        ),
        Some(_) => {}
    }
    tracing::info!(
        open_files = files,
        open_sessions_max = opts.open_sessions_max,
        "sessions kept open per shard"
    );
    Ok(())
}

/// The TCP listener and the Unix socket, bound before the shards start (so a port in use is
/// a clear error here).
struct Listeners {
    tcp: std::net::TcpListener,
    listen: SocketAddr,
    unix: std::os::unix::net::UnixListener,
    socket: PathBuf,
}

impl Listeners {
    fn bind(opts: &ServeOptions) -> Result<Listeners, String> {
        let tcp = std::net::TcpListener::bind(opts.listen)
            .map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
        // Non-blocking for good: every shard accepts on a copy of this descriptor, and
        // glommio's first, synchronous accept toggles O_NONBLOCK on the shared file
        // description around its call; left blocking, one shard could restore blocking mode
        // while another is about to accept, and that shard would sleep inside accept(2) until
        // the next connection.
        tcp.set_nonblocking(true)
            .map_err(|e| format!("cannot listen on {}: {e}", opts.listen))?;
        let listen = tcp.local_addr().map_err(|e| e.to_string())?;
        let socket = opts
            .socket
            .clone()
            .unwrap_or_else(|| opts.state_dir.join("broca.sock"));
        claim::claim_socket(&socket, &opts.state_dir)?; // a socket left by a killed daemon
        let unix = std::os::unix::net::UnixListener::bind(&socket)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Listeners {
            tcp,
            listen,
            unix,
            socket,
        })
    }
}

/// Runs every shard until it stops: each accepts on its own descriptor of the TCP listener,
/// shard 0 also on the Unix socket.
fn run_shards(
    ctx: &Arc<ServeCtx>,
    receivers: Vec<futures_channel::mpsc::Receiver<ShardMsg>>,
    listeners: Option<Listeners>,
    front: Option<subc::SubcConn>,
) -> Result<(), String> {
    let shards = ctx.opts.shards;
    let mut tcp_copies: Vec<Option<std::net::TcpListener>> = Vec::with_capacity(shards);
    let mut unix = None;
    if let Some(l) = listeners {
        for _ in 1..shards {
            tcp_copies.push(Some(l.tcp.try_clone().map_err(|e| {
                format!("cannot share the listener between shards: {e}")
            })?));
        }
        tcp_copies.insert(0, Some(l.tcp));
        unix = Some(l.unix);
    }
    let receivers = Arc::new(Mutex::new(
        receivers.into_iter().map(Some).collect::<Vec<_>>(),
    ));
    let shared = Arc::new(Mutex::new((tcp_copies, unix, front)));
    let shard_ctx = ctx.clone();
    let result = broca_shards::run_pinned(shards, move |shard| {
        let ctx = shard_ctx.clone();
        let rx = receivers.lock().expect("receivers")[shard]
            .take()
            .expect("one receiver per shard");
        let (listeners, front) = {
            let mut l = shared.lock().expect("listeners");
            let tcp = l.0.get_mut(shard).and_then(Option::take);
            let unix = if shard == 0 { l.1.take() } else { None };
            let front = if shard == 0 { l.2.take() } else { None };
            (tcp.map(|tcp| (tcp, unix)), front)
        };
        registry::shard_main(shard, ctx, rx, listeners, front)
    });
    for r in result.map_err(|e| format!("a shard failed to start: {e}"))? {
        r?;
    }
    Ok(())
}

/// Dies of `sig` as if it had not been caught (the supervisor sees the signal).
pub fn reraise(sig: i32) -> ! {
    // SAFETY: resetting a signal to its default and raising it; nothing is left to run.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}

/// The path of serve.json in `state_dir`.
pub fn serve_json(state_dir: &Path) -> PathBuf {
    state_dir.join("serve.json")
}
