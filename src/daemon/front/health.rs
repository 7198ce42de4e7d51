//! What the daemon connection says of broca's state: readiness (`catalog.update` with
//! `ready: true` once the host has started) and `health.check`, from the shards' counters,
//! the connection's egress and the daemon's own machine id.

use std::time::Duration;

use serde_json::{json, Value};

use broca_subc::protocol::session::HealthStatus;
use broca_subc::protocol::FrameType;

use super::{Routes, READY_CORR};

/// How often the front looks whether the host has started, to say it is ready.
const READY_POLL: Duration = Duration::from_millis(10);

impl Routes {
    /// Says the module is ready for route binds (`catalog.update` with `ready: true`) once
    /// the host has started; it registered warming. The daemon's answer is only logged.
    pub(super) async fn say_ready(&self) {
        while !self.host.is_ready() {
            if self.host.is_stopping() {
                return;
            }
            glommio::timer::sleep(READY_POLL).await;
        }
        if !self
            .negotiated
            .serves(broca_subc::protocol::session::MODULE_TO_SUBC_OP_CATALOG_UPDATE)
        {
            tracing::warn!(
                "the daemon does not list catalog.update among its ops; broca says it is \
                 ready anyway"
            );
        }
        let body = serde_json::to_value(broca_subc::manifest::ready_update())
            .expect("a catalog.update serializes");
        self.reply(FrameType::Request, 0, 0, READY_CORR, &body)
            .await;
        tracing::info!("told the daemon broca is ready");
    }

    /// health.check, answered from the shards' own counters.
    pub(super) async fn health(&self) -> Value {
        let stats = self.host.stats().await;
        let sessions: usize = stats.iter().map(|s| s.sessions_live).sum();
        let runs: usize = stats.iter().map(|s| s.runs_active).sum();
        let (status, detail) = if self.host.is_stopping() {
            (
                HealthStatus::Degraded,
                Some("stopping: admission is closed"),
            )
        } else if !self.host.is_ready() {
            (
                HealthStatus::Degraded,
                Some("warming: the store, the catalog, the tools and the shards are starting"),
            )
        } else if stats.len() < self.host.shards() {
            (HealthStatus::Degraded, Some("a shard did not answer"))
        } else if self.host.storage.full_since().is_some() {
            (
                HealthStatus::Degraded,
                Some("storage_full: the file system holding the WALs is full; writes are refused, reads go on"),
            )
        } else {
            (HealthStatus::Ok, None)
        };
        let mut report = json!({
            "op": broca_subc::protocol::session::MODULE_CONTROL_OP_HEALTH_CHECK,
            "status": status,
            "metrics": {
                "shards": self.host.shards(),
                "shards_answering": stats.len(),
                "sessions_live": sessions,
                "runs_active": runs, // the gauge the manifest declares busy (RUNS_GAUGE)
                "routes": self.routes.borrow().len(),
                "requests_in_flight": self.in_flight.get(),
            },
        });
        report["metrics"]["diagnostics"] =
            broca_host::metrics::diagnostics_json(&self.host, &stats);
        // The connection's egress (egress.rs): what is queued, what its policy shed and closed.
        {
            let e = self.egress.borrow();
            report["metrics"]["egress_queued_bytes"] = json!(e.bytes());
            report["metrics"]["egress_deltas_shed"] = json!(e.shed);
            report["metrics"]["egress_routes_closed"] = json!(e.closes);
        }
        // The daemon's name for this machine, as its HELLO_ACK gave it (a name, never an
        // authority).
        if let Some(id) = &self.negotiated.machine_id {
            report["metrics"]["machine_id"] = json!(id);
        }
        if let Some((published, dropped, _)) = self.host.step_hint_counts() {
            report["metrics"]["step_hints_published"] = json!(published);
            report["metrics"]["step_hints_dropped"] = json!(dropped);
        }
        if let Some(d) = detail {
            report["detail"] = json!(d);
        }
        report
    }
}
