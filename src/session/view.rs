//! A compaction provider's view, the actor's part (cortexkit-role-compaction W5.5): recorded
//! durably before `accepted` is answered. The host checked it against the transcript already;
//! here only a view as new as the session's latest is refused (`stale_version`), since another
//! may have been accepted while this one was checked.

use std::sync::Arc;

use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;
use broca_wal::viewrec::ViewAccepted;
use broca_wal::Record;
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

impl StepView {
    /// The view step `step` renders through: the one it took at its first attempt, else the
    /// session's `latest` now (taken for the step).
    pub(crate) fn take_for(&mut self, step: u32, latest: &Option<Arc<View>>) -> Option<Arc<View>> {
        match &self.0 {
            Some((s, v)) if *s == step => v.clone(),
            _ => {
                self.0 = Some((step, latest.clone()));
                latest.clone()
            }
        }
    }
}
