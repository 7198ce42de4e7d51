//! A compaction provider's view, the actor's part (cortexkit-role-compaction W5.5): recorded
//! durably before `accepted` is answered. The host checked it against the transcript already;
//! here only a view as new as the session's latest is refused (`stale_version`), since another
//! may have been accepted while this one was checked.

use std::sync::Arc;

use broca_core::{neutral, provided};
use broca_protocol::model::ModelClient;
use broca_protocol::Request;
use broca_tools::ToolRunner;
use broca_wal::viewrec::ViewAccepted;
use broca_wal::Record;
use cortexkit_compaction_view::render;
use cortexkit_role_compaction::view::{View, ViewRefusal};

use crate::{ActorError, SessionActor};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// `session.apply_view` from the session's provider `provider`: `Ok(Ok(()))` once its
    /// record is durable.
    pub async fn apply_view(
        &mut self,
        provider: String,
        view: Arc<View>,
    ) -> Result<Result<(), ViewRefusal>, ActorError> {
        let latest = self.state.view.as_ref().map_or(0, |v| v.version);
        if view.version <= latest {
            return Ok(Err(ViewRefusal::StaleVersion {
                version: view.version,
                latest,
            }));
        }
        let record = ViewAccepted {
            provider,
            view: serde_json::to_value(&*view).expect("a view serializes"),
            at_unix_ms: crate::now_unix_ms(),
        };
        self.append(Record::ViewAccepted(Box::new(record)), true)
            .await?;
        self.marker_written(&view);
        Ok(Ok(()))
    }
}

/// The view a step renders its requests through, taken at its first attempt: a retry of the
/// step keeps it, and a view accepted meanwhile applies from the next step (W5.5: never in
/// the middle of a step).
#[derive(Default)]
pub(crate) struct StepView(Option<(u32, Option<Arc<View>>)>);

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Renders the model request of step `step` through the session's compaction view
    /// (cortexkit-role-compaction W6.3) when its plan names a provider: every numbered part
    /// behind its number, the view's edits applied. A session without a provider, one with the
    /// built-in compaction, or an actor that keeps no entries sends its conversation as it is.
    pub(crate) fn through_view(&self, request: &mut Request, step: u32, held: &mut StepView) {
        let Some(entries) = &self.state.entries else {
            return;
        };
        let built_in = self.state.compacted.is_some()
            || self
                .state
                .runs
                .last()
                .is_some_and(|r| r.config.compaction.is_some());
        if built_in || provided::provider_of(&self.state).is_none() {
            return;
        }
        let view = match &held.0 {
            Some((s, v)) if *s == step => v.clone(),
            _ => {
                let v = self.state.view.clone();
                held.0 = Some((step, v.clone()));
                v
            }
        };
        let numbered = neutral::transcript(entries, 0);
        let edits = view.as_ref().map_or(&[][..], |v| &v.edits[..]);
        let plan = render::plan(&numbered, edits).unwrap_or_else(|why| {
            // Accepted against this transcript, so only edits naming what is gone fail:
            // those are left out (W6.6).
            tracing::warn!(
                session = %self.triple.address(),
                "the compaction view no longer fits the transcript ({why:?}); rendering the \
                 edits that still do"
            );
            let kept = render::edits_for_transcript(&numbered, edits);
            render::plan(&numbered, &kept).unwrap_or(render::RenderPlan { items: Vec::new() })
        });
        if plan.items.is_empty() && !numbered.is_empty() {
            return;
        }
        request.messages = provided::render(&entries.list, &self.state.transcript, &plan);
    }
}
