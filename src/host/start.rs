//! What serve starts before its shards: the catalog (assembled and installed), the store
//! with its projecting thread, and the tools (the MCP servers, and in module mode the tool
//! modules' catalogs).

use crate::error::{Stage, StartError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use broca_io::net::proxy::ProxyConfig;

use crate::HostOptions;

/// Batches of WALs that may wait for the store's thread.
const PROJECTOR_QUEUE_MAX: usize = 64;

/// Sessions whose replayed state the store's thread keeps, to project each from where its
/// last projection ended (the least lately projected are dropped first and read whole when
/// they move again).
const FOLLOWED_MAX: usize = 2048;

/// The store's thread: catches up with WALs written while serve was down, then with each
/// batch of WALs the shards say moved on (a path sent twice is projected once per batch,
/// with the messages handed over last), reading each from where its last projection ended.
fn project_on_this_thread(
    store: &broca_store::Store,
    wal_dir: &Path,
    rx: &std::sync::mpsc::Receiver<Vec<broca_store::Moved>>,
    caught_up: std::sync::mpsc::Sender<()>,
) {
    catch_up(store, wal_dir);
    let _ = caught_up.send(());
    let mut follower = broca_store::Follower::new(FOLLOWED_MAX);
    // WALs whose projection failed (a full disk, say) are tried again, at growing intervals,
    // until they project: the store catches up on its own once the cause is gone. With none
    // pending the thread sleeps until the shards hand it more.
    let (mut pending, mut wait) = (Vec::<broca_store::Moved>::new(), RETRY_FIRST);
    loop {
        let retrying = !pending.is_empty();
        let Some(mut batch) = next_batch(rx, retrying.then_some(wait)) else {
            return;
        };
        // A failed batch's sessions first: what was handed over since is newer.
        pending.append(&mut batch);
        let batch = one_each(std::mem::take(&mut pending));
        let failed = match follower.catch_up_moved(store, &batch) {
            Ok(failed) => {
                failed.iter().for_each(|e| tracing::error!("store: {e}"));
                !failed.is_empty()
            }
            Err(e) => {
                tracing::error!("{e}");
                true
            }
        };
        if failed {
            wait = if retrying {
                (wait * 2).min(RETRY_MAX)
            } else {
                RETRY_FIRST
            };
            tracing::warn!(
                wals = batch.len(),
                retry_in_secs = wait.as_secs(),
                "store: projection failed; trying again"
            );
            pending = batch;
        }
    }
}

/// Catches up with the WALs written while serve was down, and says how it went.
fn catch_up(store: &broca_store::Store, wal_dir: &Path) {
    match store.catch_up_all(wal_dir) {
        Ok(pass) => {
            for f in pass.failed {
                tracing::error!("store: {f}");
            }
            tracing::info!(
                sessions = pass.sessions,
                projected = pass.projected,
                facts = pass.facts,
                "store caught up with the WALs"
            );
        }
        Err(e) => tracing::error!("{e}"),
    }
}

/// The next batch the shards hand over, with those queued behind it (empty when `wait`, a
/// retry's, passes first); `None` once the shards are gone.
fn next_batch(
    rx: &std::sync::mpsc::Receiver<Vec<broca_store::Moved>>,
    wait: Option<std::time::Duration>,
) -> Option<Vec<broca_store::Moved>> {
    let taken = || STORE_QUEUE.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    let mut batch = match wait {
        None => rx.recv().ok()?,
        Some(wait) => match rx.recv_timeout(wait) {
            Ok(b) => b,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Some(Vec::new()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
        },
    };
    taken();
    while let Ok(more) = rx.try_recv() {
        taken();
        batch.extend(more);
    }
    Some(batch)
}

/// The sessions of `batch` once each, in the order of their paths: a session handed over
/// more than once keeps the messages of its last hand-off that had any.
fn one_each(batch: Vec<broca_store::Moved>) -> Vec<broca_store::Moved> {
    let mut by_path: std::collections::BTreeMap<PathBuf, broca_store::Moved> = Default::default();
    for m in batch {
        match by_path.entry(m.path.clone()) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(m);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                if !m.messages.is_empty() {
                    o.get_mut().messages = m.messages;
                }
            }
        }
    }
    by_path.into_values().collect()
}

/// How soon a failed projection is tried again, first and at most.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Assembles the catalog (asking its service, if any) and installs it for this process.
pub(crate) fn load_catalog(
    opts: &HostOptions,
    tls: &Arc<broca_io::net::rustls::ClientConfig>,
    proxy: &ProxyConfig,
    modules: Option<Arc<broca_tools::modules::ModuleTools>>,
) -> Result<(), StartError> {
    let (tls, proxy, sources) = (tls.clone(), proxy.clone(), opts.catalog.clone());
    let (catalog, notes) = broca_shards::run_local(async move {
        let http = broca_io::net::HttpClient::new(broca_io::net::ClientConfig::new(tls, proxy));
        load(&sources, &http, modules.as_deref()).await
    })
    .map_err(|e| StartError::new(Stage::Parts, format!("cannot load the catalog: {e}")))?;
    for n in notes {
        tracing::error!("{n}");
    }
    broca_catalog::install(catalog);
    Ok(())
}

/// The store as serve opened it.
pub(crate) struct OpenedStore {
    pub store: Option<Arc<broca_store::Store>>,
    pub projector: Option<Mutex<std::sync::mpsc::SyncSender<Vec<broca_store::Moved>>>>,
    /// Says when the store has caught up with the WALs at start.
    pub caught_up: Option<std::sync::mpsc::Receiver<()>>,
}

/// The store, with its own thread projecting what the shards hand it; `None` (and the WALs
/// serve everything) when it cannot be opened.
pub(crate) fn open_store(state_dir: &Path, wal_dir: &Path) -> Result<OpenedStore, StartError> {
    match broca_store::Store::open(state_dir) {
        Ok((store, notes)) => {
            for n in notes {
                tracing::warn!("{n}");
            }
            let store = Arc::new(store);
            let (tx, rx) =
                std::sync::mpsc::sync_channel::<Vec<broca_store::Moved>>(PROJECTOR_QUEUE_MAX);
            let (done, caught_up) = std::sync::mpsc::channel();
            let (s, dir) = (store.clone(), wal_dir.to_path_buf());
            std::thread::Builder::new()
                .name("store".into())
                .spawn(move || project_on_this_thread(&s, &dir, &rx, done))
                .map_err(|e| {
                    StartError::new(Stage::Parts, format!("cannot start the store thread: {e}"))
                })?;
            Ok(OpenedStore {
                store: Some(store),
                projector: Some(Mutex::new(tx)),
                caught_up: Some(caught_up),
            })
        }
        Err(e) => {
            tracing::error!("{e}; serving from the WALs alone");
            Ok(OpenedStore {
                store: None,
                projector: None,
                caught_up: None,
            })
        }
    }
}

/// The configured MCP tool servers, started once for every shard, and in module mode the
/// tool modules' catalogs (their tools offered beside the servers'), with the modules that
/// did not answer (asked again while broca serves: `Shard::pick_up_tool_modules`).
pub(crate) fn start_tools(
    opts: &HostOptions,
    tls: &Arc<broca_io::net::rustls::ClientConfig>,
    proxy: &ProxyConfig,
    modules: Option<Arc<broca_tools::modules::ModuleTools>>,
) -> Result<(Arc<broca_tools::ToolServers>, Vec<String>), StartError> {
    let Some(cfg) = opts.tools.clone() else {
        return Ok((broca_tools::ToolServers::none(), Vec::new()));
    };
    if !cfg.modules.is_empty() && modules.is_none() {
        return Err(StartError::new(
            Stage::Parts,
            format!(
                "the tools config names tool modules ({}); they are reached through the daemon: \
             run `broca module --subc FILE`",
                cfg.modules
                    .iter()
                    .map(|m| m.module.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let (tls, proxy) = (tls.clone(), proxy.clone());
    let (servers, problems, missing) = broca_shards::run_local(async move {
        let http = broca_tools::tool_http_client(tls, proxy);
        let (servers, mut problems) = broca_tools::ToolServers::start(cfg, &http).await?;
        let Some(modules) = modules else {
            return Ok::<_, String>((servers, problems, Vec::new()));
        };
        let catalogs = modules.catalogs().await;
        problems.extend(catalogs.problems);
        problems.extend(servers.add(catalogs.specs));
        Ok((servers, problems, catalogs.missing))
    })
    .map_err(|e| StartError::new(Stage::Parts, format!("cannot start the tool servers: {e}")))?
    .map_err(StartError::at(Stage::Parts))?;
    for p in problems {
        tracing::error!("{p}; its tools are not offered");
    }
    Ok((servers, missing))
}

/// The catalog assembled from `src`, asking its service (when it has one) first, and the
/// lines the operator should be told. The service is the catalog module when `src` names one
/// (reached through `modules`, module mode only), else the URL.
pub(crate) async fn load(
    src: &broca_catalog::load::Sources,
    http: &std::rc::Rc<broca_io::net::HttpClient>,
    modules: Option<&broca_tools::modules::ModuleTools>,
) -> (broca_catalog::Catalog, Vec<String>) {
    let fetched = match (&src.module, &src.url, modules) {
        (Some(m), _, Some(modules)) => Some(
            modules
                .catalog_text(m)
                .await
                .map_err(|e| broca_catalog::CatalogError::Unavailable(e.to_string())),
        ),
        (Some(_), _, None) => Some(Err(broca_catalog::CatalogError::Unavailable(
            "a catalog module is reached through the daemon, in module mode only".to_string(),
        ))),
        (None, Some(url), _) => Some(broca_provider::catalog_service::fetch(url, http).await),
        (None, None, _) => None,
    };
    broca_catalog::load::load(src, fetched)
}

/// Batches handed to the store's thread and not yet taken (for `/metrics`).
pub(crate) static STORE_QUEUE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);
