//! A fetch plan's items asked of their tool modules (llm-runner/v1 `plans`, §10.1): each
//! provider's `tool.catalog` with its item's params, preset, the plan's composition and its
//! system-text item, every provider asked at once under one deadline, over a route whose
//! identity is the session's (unscoped, as broca's own requests are: no session's scope
//! exists before its first send).

use std::time::{Duration, Instant};

use broca_io::net::with_timeout;
use broca_subc::toolprov::{self, PlanMiss};
use cortexkit_role_tool_provider::catalog::{CatalogAnswer, CatalogRequest};

use super::{ModuleTools, NotSent, CONTROL_DEADLINE};

/// What one provider answered: the answer as it came and its tools as broca routes them.
pub type PlanAnswer = Result<(CatalogAnswer, Vec<broca_protocol::ToolSpec>), PlanMiss>;

impl ModuleTools {
    /// Asks every `(module, request)` at once; each answer in order, a module that did not
    /// answer by `deadline` as [`PlanMiss::Timeout`] (its request cancelled). Runs on a
    /// glommio executor.
    pub async fn plan_catalogs(
        &self,
        session: (&str, &str),
        asks: &[(String, CatalogRequest)],
        deadline: Duration,
    ) -> Vec<PlanAnswer> {
        let until = Instant::now() + deadline;
        let fetches = asks
            .iter()
            .map(|(module, request)| self.plan_catalog(session, module, request, until));
        join_all(fetches).await
    }

    /// Whether the daemon's catalog lists `module` as providing `capability` (no answer:
    /// no).
    pub async fn provides(&self, module: &str, capability: &str) -> bool {
        let Ok(link) = self.link().await else {
            return false;
        };
        let Ok(sent) = link.request(0, 0, toolprov::catalog_list_request(module)) else {
            return false;
        };
        match with_timeout(CONTROL_DEADLINE, sent.reply).await {
            Ok(Ok(Ok(frame))) => toolprov::provides(module, &frame, capability),
            Ok(_) => false,
            Err(()) => {
                link.cancel(0, 0, sent.corr);
                false
            }
        }
    }

    async fn plan_catalog(
        &self,
        (harness, session): (&str, &str),
        module: &str,
        request: &CatalogRequest,
        until: Instant,
    ) -> PlanAnswer {
        let left = || until.saturating_duration_since(Instant::now());
        let route = with_timeout(left(), self.route(module, "", harness, session, None))
            .await
            .map_err(|()| PlanMiss::Timeout)?
            .map_err(|e| match e {
                NotSent::Refused(e) | NotSent::Indeterminate(e) => PlanMiss::Unavailable(e),
            })?;
        let sent = route
            .link
            .request(
                route.channel,
                route.epoch,
                toolprov::plan_catalog_request(request),
            )
            .map_err(|e| PlanMiss::Unavailable(e.to_string()))?;
        let frame = match with_timeout(left(), sent.reply).await {
            Ok(Ok(Ok(frame))) => frame,
            Ok(Ok(Err(why))) => return Err(PlanMiss::Unavailable(why.to_string())),
            Ok(Err(_)) => {
                return Err(PlanMiss::Unavailable(
                    "the connection to the daemon ended".into(),
                ))
            }
            Err(()) => {
                route.link.cancel(route.channel, route.epoch, sent.corr);
                return Err(PlanMiss::Timeout);
            }
        };
        let (answer, catalog) = toolprov::read_plan_catalog(module, &frame)?;
        for n in catalog.notes {
            tracing::warn!(module = %module, "{n}");
        }
        Ok((answer, catalog.specs))
    }
}

/// Awaits every future, their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
