//! A compaction provider's view accepted into the session (its `view_accepted` record): the
//! session's view from then on.

use std::sync::Arc;

use cortexkit_role_compaction::view::View;

use super::{Misfit, Session};

impl Session {
    /// A view accepted from the session's provider: the session's view from here on. Its
    /// record is written only once the view passed `broca_ck::provided::check`, so one that is not a view, or
    /// not newer than the one before, does not fit the log.
    pub(crate) fn apply_view(&mut self, r: broca_wal::viewrec::ViewAccepted) -> Result<(), Misfit> {
        let misfit = |why: String| Misfit::ViewMisfit {
            provider: r.provider.clone(),
            why,
        };
        let view: View = serde_json::from_value(r.view.clone())
            .map_err(|e| misfit(format!("not a view: {e}")))?;
        let latest = self.view.as_ref().map_or(0, |v| v.version);
        if view.version <= latest || !view.verify() {
            return Err(misfit(format!(
                "version {} after {latest}, or its checksum does not match",
                view.version
            )));
        }
        self.view = Some(Arc::new(view));
        Ok(())
    }
}
