//! The adapter's broca module: its daemon stand-in, its configs, its process.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use cortexkit_role_harness::HarnessError;
use serde_json::json;

use crate::daemon::Daemon;
use crate::subject::{Module, Subject};
use crate::tools::MODULE;

impl Subject {
    /// Starts the daemon stand-in and `broca module` under `root`, connected to it.
    pub(crate) async fn start(&self, root: &Path) -> Result<Module, HarnessError> {
        let fail =
            |what: &str, e: &dyn std::fmt::Display| HarnessError::new(format!("{what}: {e}"));
        let daemon_dir = root.join("daemon");
        std::fs::create_dir_all(&daemon_dir).map_err(|e| fail("the daemon's folder", &e))?;
        let _ = std::fs::remove_file(arm_file(root));
        self.bus.watch_wal_dir(root.join("state").join("wal"));
        let daemon = Daemon::start(&daemon_dir, self.tools.clone(), self.bus.clone())
            .await
            .map_err(|e| fail("the daemon", &e))?;
        let tools = root.join("tools.json");
        std::fs::write(
            &tools,
            json!({"modules": [{"module": MODULE, "call_timeout_ms": 60000}]}).to_string(),
        )
        .map_err(|e| fail("the tools config", &e))?;
        // The archive prunes reasoning as it packs (`archive_prunes_reasoning`); sends may
        // carry a fetch plan (`plans`) and an ordered delivery (`delivery_order`).
        let config = root.join("broca.json");
        let settings = json!({"prune_reasoning": true, "plans": true, "delivery_order": true,
                              "compaction_providers": true});
        std::fs::write(&config, settings.to_string()).map_err(|e| fail("broca's config", &e))?;
        let catalog = root.join("catalog.json");
        std::fs::write(
            &catalog,
            crate::structured::catalog(&self.model.url).to_string(),
        )
        .map_err(|e| fail("the catalog overrides", &e))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("broca.log"))
            .map_err(|e| fail("broca's log", &e))?;
        let mut cmd = crate::support::broca(&root.join("state"));
        cmd.env("ANTHROPIC_API_KEY", "sk-conformance-0123456789abcdef")
            .env("BROCA_BASE_URL_ANTHROPIC", &self.model.url)
            .env("OPENAI_API_KEY", "sk-conformance-0123456789abcdef")
            .env("BROCA_BASE_URL_OPENAI", &self.model.url)
            .env("BROCA_CATALOG_FILE", &catalog)
            .env("BROCA_CRASH_ARM", arm_file(root))
            // The power-loss mode: a WAL's bytes reach its file only with their fdatasync, each
            // held 5 ms, so what the file shows is what is durable (the bus's publish-time
            // check of step hints reads it). Kill points keep waiting for durability.
            .env("BROCA_POWER_LOSS", root.join("power-ledger"))
            .env("BROCA_POWER_LOSS_SYNC_MS", "5")
            .env("BROCA_POWER_LOSS_KILLS", "durable")
            .env("BROCA_LOG", "info")
            .args(["module", "--subc"])
            .arg(&daemon.file)
            .args(["--shards", "2", "--grace-secs", "2", "--tools-config"])
            .arg(&tools)
            .arg("--config")
            .arg(&config)
            // The logs `import` writes for session.import are in this folder.
            .arg("--import-root")
            .arg(root)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| fail("starting broca", &e))?;
        let link = daemon
            .module(Duration::from_secs(30))
            .await
            .map_err(|e| fail("broca's module connection", &e))?;
        self.live.started(&link, root);
        Ok(Module {
            root: root.to_path_buf(),
            child: Mutex::new(Some(child)),
            daemon: Mutex::new(Some(daemon)),
            link: Mutex::new(link),
        })
    }
}

pub(crate) fn arm_file(root: &Path) -> PathBuf {
    root.join("crash-arm")
}
