//! `broca serve`'s and `broca module`'s options: the flags, the `--config` file, and the host
//! options made of them.

use super::*;

/// The `--config` file of serve.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeConfig {
    listen: Option<String>,
    socket: Option<PathBuf>,
    shards: Option<usize>,
    grace_secs: Option<u64>,
    idle_secs: Option<u64>,
    open_sessions_max: Option<usize>,
    wait_for_room_secs: Option<u64>,
    catalog_file: Option<PathBuf>,
    catalog_url: Option<String>,
    catalog_module: Option<String>,
    catalog_refresh_secs: Option<u64>,
    archive_after_days: Option<u64>,
    archive_every_secs: Option<u64>,
    prune_reasoning: Option<bool>,
    plans: Option<bool>,
    delivery_order: Option<bool>,
    compaction_providers: Option<bool>,
    plan_fetch_deadline_ms: Option<u64>,
    body_limit_bytes: Option<usize>,
    request_timeout_ms: Option<u64>,
    #[serde(default)]
    base_urls: std::collections::BTreeMap<String, String>,
    import_roots: Option<Vec<PathBuf>>,
    plain_http: Option<bool>,
}

/// The flags `broca serve` and `broca module` share, as given.
struct ServeFlags {
    listen: Option<String>,
    socket: Option<PathBuf>,
    shards: Option<usize>,
    grace: Option<u64>,
    config: Option<PathBuf>,
    tools: Option<String>,
    import_roots: Vec<PathBuf>,
}

fn serve_flags(pargs: &mut pico_args::Arguments) -> Result<ServeFlags, String> {
    let listen: Option<String> = pargs
        .opt_value_from_str("--listen")
        .map_err(|e| format!("--listen: {e}"))?;
    let socket: Option<PathBuf> = pargs
        .opt_value_from_str("--socket")
        .map_err(|e| format!("--socket: {e}"))?;
    let shards: Option<usize> = pargs
        .opt_value_from_str("--shards")
        .map_err(|e| format!("--shards: {e}"))?;
    let grace: Option<u64> = pargs
        .opt_value_from_str("--grace-secs")
        .map_err(|e| format!("--grace-secs: {e}"))?;
    let config: Option<PathBuf> = pargs
        .opt_value_from_str("--config")
        .map_err(|e| format!("--config: {e}"))?;
    let tools: Option<String> = pargs
        .opt_value_from_str("--tools-config")
        .map_err(|e| format!("--tools-config: {e}"))?;
    let import_roots: Vec<PathBuf> = pargs
        .values_from_str("--import-root")
        .map_err(|e| format!("--import-root: {e}"))?;
    Ok(ServeFlags {
        listen,
        socket,
        shards,
        grace,
        config,
        tools,
        import_roots,
    })
}

/// Refuses a `--listen` address other hosts can reach unless `--plain-http` says that is
/// meant: serve speaks plain HTTP, and every request carries the bearer handle in clear.
fn plain_off_host(listen: std::net::SocketAddr, plain_http: bool) -> Result<(), String> {
    if listen.ip().is_loopback() || plain_http {
        return Ok(());
    }
    Err(format!(
        "--listen {listen} is reachable from other hosts, and serve speaks plain HTTP: every \
         request would carry the bearer handle (and every prompt and answer) across the network \
         in clear. Listen on 127.0.0.1 (or the Unix socket), or put a TLS-terminating proxy in \
         front and give --plain-http to say so"
    ))
}

/// The `--config` file, or the defaults.
fn serve_config(config: Option<&PathBuf>) -> Result<ServeConfig, String> {
    Ok(match config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--config {}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("--config {}: {e}", path.display()))?
        }
        None => ServeConfig::default(),
    })
}

pub(super) fn parse_serve(
    pargs: &mut pico_args::Arguments,
    state_dir: Option<PathBuf>,
) -> Result<ServeOptions, String> {
    let plain_http = pargs.contains("--plain-http");
    let f = serve_flags(pargs)?;
    rest(std::mem::replace(
        pargs,
        pico_args::Arguments::from_vec(Vec::new()),
    ))?;
    let file = serve_config(f.config.as_ref())?;
    let plain_http = plain_http || file.plain_http.unwrap_or(false);
    let listen_text = f
        .listen
        .clone()
        .or(file.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:7411".into());
    let listen = listen_text.parse().map_err(|_| {
        format!("--listen `{listen_text}` is not an address such as 127.0.0.1:7411")
    })?;
    plain_off_host(listen, plain_http)?;
    let mut limits = broca_io::http_server::ServerLimits::default();
    if let Some(n) = file.body_limit_bytes {
        limits.body_bytes_max = n;
    }
    let socket = f.socket.clone().or(file.socket.clone());
    let request_timeout =
        std::time::Duration::from_millis(file.request_timeout_ms.unwrap_or(15_000));
    Ok(ServeOptions {
        host: host_options(&f, file, state_dir)?,
        listen,
        socket,
        limits,
        request_timeout,
    })
}

/// The host's options from the flags and the config file.
fn host_options(
    f: &ServeFlags,
    file: ServeConfig,
    state_dir: Option<PathBuf>,
) -> Result<broca_host::HostOptions, String> {
    let shards = f
        .shards
        .or(file.shards)
        .unwrap_or_else(broca_shards::available_cores);
    if !(1..=1024).contains(&shards) {
        return Err(format!("--shards {shards}: use 1 to 1024"));
    }
    let state_dir = resolve_state_dir(state_dir)
        .ok_or("no state dir: set --state-dir, BROCA_STATE_DIR or HOME")?;
    let endpoints = endpoints(&file)?;
    let grace = f.grace;
    let tools = f.tools.clone();
    let import_roots = import_roots(f, &file)?;
    let catalog = catalog_sources(&state_dir, &file);
    Ok(broca_host::HostOptions {
        import_roots,
        state_dir,
        shards,
        grace: std::time::Duration::from_secs(grace.or(file.grace_secs).unwrap_or(5)),
        idle: std::time::Duration::from_secs(file.idle_secs.unwrap_or(30)),
        open_sessions_max: file.open_sessions_max,
        wait_for_room: std::time::Duration::from_secs(file.wait_for_room_secs.unwrap_or(60).max(1)),
        catalog_refresh: std::time::Duration::from_secs(file.catalog_refresh_secs.unwrap_or(300)),
        archive_after: file
            .archive_after_days
            .map(|d| std::time::Duration::from_secs(d.saturating_mul(86_400))),
        archive_every: std::time::Duration::from_secs(file.archive_every_secs.unwrap_or(3600)),
        prune_reasoning: file.prune_reasoning.unwrap_or(false),
        plans: file.plans.unwrap_or(false),
        delivery_order: file.delivery_order.unwrap_or(false),
        compaction_providers: file.compaction_providers.unwrap_or(false),
        plan_fetch_deadline: std::time::Duration::from_millis(
            file.plan_fetch_deadline_ms.unwrap_or(10_000).max(1),
        ),
        catalog,
        tools: match tools {
            Some(path) => Some(broca_tools::config::ToolsConfig::load(
                std::path::Path::new(&path),
            )?),
            None => None,
        },
        endpoints,
    })
}

/// The providers' endpoints: the environment's, with the config's `base_urls` over them.
fn endpoints(file: &ServeConfig) -> Result<Endpoints, String> {
    let mut endpoints = Endpoints::from_env()?;
    for (provider, url) in &file.base_urls {
        broca_catalog::provider(provider)
            .ok_or_else(|| format!("--config: unknown provider `{provider}` in base_urls"))?;
        endpoints
            .set(provider, url)
            .map_err(|e| format!("--config: base_urls.{provider}: {e}"))?;
    }
    Ok(endpoints)
}

/// The folders `session.import` reads from: the flags', else the config's, else where
/// Claude Code and Codex keep their logs; each absolute.
fn import_roots(f: &ServeFlags, file: &ServeConfig) -> Result<Vec<PathBuf>, String> {
    let roots = if !f.import_roots.is_empty() {
        f.import_roots.clone()
    } else if let Some(roots) = file.import_roots.clone() {
        roots
    } else {
        default_import_roots()
    };
    if let Some(root) = roots.iter().find(|r| !r.is_absolute()) {
        return Err(format!(
            "--import-root {}: give an absolute folder",
            root.display()
        ));
    }
    Ok(roots)
}

/// The catalog's sources: the environment's for the state dir, the config's over them.
fn catalog_sources(
    state_dir: &std::path::Path,
    file: &ServeConfig,
) -> broca_catalog::load::Sources {
    let mut c = broca_catalog::load::Sources::from_env(state_dir);
    if file.catalog_file.is_some() {
        c.file = file.catalog_file.clone();
    }
    if file.catalog_url.is_some() {
        c.url = file.catalog_url.clone();
    }
    if file.catalog_module.is_some() {
        c.module = file.catalog_module.clone();
    }
    c
}

/// Where Claude Code and Codex keep their logs: the folders `session.import` reads from
/// unless told otherwise.
fn default_import_roots() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let under = |var: &str, dot: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(dot)))
    };
    [
        under("CLAUDE_CONFIG_DIR", ".claude").map(|d| d.join("projects")),
        under("CODEX_HOME", ".codex").map(|d| d.join("sessions")),
    ]
    .into_iter()
    .flatten()
    .collect()
}
