//! Late results no call waits for (a restart sealed their calls without an outcome), as the
//! host takes them from the tool modules (`broca_tools::late`): the session is found by the
//! entry's scope ref among the store's sessions (the ref is a digest of the session triple,
//! `broca_subc::scope`), and its actor records the result durably and once. Shard 0 reads
//! the late results of the modules that serve them at start and every `late_poll`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use broca_session::SessionCommand;
use broca_tools::late::{LateRecorded, LateResult, LateSink, NotRecorded};
use broca_wal::SessionTriple;

use crate::Host;

/// The host as the tool modules' late-result sink.
pub(crate) struct HostLate {
    pub(crate) host: Weak<Host>,
}

impl LateSink for HostLate {
    fn record(
        &self,
        late: LateResult,
    ) -> Pin<Box<dyn Future<Output = Result<LateRecorded, NotRecorded>> + 'static>> {
        let host = self.host.upgrade();
        Box::pin(async move {
            let host = host.ok_or(NotRecorded::Stopping)?;
            let pulled = late
                .command
                .as_ref()
                .and_then(|_| pulled_by(&host, &late.call_key));
            let triple = match pulled {
                Some(t) => t,
                None => match session_of(&host, &late.scope_ref).await? {
                    Some(t) => t,
                    None => return Ok(LateRecorded::NotAwaited),
                },
            };
            let (reply, wait) = futures_channel::oneshot::channel();
            host.route(triple, SessionCommand::LateResult { late, reply })
                .map_err(|e| NotRecorded::Shard(format!("{e:?}")))?;
            wait.await
                .map_err(|_| NotRecorded::Unanswered)?
                .map_err(|e| NotRecorded::Refused(e.message))
        })
    }
}

/// The session of a person-only command this process pulls (its entries may come on a route
/// opened without a scope, whose ref names no session).
fn pulled_by(host: &Host, call_key: &str) -> Option<SessionTriple> {
    host.command_sessions.lock().ok()?.get(call_key).cloned()
}

/// The session whose scope ref is `scope_ref`, among the store's sessions (`None`: no
/// session of this broca has it).
async fn session_of(
    host: &Arc<Host>,
    scope_ref: &str,
) -> Result<Option<SessionTriple>, NotRecorded> {
    let Some(store) = host.store.clone() else {
        return Err(NotRecorded::NoStore);
    };
    let scope_ref = scope_ref.to_string();
    broca_io::blocking::run(broca_io::blocking::Kind::StoreRead, move || {
        let marks = store
            .sessions()
            .map_err(|e| NotRecorded::Store(e.to_string()))?;
        Ok(marks
            .into_iter()
            .map(|(_, m)| m)
            .find(|m| {
                broca_subc::scope::scope_ref(&m.project_root, &m.harness, &m.session) == scope_ref
            })
            .and_then(|m| SessionTriple::new(&m.project_root, &m.harness, &m.session).ok()))
    })
    .await
}
