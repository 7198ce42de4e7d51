//! broca-run: the standalone runner behind `broca run`: one session, one send, in this
//! process, with the same WAL and durability as serve. A run a crash left open in the session
//! is resumed (and driven to its end) before the send is admitted. `broca import` runs here
//! too ([`import_logs`]).

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

use broca_io::net::proxy::ProxyConfig;
use broca_io::net::{tls, ClientConfig, HttpClient};
use broca_io::Committer;

use broca_core::admission::SendRequest;
use broca_provider::credential::StateSecrets;
use broca_transport::{Endpoints, HttpModelClient};
use broca_wal::SessionTriple;
use broca_wire::RunResult;

use broca_protocol::model::ModelClient;
use broca_session::{ImportReply, ImportTarget, NoModel, SessionActor};
use broca_tools::{NoTools, ToolRunner};

/// What to run.
pub struct Standalone {
    pub state_dir: PathBuf,
    pub triple: SessionTriple,
    pub send: SendRequest,
    pub endpoints: Endpoints,
    /// The MCP tool servers to start, if any.
    pub tools: Option<broca_tools::config::ToolsConfig>,
    /// Where the catalog comes from.
    pub catalog: broca_catalog::load::Sources,
}

/// What happened.
#[derive(Debug)]
pub struct Report {
    /// A run left open by an earlier crash, resumed and ended first.
    pub resumed: Option<RunResult>,
    /// The send's run (an earlier one when the send_id named it: nothing new was written).
    pub result: RunResult,
    pub existing: bool,
}

/// Why a standalone run did not end with a result.
#[derive(Debug)]
pub enum Failure {
    /// Admission refused the send; nothing was written.
    Refused(broca_wire::Refusal),
    /// Anything else, as one line naming what failed.
    Failed(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::Failed(s)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(r) => write!(f, "{r}"),
            Failure::Failed(s) => f.write_str(s),
        }
    }
}

impl Standalone {
    /// Runs the send to its end on a local executor; `display` receives the answer's text as
    /// it streams.
    pub fn run(self, display: Box<dyn FnMut(&str)>) -> Result<Report, Failure> {
        let wal_dir = self.state_dir.join("wal");
        broca_owner_only::create_dir(&wal_dir)
            .map_err(|e| format!("cannot create {}: {e}", wal_dir.display()))?;
        let proxy = ProxyConfig::from_env().map_err(|e| e.to_string())?;
        let tls = tls::default_client_config().map_err(|e| e.to_string())?;
        let traces = broca_otel::Traces::from_env(&tls);
        let flush = traces.clone();
        let ran = broca_shards::run_local(async move {
            let http = HttpClient::new(ClientConfig::new(tls.clone(), proxy.clone()));
            load_catalog(&self.catalog, &http).await;
            let model = HttpModelClient::new(
                http,
                self.endpoints.clone(),
                Box::new(
                    StateSecrets::new(&self.state_dir)
                        .with_vault(Box::new(broca_provider::vault::HandleVault::new())),
                ),
            );
            let tool_http = broca_tools::tool_http_client(tls, proxy);
            let servers = start_tools(self.tools.clone(), &tool_http).await?;
            let outcome = self
                .run_on(
                    &wal_dir,
                    model,
                    (servers.clone(), tool_http),
                    traces,
                    display,
                )
                .await;
            servers.stop();
            outcome
        })
        .map_err(|e| Failure::Failed(format!("cannot start the executor: {e}")))?;
        if let Some(t) = flush {
            t.shutdown(); // the run's spans leave before the process does
        }
        ran
    }

    /// The send run in the session's actor, with the model and tools started, then the
    /// session handed to the store.
    async fn run_on(
        self,
        wal_dir: &std::path::Path,
        model: HttpModelClient,
        (servers, tool_http): (std::sync::Arc<broca_tools::ToolServers>, Rc<HttpClient>),
        traces: Option<std::sync::Arc<broca_otel::Traces>>,
        display: Box<dyn FnMut(&str)>,
    ) -> Result<Report, Failure> {
        // A send admission refuses on its own writes nothing, not even a new WAL: it is
        // refused before the session opens, unless its send_id may name a run of a WAL that
        // exists (that run is the answer then).
        let catalog = broca_catalog::current();
        let specs = servers.specs();
        let wal = broca_wal_writer::wal_path(wal_dir, &self.triple);
        if let Err(u) = broca_core::admission::prepare(&self.send, &specs, &catalog, model.check())
        {
            if u.send_id.is_none() || !broca_wal::archive::exists(&wal) {
                return Err(Failure::Refused(u.refusal));
            }
        }
        let router = broca_tools::Router::new(servers, tool_http);
        // A run a crash left open is resumed first; its text is not the answer asked for.
        let shown = Rc::new(Cell::new(false));
        let watch = RunWatch {
            spans: traces.map(|t| {
                let conversation = self.triple.address().to_string();
                (t, RefCell::new(broca_otel::SessionSpans::new(conversation)))
            }),
            display: RefCell::new(display),
            shown: shown.clone(),
        };
        let mut actor =
            SessionActor::opener(wal_dir, &self.triple, Rc::new(model), Rc::new(router))
                .tool_specs(specs)
                .log(broca_crash_points::log_config())
                .committer(Committer::default())
                .hooks(Rc::new(broca_crash_points::KillPoints))
                .watch(Rc::new(watch))
                .open()
                .await
                .map_err(failed)?;
        let outcome = Self::drive(&mut actor, self.send, &shown).await;
        let closed = actor.close().await.map_err(failed);
        // The store follows the WAL after the run, off its path.
        project(self.state_dir.clone(), vec![wal]).await;
        let report = outcome?;
        closed?;
        Ok(report)
    }

    async fn drive<P: ModelClient, T: ToolRunner>(
        actor: &mut SessionActor<P, T>,
        send: SendRequest,
        shown: &Cell<bool>,
    ) -> Result<Report, Failure> {
        {
            let resumed = match actor.resume().await.map_err(failed)? {
                Some((run_id, _)) => Some(result_of(actor, &run_id)?),
                None => None,
            };
            shown.set(true);
            let reply = actor.send(&send).await.map_err(failed)?;
            broca_crash_points::send_answered();
            if !reply.existing {
                actor.run_admitted().await.map_err(failed)?;
            }
            let result = result_of(actor, &reply.run_id)?;
            Ok(Report {
                resumed,
                result,
                existing: reply.existing,
            })
        }
    }
}

/// What watches `broca run`'s session: its spans from the records appended, and the
/// answer's text printed as it streams (its reasoning and a call's arguments are not, and a
/// retried attempt's text stays printed as it came) once the run asked for is the one going.
struct RunWatch {
    spans: Option<(
        std::sync::Arc<broca_otel::Traces>,
        RefCell<broca_otel::SessionSpans>,
    )>,
    display: RefCell<Box<dyn FnMut(&str)>>,
    shown: Rc<Cell<bool>>,
}

impl broca_session::Watch for RunWatch {
    fn appended(&self, a: broca_session::Appended<'_>) {
        if let Some((traces, spans)) = &self.spans {
            let done = spans.borrow_mut().observe(a.record);
            if !done.is_empty() {
                traces.offer(done);
            }
        }
    }

    fn display(&self, delta: &broca_core::DisplayDelta) {
        if let broca_core::DisplayDelta::Chunk {
            kind: broca_core::DeltaKind::Text,
            text,
            ..
        } = delta
        {
            if self.shown.get() {
                (self.display.borrow_mut())(text)
            }
        }
    }
}

/// A failure of the session's actor or of its WAL, as `broca run` says it.
fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::Failed(e.to_string())
}

fn result_of<P: ModelClient, T: ToolRunner>(
    actor: &SessionActor<P, T>,
    run_id: &str,
) -> Result<RunResult, Failure> {
    let state = actor.state();
    let index = state
        .by_run_id
        .get(run_id)
        .ok_or_else(|| Failure::Failed(format!("run {run_id} is not in the session")))?;
    Ok(broca_read::views::run_result(&state.runs[*index]))
}

/// Assembles the catalog (asking its service, when a URL names one) and installs it.
async fn load_catalog(src: &broca_catalog::load::Sources, http: &Rc<HttpClient>) {
    if src.url.is_none() && src.file.is_none() {
        return;
    }
    let fetched = match &src.url {
        Some(url) => Some(broca_provider::catalog_service::fetch(url, http).await),
        None => None,
    };
    let (catalog, notes) = broca_catalog::load::load(src, fetched);
    for n in notes {
        broca_io::errln!("broca: {n}");
    }
    broca_catalog::install(catalog);
}

/// The configured MCP servers, started (a server that does not start is reported, and its
/// tools are not offered); tool modules are refused: only module mode reaches them.
async fn start_tools(
    cfg: Option<broca_tools::config::ToolsConfig>,
    http: &Rc<HttpClient>,
) -> Result<std::sync::Arc<broca_tools::ToolServers>, Failure> {
    let Some(cfg) = cfg else {
        return Ok(broca_tools::ToolServers::none());
    };
    if !cfg.modules.is_empty() {
        return Err(Failure::Failed(
            "the tools config names tool modules; they are reached through the daemon, in \
             module mode (`broca module --subc FILE`), not by `broca run`"
                .into(),
        ));
    }
    let (servers, problems) = broca_tools::ToolServers::start(cfg, http)
        .await
        .map_err(String::from)?;
    for p in problems {
        broca_io::errln!("broca: {p}; its tools are not offered");
    }
    Ok(servers)
}

/// Catches the store up with the WALs `wals` on the blocking pool, off the run's path. A
/// failure loses nothing (the WAL is authoritative and the store catches up later): it is
/// said on stderr.
async fn project(state_dir: PathBuf, wals: Vec<PathBuf>) {
    let projected = broca_io::blocking::run(broca_io::blocking::Kind::StoreWrite, move || {
        let (store, notes) = broca_store::Store::open(&state_dir)?;
        for wal in wals {
            store.catch_up(&wal)?;
        }
        Ok::<_, String>(notes)
    })
    .await;
    match projected {
        Ok(notes) => notes
            .into_iter()
            .for_each(|n| broca_io::errln!("broca: {n}")),
        Err(e) => broca_io::errln!("broca: {e}"),
    }
}

/// What `broca import` hears of each log: the session it went into and what was imported,
/// or why it was not (nothing was written for it then).
pub type ImportReport<'a> =
    Box<dyn FnMut(&std::path::Path, Result<(SessionTriple, ImportReply), Failure>) + 'a>;

/// Imports `files` (logs of `format`) into their sessions in this process, one after
/// another, each one durable record or nothing; `progress` hears the bytes read of the
/// current log. Answers how many failed.
pub fn import_logs(
    state_dir: PathBuf,
    format: broca_import::Format,
    files: Vec<PathBuf>,
    target: ImportTarget,
    mut report: ImportReport<'_>,
    progress: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<usize, Failure> {
    let wal_dir = state_dir.join("wal");
    broca_owner_only::create_dir(&wal_dir)
        .map_err(|e| Failure::Failed(format!("cannot create {}: {e}", wal_dir.display())))?;
    let failed = broca_shards::run_local(async move {
        let mut failed = 0;
        let mut touched = Vec::new();
        for path in files {
            let imported = import_one(&wal_dir, format, &path, &target, progress.clone()).await;
            if let Ok((triple, _)) = &imported {
                touched.push(broca_wal_writer::wal_path(&wal_dir, triple));
            }
            failed += usize::from(imported.is_err());
            report(&path, imported);
        }
        project(state_dir, touched).await;
        failed
    })
    .map_err(|e| Failure::Failed(format!("cannot start the executor: {e}")))?;
    Ok(failed)
}

async fn import_one(
    wal_dir: &std::path::Path,
    format: broca_import::Format,
    path: &std::path::Path,
    target: &ImportTarget,
    progress: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
) -> Result<(SessionTriple, ImportReply), Failure> {
    let (triple, input) = broca_session::read_source(format, path, target).map_err(failed)?;
    // A log imported as it is already, or refused: answered from a read of the WAL, which
    // opening it for writes (a lease record) would not leave as it was.
    let wal = broca_wal_writer::wal_path(wal_dir, &triple);
    let checked = {
        let input = input.clone();
        broca_io::blocking::run(broca_io::blocking::Kind::Import, move || {
            broca_session::check_read_only(&wal, &input)
        })
        .await
    };
    if let Some(reply) = checked.map_err(failed)? {
        return Ok((triple, reply));
    }
    let mut actor = SessionActor::opener(wal_dir, &triple, Rc::new(NoModel), Rc::new(NoTools))
        .log(broca_crash_points::log_config())
        .hooks(Rc::new(broca_crash_points::KillPoints))
        .open()
        .await
        .map_err(failed)?;
    let imported = actor
        .import(input, Box::new(move |bytes| progress(bytes)))
        .await
        .map_err(failed);
    let closed = actor.close().await.map_err(failed);
    let reply = imported?;
    closed?;
    Ok((triple, reply))
}
