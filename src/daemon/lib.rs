//! broca-daemon: module mode (`broca module --subc FILE`, `ck-broca`), broca as a supervised
//! module of the subconscious daemon and its llm-runner, a front of the host (broca-host).
//! broca registers before anything slow starts (connection file, handshake, HELLO over a
//! blocking socket: a daemon that cannot be reached or refuses is one line and exit 1, never a
//! fall back to listening); the registered connection is then served on shard 0
//! ([`front`]), its routes' requests executed by the host. The daemon's other services are
//! reached over connections of their own: the claustrum vault ([`vault`]), the bus's ckbus
//! for the `step.finished.v1` hints (`broca_subc::bus`, a thread of its own) and, shared by
//! every shard, tool modules and the fusiform catalog (`broca_tools::modules`).
//!
//! Where things are: module mode: registration (warming, then `catalog.update` with `ready:
//! true` once `Host::is_ready`), then the daemon's routes on shard 0 as a front of the host
//! (`front.rs`: binds, health, the drain and its deadline (`Host::stop_by`), GOODBYE on each
//! route then channel 0, requests and subscriptions), broca's scopes as their owner
//! (`front/scopes.rs`), the connection's per-route bounded egress (`front/egress.rs`),
//! readiness and `health.check` (`front/health.rs`), the daemon's claustrum vault (broca-
//! provider's `vault.rs`)

mod front;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use broca_host::{Extras, Front, Host, HostOptions, Running, ShardFront, Startup};
use broca_host::{Stage, StartError};
use broca_subc::negotiated::Negotiated;
use broca_tools::modules::ModuleTools;

pub use front::NO_WORKDIR_ROOT;

/// How module mode runs.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub host: HostOptions,
    /// The daemon's owner-only connection file.
    pub connection_file: PathBuf,
    /// The module id broca registers as (`SUBC_MODULE_ID`, default `ck-broca`).
    pub module_id: String,
    /// The launch nonce the daemon handed this process, if any (never logged).
    pub launch_nonce: Option<String>,
}

/// Registers with the daemon (HELLO, naming what broca consumes: the vault, the catalog
/// module, the tool modules). Answers the connection and the values the daemon's HELLO_ACK
/// settled.
fn register(opts: &DaemonOptions) -> Result<(front::SubcConn, Negotiated), StartError> {
    let mut services = vec![
        broca_subc::vault::CLAUSTRUM.to_string(),
        broca_subc::bus::CKBUS.to_string(),
    ];
    services.extend(opts.host.catalog.module.clone());
    let tool_modules = opts
        .host
        .tools
        .iter()
        .flat_map(|t| t.modules.iter().map(|m| m.module.clone()))
        .collect();
    let consumes = broca_subc::manifest::Consumes {
        tool_modules,
        services,
    };
    let hello = broca_subc::manifest::hello(
        &opts.module_id,
        env!("CARGO_PKG_VERSION"),
        opts.launch_nonce.clone(),
        &consumes,
    );
    let r = broca_subc::connect::connect(&opts.connection_file, &hello)
        .map_err(StartError::at(Stage::Front))?;
    let (negotiated, notes) = Negotiated::of(&r.ack);
    for n in notes {
        tracing::warn!("{n}");
    }
    let conn = front::SubcConn {
        stream: r.stream,
        decoder: r.decoder,
        scopes: None,
        negotiated: negotiated.clone(),
    };
    Ok((conn, negotiated))
}

/// Whether broca owns its sessions' scopes and opens their tool routes under them: the
/// daemon admits scoped routes (`scopes/v1` in its HELLO_ACK, and the owner's scope ops) and broca is a supervised
/// launch (its launch nonce makes the routes' opener the scopes' owner). Else the routes
/// open unscoped, and a tool module learns no session folder; said once, when broca has
/// tool modules.
fn owns_scopes(opts: &DaemonOptions, negotiated: &Negotiated) -> bool {
    let has_tools = opts
        .host
        .tools
        .as_ref()
        .is_some_and(|t| !t.modules.is_empty());
    match (negotiated.admits_scopes(), opts.launch_nonce.is_some()) {
        (true, true) => true,
        (false, _) if has_tools => {
            tracing::warn!(
                "the daemon does not advertise scopes/v1: tool modules' routes open unscoped \
                 (a tool module learns no session folder)"
            );
            false
        }
        (true, false) if has_tools => {
            tracing::warn!(
                "broca has no launch nonce, so it cannot own scopes: tool modules' routes \
                 open unscoped (a tool module learns no session folder)"
            );
            false
        }
        _ => false,
    }
}

/// What module mode hands the host: the tool modules, the vault and the bus, over routes of
/// their own.
fn extras(
    opts: &DaemonOptions,
    scopes: Option<broca_subc::scope::Scopes>,
) -> Result<Extras, StartError> {
    let cfg = opts.host.tools.clone().unwrap_or_default();
    let module_tools = ModuleTools::new(
        opts.connection_file.clone(),
        opts.module_id.clone(),
        opts.launch_nonce.clone(),
        cfg.modules,
        cfg.result_bytes_max,
        scopes,
    );
    let client = broca_subc::vault::VaultClient::new(
        opts.connection_file.clone(),
        opts.module_id.clone(),
        opts.launch_nonce.clone(),
    );
    let vault: Arc<dyn broca_provider::credential::Vault> =
        Arc::new(broca_provider::vault::ClaustrumVault::new(client));
    let ckbus = broca_subc::bus::Ckbus::new(
        opts.connection_file.clone(),
        opts.module_id.clone(),
        opts.launch_nonce.clone(),
    );
    let step_hints = broca_host::StepHints {
        runner: opts.module_id.clone(),
        publisher: Arc::new(
            broca_subc::bus::Publisher::start(Arc::new(ckbus))
                .map_err(StartError::at(Stage::Parts))?,
        ),
    };
    Ok(Extras {
        module_tools: Some(module_tools),
        vault: Some(vault),
        step_hints: Some(step_hints),
        policy_required: true,
    })
}

/// The registered connection, served on shard 0.
struct SubcShard {
    conn: front::SubcConn,
    lost: Arc<AtomicBool>,
}

impl ShardFront for SubcShard {
    fn start(
        self: Box<Self>,
        host: Arc<Host>,
    ) -> broca_host::LocalBoxFuture<'static, Result<Box<dyn Running>, StartError>> {
        Box::pin(async move {
            let closer = front::run(host, self.conn, self.lost).await?;
            Ok(Box::new(closer) as Box<dyn Running>)
        })
    }
}

/// Runs module mode until the daemon or a signal stops it. Returns the signal to re-raise
/// (0: the daemon asked). `Err` is one line: the daemon could not be reached or refused, or
/// the connection ended unannounced (then the runs were sealed first).
pub fn run(opts: DaemonOptions) -> Result<i32, StartError> {
    let startup = Startup::begin(opts.host.clone())?;
    // Registered first: a daemon that cannot be reached or refuses is an error at once.
    let (mut conn, negotiated) = register(&opts)?;
    let scopes = owns_scopes(&opts, &negotiated).then(|| {
        let (scopes, asks) = broca_subc::scope::Scopes::new(&opts.module_id);
        conn.scopes = Some(asks);
        scopes
    });
    let lost = Arc::new(AtomicBool::new(false));
    let mut info = serde_json::Map::new();
    info.insert("module".into(), true.into());
    let shard0: Box<dyn ShardFront> = Box::new(SubcShard {
        conn,
        lost: lost.clone(),
    });
    let front = Front {
        info,
        ready: format!("broca registered with the daemon as {}", opts.module_id),
        shards: vec![Some(shard0)],
    };
    let sig = startup.run(front, extras(&opts, scopes)?)?;
    if lost.load(Ordering::Acquire) {
        return Err(StartError::new(
            Stage::Front,
            "the daemon connection ended unannounced: admission stopped, active runs got the \
             grace period and the rest were sealed interrupted",
        ));
    }
    Ok(sig)
}
