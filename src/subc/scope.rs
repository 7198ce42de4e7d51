//! Session scopes (the daemon's `scopes/v1`), sans-IO: broca owns one scope per session
//! whose tools it calls on a tool module, so the module's bind carries the daemon's stamp of
//! that session (its folder, the session's project root) instead of nothing.
//!
//! - The scope's ref is a digest of the session triple (project root, harness, session): two
//!   sessions that differ only in their project root have two scopes. Its epoch is the
//!   session's creation time (its WAL header's `created_unix_ms`): the same session re-sends
//!   the same epoch after any restart, and a session made again under the same triple (after
//!   a delete) a later one, so nothing of the old session carries over.
//! - broca's registered connection is the scope's owner: its first `scope.sync` (the full
//!   set, empty) takes the owner's sync authority; each new scope is then one `scope.apply`
//!   upsert, batched with the others asked meanwhile ([`Registry`]).
//! - A tool route of the session is opened under the scope ([`selector`]), by broca's
//!   consumer connection with its launch nonce: the daemon admits it because the opener is
//!   the owner.
//!
//! Past [`LIVE_MAX`] live scopes the least recently used are ended in the same `scope.apply`
//! (their routes close; a later call registers the scope again).

use std::collections::HashMap;

use serde_json::Value;
use subc_protocol::scope::{ScopeEnd, ScopeKind, ScopeRecordOutcome, CAP_SCOPES_V1};
pub use subc_protocol::scope::{ScopeRecord, ScopeSelector};
use subc_protocol::session::{ModuleControlRequestFromModule, ModuleControlResponseToModule};
use subc_protocol::{ErrorBody, FrameType, Principal};

use crate::frames::FrameIn;

/// The capability a daemon advertises (in its HELLO_ACK) when it admits routes under scopes.
pub const CAPABILITY: &str = CAP_SCOPES_V1;

/// Live scopes broca keeps at most (the daemon's own bound is 10,000 per owner).
pub const LIVE_MAX: usize = 8192;

/// The scope ref of the session (project root, harness, session).
pub fn scope_ref(project_root: &str, harness: &str, session: &str) -> String {
    let mut h = blake3::Hasher::new();
    for part in [project_root, harness, session] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let hex = h.finalize().to_hex();
    format!("broca-session:{}", &hex[..32])
}

/// The scope record of a session: a head scope whose folder is the session's project root
/// (left out when it is not an absolute path).
pub fn record(project_root: &str, harness: &str, session: &str, epoch: u64) -> ScopeRecord {
    let workdir = project_root
        .starts_with('/')
        .then(|| project_root.to_string());
    ScopeRecord::new(
        scope_ref(project_root, harness, session),
        epoch.max(1),
        ScopeKind::Head,
    )
    .with_workdir(workdir)
}

/// The `route.open` scope of a route opened under the record's scope by broca (`module_id`,
/// its owner).
pub fn selector(module_id: &str, record: &ScopeRecord) -> ScopeSelector {
    ScopeSelector::new(
        Principal::Reserved {
            module_id: module_id.to_string(),
        },
        record.scope_ref.clone(),
        Some(record.scope_epoch),
    )
}

/// What a batch of asks is sent as: its body, and the refs it registers.
#[derive(Debug)]
pub struct Batch {
    pub body: Vec<u8>,
    pub upserts: Vec<String>,
}

/// The owner's side of broca's scopes on its registered connection: which are live, the
/// generation, whether the first (full) sync went.
#[derive(Debug)]
pub struct Registry {
    generation: u64,
    synced: bool,
    /// Live scopes by ref: their epoch and when they were last asked for (a counter).
    live: HashMap<String, (u64, u64)>,
    uses: u64,
    cap: usize,
}

impl Registry {
    /// A registry whose first sync carries `generation` (any value is accepted by a daemon
    /// from a connection that has just taken sync authority: the start's Unix ms).
    pub fn new(generation: u64) -> Registry {
        Registry::with_cap(generation, LIVE_MAX)
    }

    pub fn with_cap(generation: u64, cap: usize) -> Registry {
        Registry {
            generation,
            synced: false,
            live: HashMap::new(),
            uses: 0,
            cap: cap.max(1),
        }
    }

    /// Whether `record` is live as asked (same ref, same epoch); marks it used.
    pub fn is_live(&mut self, record: &ScopeRecord) -> bool {
        self.uses += 1;
        let uses = self.uses;
        match self.live.get_mut(&record.scope_ref) {
            Some((epoch, used)) if *epoch == record.scope_epoch => {
                *used = uses;
                true
            }
            _ => false,
        }
    }

    /// The first request of the connection: the owner's full set, empty (it takes the sync
    /// authority; a scope of an earlier broca process is ended, its routes gone with it).
    /// `None` once sent.
    pub fn first_sync(&mut self) -> Option<Vec<u8>> {
        if self.synced {
            return None;
        }
        self.generation += 1;
        let sync = ModuleControlRequestFromModule::ScopeSync {
            generation: self.generation,
            scopes: Vec::new(),
        };
        Some(serde_json::to_vec(&sync).expect("a scope.sync serializes"))
    }

    /// Reads the answer to [`Registry::first_sync`]; `Err` names the daemon's refusal.
    pub fn synced(&mut self, frame: &FrameIn) -> Result<(), ScopeError> {
        match answer(frame)? {
            ModuleControlResponseToModule::ScopeSync { generation, .. } => {
                self.generation = self.generation.max(generation);
                self.synced = true;
                Ok(())
            }
            _ => Err(ScopeError::Unexpected(
                "the daemon answered scope.sync with another op".into(),
            )),
        }
    }

    /// One `scope.apply` for the records not live yet (each ref once), ending the least
    /// recently used live scopes past the cap; `None` when every one is live.
    pub fn batch(&mut self, records: &[ScopeRecord]) -> Option<Batch> {
        let mut upsert: Vec<ScopeRecord> = Vec::new();
        for r in records {
            if !self.is_live(r) && !upsert.iter().any(|u| u.scope_ref == r.scope_ref) {
                upsert.push(r.clone());
            }
        }
        if upsert.is_empty() {
            return None;
        }
        let over = (self.live.len() + upsert.len()).saturating_sub(self.cap);
        let mut by_use: Vec<(&String, &(u64, u64))> = self
            .live
            .iter()
            .filter(|(k, _)| !upsert.iter().any(|u| &u.scope_ref == *k))
            .collect();
        by_use.sort_by_key(|(_, (_, used))| *used);
        let end: Vec<ScopeEnd> = by_use
            .into_iter()
            .take(over)
            .map(|(k, (epoch, _))| ScopeEnd::new(k.clone(), *epoch))
            .collect();
        for e in &end {
            self.live.remove(&e.scope_ref);
        }
        self.generation += 1;
        let upserts = upsert.iter().map(|u| u.scope_ref.clone()).collect();
        let apply = ModuleControlRequestFromModule::ScopeApply {
            generation: self.generation,
            upsert,
            end,
        };
        Some(Batch {
            body: serde_json::to_vec(&apply).expect("a scope.apply serializes"),
            upserts,
        })
    }

    /// Reads the answer to a [`Registry::batch`]: per ref, live, or why the daemon refused it.
    /// `Err`: the whole apply was refused (nothing changed).
    pub fn applied(
        &mut self,
        frame: &FrameIn,
    ) -> Result<HashMap<String, Result<(), ScopeError>>, ScopeError> {
        let ModuleControlResponseToModule::ScopeApply {
            generation,
            results,
            ended,
            ..
        } = answer(frame)?
        else {
            return Err(ScopeError::Unexpected(
                "the daemon answered scope.apply with another op".into(),
            ));
        };
        self.generation = self.generation.max(generation);
        for e in ended {
            if self
                .live
                .get(&e.scope_ref)
                .is_some_and(|(epoch, _)| *epoch == e.scope_epoch)
            {
                self.live.remove(&e.scope_ref);
            }
        }
        let mut out = HashMap::new();
        for r in results {
            let got = match r.outcome {
                ScopeRecordOutcome::Refused => Err(ScopeError::Refused(format!(
                    "the daemon refused the session's scope ({}: {})",
                    r.code.as_deref().unwrap_or("no code"),
                    r.message.as_deref().unwrap_or("")
                ))),
                _ => {
                    self.uses += 1;
                    self.live
                        .insert(r.scope_ref.clone(), (r.scope_epoch, self.uses));
                    Ok(())
                }
            };
            out.insert(r.scope_ref, got);
        }
        Ok(out)
    }

    /// Forgets a scope the daemon no longer holds (a route under it refused as not live).
    pub fn forget(&mut self, scope_ref: &str) {
        self.live.remove(scope_ref);
    }

    pub fn live(&self) -> usize {
        self.live.len()
    }
}

/// Why a session's scope is not live: the daemon refused it (or broca's scopes), answered
/// what broca did not ask, did not answer in time, or the connection that owns the scopes is
/// gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeError {
    Refused(String),
    Unexpected(String),
    Timeout {
        op: String,
        after: std::time::Duration,
    },
    Gone,
}

impl std::fmt::Display for ScopeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScopeError::Refused(why) | ScopeError::Unexpected(why) => f.write_str(why),
            ScopeError::Timeout { op, after } => {
                write!(f, "the daemon did not answer {op} within {after:?}")
            }
            ScopeError::Gone => {
                f.write_str("the daemon connection that owns broca's scopes is gone")
            }
        }
    }
}

impl std::error::Error for ScopeError {}

/// The daemon's answer to a scope op, or its refusal as one line.
fn answer(frame: &FrameIn) -> Result<ModuleControlResponseToModule, ScopeError> {
    match frame.header.ty {
        FrameType::Response => serde_json::from_slice(&frame.body).map_err(|e| {
            ScopeError::Unexpected(format!("the daemon's scope answer does not parse: {e}"))
        }),
        FrameType::Error => {
            let e: ErrorBody = serde_json::from_slice(&frame.body).unwrap_or_else(|_| ErrorBody {
                code: "unreadable_error".into(),
                message: String::new(),
                detail: None::<Value>,
            });
            Err(ScopeError::Refused(format!(
                "the daemon refused broca's scopes ({}: {})",
                e.code, e.message
            )))
        }
        other => Err(ScopeError::Unexpected(format!(
            "a {other:?} frame answered a scope op"
        ))),
    }
}

/// One session's scope asked of the registered connection, and where its answer goes.
pub struct Ask {
    pub record: ScopeRecord,
    /// Registered again even if the registry holds it live (the daemon said it does not).
    pub fresh: bool,
    pub reply: futures_channel::oneshot::Sender<Result<(), ScopeError>>,
}

/// The asking side, shared by every shard: a tool route's opener asks the registered
/// connection (on shard 0) to make its session's scope live.
#[derive(Clone)]
pub struct Scopes {
    module_id: String,
    tx: futures_channel::mpsc::UnboundedSender<Ask>,
}

impl Scopes {
    /// The asking side for owner `module_id`, and the receiving side for its registered
    /// connection.
    pub fn new(module_id: &str) -> (Scopes, futures_channel::mpsc::UnboundedReceiver<Ask>) {
        let (tx, rx) = futures_channel::mpsc::unbounded();
        (
            Scopes {
                module_id: module_id.to_string(),
                tx,
            },
            rx,
        )
    }

    /// Makes the session's scope live (registered once; later asks are answered without a
    /// request, unless `fresh`) and
    /// answers the `route.open` scope to open its routes under.
    pub async fn ensure(
        &self,
        record: ScopeRecord,
        fresh: bool,
    ) -> Result<ScopeSelector, ScopeError> {
        let selector = selector(&self.module_id, &record);
        let (reply, answer) = futures_channel::oneshot::channel();
        self.tx
            .unbounded_send(Ask {
                record,
                fresh,
                reply,
            })
            .map_err(|_| ScopeError::Gone)?;
        match answer.await {
            Ok(Ok(())) => Ok(selector),
            Ok(Err(why)) => Err(why),
            Err(_) => Err(ScopeError::Gone),
        }
    }
}

#[cfg(test)]
#[path = "scope/tests.rs"]
mod tests;
