//! The suite's retention hooks on broca: the retention clock moved by the debug build's
//! `broca.debug.advance_clock` (on every live module, which expires what is then due before
//! it answers), and deletion inspected on disk: the tombstone written, and nothing of the
//! expired record left (its WAL, media, archived copies, its listing among the sessions kept).

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use cortexkit_role_harness::HarnessError;
use cortexkit_role_llm_runner_conformance::{Reply, RunnerRoute};
use serde_json::json;

use crate::daemon::Link;
use crate::route::Route;

/// The connections of the modules started: the live ones' clock moved, a session's
/// debug hooks asked.
#[derive(Default)]
pub struct Live {
    /// Each module's connection and its state root.
    links: Mutex<Vec<(Weak<Link>, std::path::PathBuf)>>,
}

impl Live {
    pub fn started(&self, link: &Arc<Link>, root: &Path) {
        let mut links = self.links.lock().unwrap();
        links.retain(|(l, _)| l.strong_count() > 0);
        links.push((Arc::downgrade(link), root.to_path_buf()));
    }

    /// The newest live module's connection and state root.
    fn newest(&self) -> Option<(Arc<Link>, std::path::PathBuf)> {
        self.links
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find_map(|(l, root)| l.upgrade().map(|l| (l, root.clone())))
    }

    /// The newest live module's state root.
    pub fn root(&self) -> Option<std::path::PathBuf> {
        self.newest().map(|(_, root)| root)
    }

    /// Moves every live module's clock forward by `ms`; each answers once what was then due
    /// is expired and deleted.
    pub async fn advance(&self, harness: &str, ms: u64) -> Result<(), HarnessError> {
        let links: Vec<Arc<Link>> = self
            .links
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(l, _)| l.upgrade())
            .collect();
        let mut moved = 0;
        for link in links {
            let Ok(route) = Route::bind(link, harness, "cf-retention-clock").await else {
                continue; // a module killed or stopped
            };
            match route
                .request("broca.debug.advance_clock", json!({"ms": ms}))
                .await
            {
                Ok(Reply::Response(_)) => moved += 1,
                Ok(Reply::Error(e)) => {
                    return Err(HarnessError::new(format!(
                        "broca refused to move its clock: {} {}",
                        e.code, e.message
                    )))
                }
                Err(_) => continue,
            }
        }
        if moved == 0 {
            return Err(HarnessError::new("no live module to move the clock of"));
        }
        Ok(())
    }

    /// Asks the live module `method` on the route of `session` (the owner's, without a
    /// scope): its answer, or why there is none.
    pub async fn on_session(
        &self,
        harness: &str,
        session: &str,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, HarnessError> {
        self.on_session_as(crate::subject::OWNER, harness, session, method, params)
            .await
    }

    /// [`Live::on_session`] as the caller the daemon attests as `principal`.
    pub async fn on_session_as(
        &self,
        principal: &str,
        harness: &str,
        session: &str,
        method: &str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, HarnessError> {
        let (link, _) = self
            .newest()
            .ok_or_else(|| HarnessError::new("no live module"))?;
        let route = Route::bind_as(link, harness, session, principal)
            .await
            .map_err(HarnessError::new)?;
        match route.request(method, params).await {
            Ok(Reply::Response(v)) => Ok(v),
            Ok(Reply::Error(e)) => Err(HarnessError::new(format!(
                "{method} refused: {} {}",
                e.code, e.message
            ))),
            Err(e) => Err(HarnessError::new(format!("{method}: {e:?}"))),
        }
    }
}

/// Whether the expired record of `session` (harness `harness`, on a route without a scope:
/// project root `/`) is deleted under `root`'s state dir: its tombstone is there, and its WAL
/// (of the tombstone's lineage), media, archived copies and listing are not.
/// A starter under a parent's scope, and the parent: the scope carries no folder, so both
/// routes name the same session (project root `/`).
pub fn scope_stamps() -> (
    cortexkit_role_harness::RouteStamp,
    cortexkit_role_harness::RouteStamp,
) {
    let parent = "reserved:conformance-parent";
    let scope = cortexkit_role_harness::ScopeStamp {
        owner: parent.into(),
        scope_ref: "cf-retention-scope".into(),
        scope_epoch: 1,
    };
    let stamp = |principal: &str| cortexkit_role_harness::RouteStamp {
        principal: principal.into(),
        scope: Some(scope.clone()),
    };
    (stamp("reserved:conformance-starter"), stamp(parent))
}

pub fn deletion_finished(root: &Path, harness: &str, session: &str) -> Result<bool, HarnessError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| HarnessError::new(format!("{what}: {e}"));
    let triple = broca::wal::SessionTriple::new(broca::daemon::NO_WORKDIR_ROOT, harness, session)
        .map_err(|e| fail("the session's triple", &e))?;
    let addr = triple.address().to_string();
    let state = root.join("state");
    let tomb = state.join("tombstones").join(format!("{addr}.json"));
    let Ok(bytes) = std::fs::read(&tomb) else {
        return Ok(false);
    };
    let stone: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| fail("the tombstone", &e))?;
    let lineage = stone["lineage"].as_str().unwrap_or_default().to_string();
    let wal = state.join("wal").join(format!("{addr}.wal"));
    if let Ok(read) = broca::read::read_session(&wal, broca::read::Keep::State) {
        if read.is_some_and(|r| r.lineage == lineage) {
            return Ok(false);
        }
    }
    Ok(!state.join("media").join(&addr).exists()
        && !state
            .join("retention")
            .join(format!("{addr}.json"))
            .exists()
        && !broca::wal::archive::is_archived(&wal))
}
