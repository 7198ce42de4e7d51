//! broca-host: the daemon both fronts run in. One pinned executor per shard; a session
//! address picks its shard, which owns the session's actor (a registry of them per shard),
//! its WAL appends (one group-commit scheduler per shard) and its provider connections (one
//! HTTP client per shard). The management core's requests, parsed by broca-wire, are
//! executed here against the shards ([`Host::call`], [`Host::subscribe`]); serve's HTTP and
//! Unix-socket surface (broca-serve) and module mode's daemon routes (broca-daemon) are the
//! fronts, each started on the shards through [`ShardFront`].
//!
//! Shutdown: a signal (or the front) stops admission (new sends are refused
//! `shutting_down`), gives active runs `grace` to finish, seals the rest Interrupted, closes
//! every WAL and removes serve.json; the caller re-raises the signal ([`reraise`]).
//!
//! Where things are: the daemon both fronts run in: `Startup` (limits, signals, the state dir
//! and its lock, then catalog, store, tools, shards; serve.json and the ready line only once
//! every shard has started its part of the front, `StartGate` in `shard.rs`), `Host` (what
//! every shard shares), a shard (`shard.rs`: its services, its hubs, its background, the mesh
//! messages) and its sessions (`sessions.rs`, `answer.rs`: session actors in broca-shards'
//! registry, each command routed to its session's own answer and the shard doing what the
//! answer asks next; `watch.rs` the shard's `Watch` of a session: its hub, metrics, spans, step
//! hints, storage health), the management core's requests executed (`rpc.rs`; a first send's
//! fetch plan fetched before its actor admits it (its step-transform providers' declarations
//! too) in `plans.rs`; a send's message through its plan's `pre_user` hooks before its actor
//! writes it in `pre_user.rs`; a person-only command forwarded between its actor's two records,
//! and an accepted one's late entries pulled, in `commands.rs`; a `session.refresh`'s plan
//! fetched between its actor's classification and acceptance in `change.rs`, a
//! `session.host_start`'s likewise and a `session.adopt` in `adopt.rs`; `reads.rs` through the
//! host's `ReadCache`, `media.rs` (`session.media_read`), `replies.rs`; `lists.rs`:
//! `sessions.list` from the store's marks, each listed one checked against the last seq its
//! shard appended (`ShardMsg::Heads`) and caught up from its WAL when behind, `runs.list` from
//! the WAL), the subscription handshake (`subscribe.rs`), metrics (`metrics.rs`: each shard's
//! counters, its runs by finish reason and calls by outcome counted as their records are
//! appended; every family in docs/metrics.md), the storage's health (`storage.rs`: failed WAL
//! writes by kind, a full file system until a write succeeds), the resume of runs a crash left
//! open and the archive scheduler (`resume.rs`), the reasoning prune's rewrite handed to the
//! archive and the copies made again after it (`prune.rs`: the readers' cache and the store's
//! projection; a debug build's `broca.debug.archive_now`), whole-session retention and per-
//! session storage policies (`retention.rs`: what the state dir holds at start, tombstones and
//! the sessions listed with a retention, a policy or a release, the deletion of an expired or
//! released record's every copy, read only once loaded and never locked; `retention/local.rs`
//! each shard's own part: a copy of every tombstone (told to every shard as one is written or
//! superseded), and its own sessions' due times and the WALs their policies have the archive
//! pack; `expiry.rs`: a due session expired before any request of it (its shard's earliest due
//! time, an atomic, says when to ask), one due at its actor's next look deleted at once, each
//! shard's look every 5 s, `expired` and `unknown_session` answers, `session.release`;
//! docs/retention.md)

mod adopt;
mod answer;
mod change;
mod commands;
mod compaction;
mod error;
mod expiry;
mod late;
mod limits;
mod lists;
mod media;
mod memory;
pub mod metrics;
mod plans;
mod pre_user;
mod prune;
mod reads;
mod replies;
mod resume;
pub mod retention;
mod rpc;
mod sessions;
mod shard;
mod signals;
mod start;
mod state;
pub mod storage;
mod subscribe;
mod tally;
mod watch;

pub use error::{Stage, StartError};
pub use metrics::ShardStats;
pub use prune::prune_reasoning;
pub use rpc::check_request;
pub use signals::reraise;
pub use state::{previous_serve, random_hex, serve_json, PreviousServe};
pub use subscribe::Subscription;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broca_io::net::proxy::ProxyConfig;
use futures_channel::mpsc;

use broca_provider::credential::Vault;
use broca_session::hub::{SubFrom, SubItem};
use broca_session::SessionCommand;
use broca_shards::mesh::{Mesh, MeshError};
use broca_tools::modules::ModuleTools;
use broca_transport::Endpoints;
use broca_wal::SessionTriple;

/// How the daemon runs, whichever its front.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub state_dir: PathBuf,
    pub shards: usize,
    pub grace: Duration,
    /// An idle session's actor is closed (and its memory freed) after this long.
    pub idle: Duration,
    /// Sessions open at once per shard (each holds its WAL open); `None` derives it from
    /// the open-files limit. Past it, the least recently used idle sessions are closed.
    pub open_sessions_max: Option<usize>,
    /// How long a command may wait for an open session to close (every open session running
    /// at `open_sessions_max`) before it is refused 503 `session_limit`.
    pub wait_for_room: Duration,
    /// Where the catalog comes from.
    pub catalog: broca_catalog::load::Sources,
    /// How often the catalog is assembled again (its service asked, its file read): a run
    /// already admitted keeps the entry it froze. Zero: never.
    pub catalog_refresh: Duration,
    /// Pack sessions idle this long in the background (`archive_after_days`); `None`: off.
    pub archive_after: Option<Duration>,
    /// How often the background pack runs (`archive_every_secs`, default an hour).
    pub archive_every: Duration,
    /// The archive prunes each packed session's reasoning (`prune_reasoning`; llm-runner/v1
    /// `archive_prunes_reasoning`, declared when set).
    pub prune_reasoning: bool,
    /// Sends may carry a fetch plan (`plans`; llm-runner/v1 `plans`, declared when set):
    /// fetched from the daemon's tool modules at a session's first send and frozen for life.
    pub plans: bool,
    /// Sends may carry an ordered delivery (`delivery_order`: a list in `delivery`, with
    /// `dedupe_key` and `expires_at_ms`; docs/delivery.md).
    pub delivery_order: bool,
    /// A plan may name a compaction provider (`compaction_providers`, needs `plans`): the
    /// session's history is rendered through the views its provider hands over
    /// (cortexkit-role-compaction's `compaction-runner/v1`; docs/compaction-providers.md).
    pub compaction_providers: bool,
    /// How long a session's first send waits for its plan's items, all of them together
    /// (`plan_fetch_deadline_ms`, default 10 s).
    pub plan_fetch_deadline: Duration,
    /// The MCP tool servers to start (`--tools-config`).
    pub tools: Option<broca_tools::config::ToolsConfig>,
    pub endpoints: Endpoints,
    /// The folders `session.import` reads logs from (a log elsewhere, or a link out of
    /// them, is refused `import_forbidden`); empty: none.
    pub import_roots: Vec<PathBuf>,
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
    /// The last seq this process appended to each of these sessions' WALs, for those the
    /// shard knows (`sessions.list` checks the store's marks with it).
    Heads(
        Vec<[u8; 16]>,
        futures_channel::oneshot::Sender<Vec<([u8; 16], u64)>>,
    ),
    /// A signal asked the daemon to stop (sent to shard 0, which stops every shard).
    Signal,
    /// Stop: wait for active runs up to the grace, seal the rest, close every session.
    Stop(futures_channel::oneshot::Sender<()>),
    /// Every shard has stopped: end this shard's loop.
    End,
    /// A tombstone was written: every shard keeps it (answered once kept), so a request of
    /// its session on any shard answers `expired` from then on.
    Tomb {
        stone: retention::Tombstone,
        kept: futures_channel::oneshot::Sender<()>,
    },
    /// A fresh record of lineage `lineage` superseded the tombstone of `addr` (its shard made
    /// it): every shard serves the session again (answered once noted).
    Superseded {
        addr: String,
        lineage: String,
        noted: futures_channel::oneshot::Sender<()>,
    },
    /// The WALs the receiving shard's sessions' policies have the archive pack (asked by the
    /// archive's thread before each pass).
    Archived(futures_channel::oneshot::Sender<std::collections::HashMap<String, Duration>>),
    /// The session `triple` (owned by the receiving shard) has a run a crash left open:
    /// resume it.
    Resume { triple: SessionTriple },
    /// Subscribe to the session `triple` (owned by the receiving shard).
    Subscribe {
        triple: SessionTriple,
        from: SubFrom,
        tx: mpsc::Sender<SubItem>,
        /// Resolves when the subscriber's connection ends.
        gone: futures_channel::oneshot::Receiver<()>,
    },
}

/// What a front hands the host besides its shards' parts (module mode's).
#[derive(Default)]
pub struct Extras {
    /// The daemon's tool_provider modules (their tools are offered beside the MCP servers').
    pub module_tools: Option<Arc<ModuleTools>>,
    /// The vault that `vault:` credentials resolve through.
    pub vault: Option<Arc<dyn Vault>>,
    /// Where llm-runner/v1 `step_events` hints go (module mode: the daemon's bus).
    pub step_hints: Option<StepHints>,
    /// A session's first send must name a `retention_policy` (module mode, where every
    /// starter sends one: llm-runner/v1 `session_retention.required`).
    pub policy_required: bool,
}

/// The publisher of `step.finished.v1` hints: each is handed over once its record is durable
/// and never waited for (a hint that cannot be sent is dropped by the publisher).
#[derive(Clone)]
pub struct StepHints {
    /// The publishing module's id (the subject's and the hint's `runner`).
    pub runner: String,
    /// The bus thread's queue (`publish` never blocks) and its counts.
    pub publisher: Arc<broca_subc::bus::Publisher>,
}

/// What every shard shares.
pub struct Host {
    pub opts: HostOptions,
    pub wal_dir: PathBuf,
    /// The bearer handle TCP clients present.
    pub handle: String,
    pub(crate) mesh: Mesh<ShardMsg>,
    /// Admission is closed.
    stopping: AtomicBool,
    /// The archive thread runs (`resume::start_archive_scheduler`).
    pub(crate) archiving: AtomicBool,
    /// The wall-clock time (Unix ms) the stop must be over by, when the front was given one
    /// (a daemon's drain); 0: none.
    stop_by_unix_ms: std::sync::atomic::AtomicU64,
    /// Every shard has started its part of the front (serve.json and the ready line are out):
    /// the store, the catalog, the tools and the shards are up.
    ready: Arc<AtomicBool>,
    /// The signal that asked for the stop (0: none yet).
    signal: AtomicI32,
    pub(crate) tls: Arc<broca_io::net::rustls::ClientConfig>,
    pub(crate) proxy: ProxyConfig,
    /// The MCP tool servers every shard routes to.
    pub(crate) tools: Arc<broca_tools::ToolServers>,
    /// Module mode: the daemon's tool_provider modules (their tools are in `tools`' specs).
    pub(crate) module_tools: Option<Arc<ModuleTools>>,
    /// The tool modules that have not answered yet: asked again every `module_retry`.
    pub(crate) tool_modules_missing: Mutex<Vec<String>>,
    /// The accepted person-only commands whose late entries this process pulls now (their
    /// call keys): one puller each (commands.rs).
    pub(crate) command_pulls: Mutex<std::collections::HashSet<String>>,
    /// The person-only commands being forwarded or pulled now, by call key: their sessions
    /// (a command's late entry on a route opened without a scope names none).
    pub(crate) command_sessions: Mutex<std::collections::HashMap<String, SessionTriple>>,
    /// The projections of the WALs (`None` when the store cannot be opened: then nothing is
    /// read from it, and the WALs serve everything).
    pub(crate) store: Option<Arc<broca_store::Store>>,
    /// Hands WALs that moved on to the store's own thread (it catches them up there, so
    /// store writes and their syncs never queue ahead of a shard's blocking work).
    pub(crate) projector: Option<Mutex<std::sync::mpsc::SyncSender<Vec<broca_store::Moved>>>>,
    /// Admission's checks of families and credentials (the shards' model clients resolve
    /// the same credentials the same way).
    pub(crate) checks: broca_provider::Checks,
    /// Module mode: the claustrum vault that `vault:` credentials resolve through.
    vault: Option<Arc<dyn Vault>>,
    /// The sessions read lately, kept replayed so a read applies only what was appended
    /// since (`session.read`, `.head`, `.history`, `run.tool_calls`, ...).
    pub(crate) reads: Arc<broca_read::read::ReadCache>,
    /// Failed WAL writes and whether the file system was last seen full.
    pub storage: storage::StorageHealth,
    /// Module mode: where step hints are published (`role.describe` declares `step_events`).
    pub(crate) step_hints: Option<StepHints>,
    /// As in [`Extras::policy_required`].
    pub(crate) policy_required: bool,
    /// The OpenTelemetry trace exporter, when the environment turns it on.
    pub(crate) traces: Option<Arc<broca_otel::Traces>>,
    /// Whole-session retention: tombstones, and when each session with one is due.
    pub(crate) retention: Arc<retention::Retention>,
}

/// Sessions whose replayed state the readers keep (the least lately read go first).
pub const READ_SESSIONS_MAX: usize = 256;

impl Host {
    /// Module mode: the step hints published and dropped so far, and the bus's connects.
    pub fn step_hint_counts(&self) -> Option<(u64, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let c = self.step_hints.as_ref()?.publisher.counts();
        Some((
            c.published.load(Relaxed),
            c.dropped.load(Relaxed),
            c.connects.load(Relaxed),
        ))
    }

    /// The credentials this daemon resolves: the state dir's, and the vault's in module mode.
    pub fn secrets(&self) -> broca_provider::credential::StateSecrets {
        secrets(&self.opts.state_dir, self.vault.as_ref())
    }

    /// The shard that owns `triple`.
    pub fn shard_of(&self, triple: &SessionTriple) -> usize {
        self.mesh.shard_of(triple.address().shard_key())
    }

    /// How many shards run.
    pub fn shards(&self) -> usize {
        self.mesh.shards()
    }

    /// Whether this runner hosts compaction providers and runs plans' `pre_user` hooks: module
    /// mode with `compaction_providers` on.
    pub(crate) fn runs_pre_user(&self) -> bool {
        self.opts.compaction_providers && self.module_tools.is_some()
    }

    /// Whether admission is closed.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Sends a command to the session's shard: refused when that shard's queue is full or
    /// the shard is gone.
    pub(crate) fn route(
        &self,
        triple: SessionTriple,
        cmd: SessionCommand,
    ) -> Result<(), MeshError> {
        let shard = self.shard_of(&triple);
        self.mesh.try_send(shard, ShardMsg::Session { triple, cmd })
    }

    /// Stops the daemon as a signal would (the front asked: a drain, the connection's end):
    /// admission closes at once, and shard 0 stops every shard. `false` when it was stopping
    /// already.
    pub async fn stop(&self, why: &str) -> bool {
        tracing::warn!("{why}: stopping admission; active runs get the grace period");
        let first = !self.stopping.swap(true, Ordering::AcqRel);
        if first {
            let _ = self.mesh.send(0, ShardMsg::Signal).await;
        }
        first
    }

    /// [`Host::stop`], to be over by `deadline_unix_ms` (a daemon's drain deadline, a wall
    /// clock time read as "no later than"): active runs get the grace period or what is left
    /// before the deadline, whichever ends first, keeping time to seal the rest.
    pub async fn stop_by(&self, why: &str, deadline_unix_ms: u64) -> bool {
        let earlier = |now: u64| {
            if now == 0 {
                deadline_unix_ms
            } else {
                now.min(deadline_unix_ms)
            }
        };
        let _ = self
            .stop_by_unix_ms
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(earlier(now))
            });
        self.stop(why).await
    }

    /// How much longer a shard that began to stop at `began` waits for its active runs
    /// (zero: no longer): the grace period from then, cut short by a deadline the front was
    /// given (looked at each time, so a drain during the grace period shortens it), less
    /// [`STOP_SEAL_MS`] kept to seal the rest.
    pub fn runs_wait_left(&self, began: std::time::Instant) -> std::time::Duration {
        let grace_left = self.opts.grace.saturating_sub(began.elapsed());
        let by = self.stop_by_unix_ms.load(Ordering::Acquire);
        if by == 0 {
            return grace_left;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let left_ms = by.saturating_sub(now_ms).saturating_sub(STOP_SEAL_MS);
        grace_left.min(std::time::Duration::from_millis(left_ms))
    }

    /// Whether the daemon has started: every shard has started its part of the front, after
    /// the store, the catalog and the tools (a front says it is warming before).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Every shard's counters (a shard whose queue is full is left out rather than waited
    /// for).
    pub async fn stats(&self) -> Vec<ShardStats> {
        metrics::gather(self).await
    }
}

fn secrets(
    state_dir: &Path,
    vault: Option<&Arc<dyn Vault>>,
) -> broca_provider::credential::StateSecrets {
    let s = broca_provider::credential::StateSecrets::new(state_dir);
    match vault {
        Some(v) => s.with_vault(Box::new(v.clone())),
        None => s,
    }
}

/// What a stop with a deadline keeps for sealing the runs still active and closing every
/// session, after it stops waiting for them.
pub const STOP_SEAL_MS: u64 = 500;

/// A future a front runs on its shard.
pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What a front runs on one shard, handed to that shard when it starts.
pub trait ShardFront: Send {
    /// Starts serving on this shard's executor; the answer stops it when the shard ends.
    fn start(
        self: Box<Self>,
        host: Arc<Host>,
    ) -> LocalBoxFuture<'static, Result<Box<dyn Running>, StartError>>;
}

/// A front serving on a shard.
pub trait Running {
    /// Its accept loops' counters (wakes with nothing to do, failed accepts, connections
    /// shed), for /metrics.
    fn counts(&self) -> (u64, u64, u64) {
        (0, 0, 0)
    }

    /// Stops serving (the shard ends).
    fn stop(self: Box<Self>) -> LocalBoxFuture<'static, ()>;
}

/// A front: what it writes into serve.json, what it says once ready, and its part on each
/// shard.
pub struct Front {
    /// serve.json's members beside `pid`.
    pub info: serde_json::Map<String, serde_json::Value>,
    /// The line printed on stdout once ready.
    pub ready: String,
    /// Each shard's part (by shard index; `None`: nothing runs there).
    pub shards: Vec<Option<Box<dyn ShardFront>>>,
}

/// A daemon being started: its limits sized, its signals caught, its state dir taken. The
/// front binds or registers next (before anything slow starts, so a port in use or a daemon
/// that refuses is an error at once), then [`Startup::run`] runs the daemon to its end.
pub struct Startup {
    opts: HostOptions,
    slot: Arc<Mutex<signals::SignalSlot>>,
    state: state::PreparedState,
    tls: Arc<broca_io::net::rustls::ClientConfig>,
    proxy: ProxyConfig,
}

impl Startup {
    /// Sizes the open sessions from the open-files limit, catches SIGTERM and SIGINT, and
    /// takes the state dir (its lock, its `wal/`, a new bearer handle). `Err` is one line
    /// naming what kept it from starting.
    pub fn begin(mut opts: HostOptions) -> Result<Startup, StartError> {
        if opts.shards == 0 {
            return Err(StartError::new(
                Stage::Options,
                "--shards must be at least 1",
            ));
        }
        let open = limits::open_sessions(opts.open_sessions_max, opts.shards)
            .map_err(StartError::at(Stage::Options))?;
        opts.open_sessions_max = Some(open);
        let slot = Arc::new(Mutex::new(signals::SignalSlot::default()));
        signals::catch_signals(slot.clone()).map_err(StartError::at(Stage::Process))?;
        let state = state::prepare_state(&opts.state_dir)?;
        let proxy = ProxyConfig::from_env().map_err(StartError::at(Stage::Process))?;
        let tls =
            broca_io::net::tls::default_client_config().map_err(StartError::at(Stage::Process))?;
        Ok(Startup {
            opts,
            slot,
            state,
            tls,
            proxy,
        })
    }

    /// The options, as sized.
    pub fn options(&self) -> &HostOptions {
        &self.opts
    }

    /// The owner-only file holding the bearer handle.
    pub fn handle_file(&self) -> &Path {
        &self.state.handle_file
    }

    /// Starts the catalog, the store, the tools and the shards (each with its part of
    /// `front`), writes serve.json and says `front.ready`, and serves until a signal or the
    /// front stops the daemon. Answers the signal that stopped it (0: the front did), once
    /// every WAL is closed and serve.json removed.
    pub fn run(self, front: Front, extras: Extras) -> Result<i32, StartError> {
        let Startup {
            opts,
            slot,
            state,
            tls,
            proxy,
        } = self;
        assert!(
            opts.open_sessions_max.is_some(),
            "begin sized the open sessions"
        );
        start::load_catalog(&opts, &tls, &proxy, extras.module_tools.clone())?;
        let mut opened = start::open_store(&opts.state_dir, &state.wal_dir)?;
        let caught_up = opened.caught_up.take();
        let (host, receivers) = Host::new(opts, &state, (tls, proxy), extras, opened)?;
        host.finish_deletions();
        signals::SignalSlot::install(&slot, &host);
        if let Some(m) = &host.module_tools {
            m.set_late_sink(Arc::new(late::HostLate {
                host: Arc::downgrade(&host),
            }));
        }
        resume::resume_open_runs(host.clone(), caught_up)?;
        let by_policy = !host.retention.loaded().archive.is_empty();
        resume::start_archive_scheduler(&host, by_policy)?;
        let serve_json = state::serve_json(&host.opts.state_dir);
        let gate = ready_gate(&host, front.info, front.ready, serve_json.clone());
        let result = run_shards(&host, receivers, front.shards, gate);
        // This daemon still holds the state dir's lock: serve.json is its own.
        let _ = std::fs::remove_file(&serve_json);
        drop(state.lock);
        host.tools.stop();
        if let Some(m) = &host.module_tools {
            m.stop();
        }
        if let Some(t) = &host.traces {
            t.shutdown(); // the runs' last spans, sealed as the shards stopped
        }
        result?;
        Ok(host.signal.load(Ordering::Acquire))
    }
}

/// serve.json and the ready line, only once every shard has started its part of the front:
/// a client that acts on either finds every listener accepting.
fn ready_gate(
    host: &Arc<Host>,
    mut info: serde_json::Map<String, serde_json::Value>,
    ready: String,
    path: PathBuf,
) -> Arc<shard::StartGate> {
    info.insert("pid".into(), std::process::id().into());
    let is_ready = host.ready.clone();
    Arc::new(shard::StartGate::new(
        host.opts.shards,
        Box::new(move || {
            broca_owner_only::write_file(
                &path,
                serde_json::Value::Object(info).to_string().as_bytes(),
            )
            .map_err(|e| {
                StartError::new(
                    Stage::StateDir,
                    format!("cannot write {}: {e}", path.display()),
                )
            })?;
            broca_io::outln!("{ready}");
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            is_ready.store(true, Ordering::Release);
            Ok(())
        }),
    ))
}

impl Host {
    /// The host of `opts` over the state dir `state` took, with its retention read, its
    /// tools started, its mesh (and each shard's end of it) and its vault.
    fn new(
        opts: HostOptions,
        state: &state::PreparedState,
        (tls, proxy): (Arc<broca_io::net::rustls::ClientConfig>, ProxyConfig),
        extras: Extras,
        opened: start::OpenedStore,
    ) -> Result<(Arc<Host>, Vec<broca_shards::mesh::Inbound<ShardMsg>>), StartError> {
        let retention = retention::Retention::load(&opts.state_dir, &state.wal_dir, opts.shards)
            .map_err(|e| {
                StartError::new(
                    Stage::Parts,
                    format!("reading the sessions' retention: {e}"),
                )
            })?;
        let (tools, missing) =
            start::start_tools(&opts, &tls, &proxy, extras.module_tools.clone())?;
        let (mesh, receivers) = Mesh::new(opts.shards);
        let traces = broca_otel::Traces::from_env(&tls);
        // Outside module mode, bearer handles read through the daemon's connection file; one
        // vault for every shard and for admission, so a secret read once is kept for all.
        let vault = extras.vault.or_else(|| {
            Some(Arc::new(broca_provider::vault::HandleVault::new()) as Arc<dyn Vault>)
        });
        let host = Arc::new(Host {
            checks: broca_provider::Checks::new(Box::new(secrets(&opts.state_dir, vault.as_ref()))),
            opts,
            wal_dir: state.wal_dir.clone(),
            handle: state.handle.clone(),
            mesh,
            stopping: AtomicBool::new(false),
            archiving: AtomicBool::new(false),
            stop_by_unix_ms: std::sync::atomic::AtomicU64::new(0),
            ready: Arc::new(AtomicBool::new(false)),
            signal: AtomicI32::new(0),
            tls,
            proxy,
            tools,
            module_tools: extras.module_tools,
            tool_modules_missing: Mutex::new(missing),
            command_pulls: Mutex::default(),
            command_sessions: Mutex::default(),
            store: opened.store,
            projector: opened.projector,
            vault,
            reads: Arc::new(broca_read::read::ReadCache::new(READ_SESSIONS_MAX)),
            storage: storage::StorageHealth::default(),
            step_hints: extras.step_hints,
            policy_required: extras.policy_required,
            traces,
            retention: Arc::new(retention),
        });
        assert_eq!(
            receivers.len(),
            host.opts.shards,
            "one mesh queue per shard"
        );
        Ok((host, receivers))
    }

    /// Finishes each deletion a crash cut short (its tombstone durable), before anything is
    /// served.
    fn finish_deletions(&self) {
        for stone in self.retention.pending() {
            if let Err(e) = self
                .retention
                .delete(&stone, self.store.as_deref(), &self.reads)
            {
                tracing::error!(
                    "session {}: deleting its expired content: {e}",
                    stone.address
                );
            }
        }
    }
}

/// Runs every shard until it stops, each with its part of the front.
fn run_shards(
    host: &Arc<Host>,
    receivers: Vec<broca_shards::mesh::Inbound<ShardMsg>>,
    fronts: Vec<Option<Box<dyn ShardFront>>>,
    gate: Arc<shard::StartGate>,
) -> Result<(), StartError> {
    let shards = host.opts.shards;
    assert_eq!(receivers.len(), shards, "one queue per shard");
    assert!(fronts.len() <= shards, "a front part per shard at most");
    let mut parts: Vec<_> = receivers.into_iter().map(Some).collect();
    let mut fronts: Vec<_> = fronts.into_iter().collect();
    fronts.resize_with(shards, || None);
    let parts: Vec<_> = parts.drain(..).zip(fronts).collect();
    let parts = Arc::new(Mutex::new(parts));
    let shard_host = host.clone();
    let result = broca_shards::run_pinned(shards, move |shard| {
        let host = shard_host.clone();
        let (rx, front) = {
            let mut parts = parts.lock().unwrap_or_else(|e| e.into_inner());
            let (rx, front) = std::mem::replace(&mut parts[shard], (None, None));
            (rx.expect("each shard takes its queue once"), front)
        };
        shard::shard_main(shard, host, rx, front, gate.clone())
    });
    let result =
        result.map_err(|e| StartError::new(Stage::Shards, format!("a shard failed to start: {e}")));
    for r in result? {
        r?;
    }
    Ok(())
}
