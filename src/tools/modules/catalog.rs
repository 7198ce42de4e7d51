//! broca's own requests to modules over the shared connection, on routes it keeps for
//! itself (`ask`: a module's `role.describe`, its late results and their acks), and the
//! fusiform catalog module's `catalog.get` (`catalog_text`).

use broca_io::net::with_timeout;
use broca_subc::frames::FrameIn;
use broca_subc::toolprov;
use broca_subc::LinkError;

use super::{ModuleTools, NotSent, CONTROL_DEADLINE};

impl ModuleTools {
    /// A request of broca's own (not a session's) to `module`, on the route broca keeps for
    /// `session`, and its terminal frame.
    pub(super) async fn ask(
        &self,
        module: &str,
        session: &str,
        body: Vec<u8>,
    ) -> Result<FrameIn, LinkError> {
        let route = self
            .route(module, "", &self.module_id, session, None)
            .await
            .map_err(|e| match e {
                NotSent::Refused(e) | NotSent::Indeterminate(e) => LinkError::Down(e),
            })?;
        let sent = route.link.request(route.channel, route.epoch, body)?;
        match with_timeout(CONTROL_DEADLINE, sent.reply).await {
            Ok(Ok(Ok(frame))) => Ok(frame),
            Ok(Ok(Err(why))) => Err(why),
            Ok(Err(_)) => Err(LinkError::Down("the connection to the daemon ended".into())),
            Err(()) => {
                route.link.cancel(route.channel, route.epoch, sent.corr);
                Err(LinkError::Down(format!(
                    "no answer within {CONTROL_DEADLINE:?}"
                )))
            }
        }
    }

    /// The fusiform catalog module's current catalog (`catalog.get`) as catalog text for
    /// broca-catalog; its `catalog_version` is the change mark: an answer of the version read
    /// last gives the text made then.
    pub async fn catalog_text(&self, module: &str) -> Result<String, LinkError> {
        // Only the facts broca reads (about a third of the whole catalog, well under the
        // daemon's frame limit).
        let arguments =
            serde_json::json!({"fact_prefixes": broca_catalog::fusiform::FACT_PREFIXES});
        let body = toolprov::op_request(fusiform_protocol::TOOL_GET, arguments);
        let frame = self.ask(module, "catalog", body).await?;
        let answer: serde_json::Value = match frame.header.ty {
            broca_subc::protocol::FrameType::Response => serde_json::from_slice(&frame.body)
                .map_err(|e| {
                    LinkError::Protocol(format!("its catalog.get answer is not JSON: {e}"))
                })?,
            broca_subc::protocol::FrameType::Error => {
                let e: broca_subc::protocol::ErrorBody = serde_json::from_slice(&frame.body)
                    .map_err(|_| LinkError::Protocol("an error that does not parse".into()))?;
                let kind = fusiform_protocol::refusal::RefusalKind::of(&e.code);
                return Err(LinkError::Refused(format!(
                    "it refused catalog.get ({}, {kind:?}): {}",
                    e.code, e.message
                )));
            }
            other => {
                return Err(LinkError::Protocol(format!(
                    "a {other:?} frame answered catalog.get"
                )))
            }
        };
        let version = answer
            .get("catalog_version")
            .and_then(serde_json::Value::as_i64);
        if let (Some(v), Ok(last)) = (version, self.last_catalog.lock()) {
            if let Some((lv, text)) = last.as_ref() {
                if *lv == v {
                    return Ok(text.clone());
                }
            }
        }
        let read = broca_catalog::fusiform::read(&answer)
            .map_err(|e| LinkError::Protocol(e.to_string()))?;
        if !read.notes.is_empty() {
            tracing::info!(
                module,
                unknown = read.notes.len(),
                "catalog facts fusiform does not state are left unknown"
            );
            for n in &read.notes {
                tracing::debug!(module, "{n}");
            }
        }
        let text =
            serde_json::to_string(&read.catalog).map_err(|e| LinkError::Protocol(e.to_string()))?;
        if let Ok(mut last) = self.last_catalog.lock() {
            *last = Some((read.catalog_version, text.clone()));
        }
        Ok(text)
    }
}
