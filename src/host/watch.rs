//! What watches a shard's session actors ([`broca_session::Watch`]): each appended record
//! goes to the session's hub (published to subscribers once durable), the shard's outcome
//! counters and the session's trace spans; each model attempt's hint to the bus once durable;
//! the display lane to the hub; and the storage's health to the host.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use broca_session::hub::Hub;
use broca_session::{ActorError, Appended, Watch};

use crate::metrics::Outcomes;
use crate::Host;

/// One session's watch on a shard.
pub(crate) struct SessionWatch {
    pub(crate) hub: Rc<Hub>,
    pub(crate) outcomes: Rc<Outcomes>,
    /// The session's spans, built from its records as they are appended.
    pub(crate) spans: Option<(Arc<broca_otel::Traces>, RefCell<broca_otel::SessionSpans>)>,
    /// The bus's step hints: the hint's subject tail, with the host's publisher.
    pub(crate) hints: Option<(String, crate::StepHints)>,
    pub(crate) host: Arc<Host>,
    /// The session and its shard's keeper of retention.
    pub(crate) triple: broca_wal::SessionTriple,
    pub(crate) keeper: crate::answer::Keeper,
}

impl Watch for SessionWatch {
    fn appended(&self, a: Appended<'_>) {
        self.outcomes.record(a.record);
        if let Some((traces, spans)) = &self.spans {
            let done = spans.borrow_mut().observe(a.record);
            if !done.is_empty() {
                traces.offer(done);
            }
        }
        self.hub.on_append(a.seq, a.end, a.record);
    }

    fn step_runner(&self) -> Option<&str> {
        self.hints.as_ref().map(|(_, h)| h.runner.as_str())
    }

    fn step_finished(&self, end: u64, hint: cortexkit_role_llm_runner::step_events::StepFinished) {
        let Some((tail, hints)) = &self.hints else {
            return;
        };
        let body = match serde_json::to_vec(&hint) {
            Ok(body) => body,
            Err(e) => return tracing::error!("a step hint does not serialize: {e}"),
        };
        let (publisher, tail) = (hints.publisher.clone(), tail.clone());
        self.hub.when_durable(end, move || {
            publisher.publish(tail, body);
        });
    }

    fn display(&self, delta: &broca_core::DisplayDelta) {
        self.hub.display(delta);
    }

    fn wrote(&self) {
        self.host.storage.wrote();
    }

    fn failed(&self, error: &ActorError) {
        self.host.storage.failed(error);
    }

    fn kept(&self, state: &broca_core::Session) {
        self.keeper.note(&self.triple, state);
    }

    fn stopping(&self) -> bool {
        self.host.is_stopping()
    }
}
