//! A session's route on a module's connection, as the suite speaks to broca over it: a
//! REQUEST answered by RESPONSE or ERROR, and a subscription's frames until they go quiet.

use std::sync::Arc;
use std::time::Duration;

use cortexkit_role_harness::RouteStamp;
use cortexkit_role_llm_runner_conformance::{
    envelope, Reply, RouteFailure, RunnerRoute, SubscribeOutcome,
};
use serde_json::Value;
use subc_protocol::{ErrorBody, FrameType};

use async_trait::async_trait;

use crate::daemon::Link;
use crate::subject::{ANSWER_WITHIN, OWNER, QUIET};

/// A session-bound route on a module's connection.
pub struct Route {
    pub(crate) link: Arc<Link>,
    pub(crate) channel: u16,
}

impl Route {
    /// A route of the session `session` of `harness`, bound on `link` as its owner.
    pub async fn bind(link: Arc<Link>, harness: &str, session: &str) -> Result<Route, String> {
        Route::bind_as(link, harness, session, OWNER).await
    }

    /// [`Route::bind`] for the caller the daemon attests as `principal`.
    pub async fn bind_as(
        link: Arc<Link>,
        harness: &str,
        session: &str,
        principal: &str,
    ) -> Result<Route, String> {
        let stamp = RouteStamp {
            principal: principal.into(),
            scope: None,
        };
        let channel = link.bind(harness, session, &stamp).await?;
        Ok(Route { link, channel })
    }
}

impl Route {
    /// broca's first frame for a request, or why none came.
    async fn first_frame(
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<subc_protocol::Frame>,
        within: Duration,
    ) -> Result<Option<subc_protocol::Frame>, RouteFailure> {
        match tokio::time::timeout(within, rx.recv()).await {
            Err(_) => Ok(None),
            Ok(None) => Err(RouteFailure::new("the route closed before broca answered")),
            Ok(Some(f)) => Ok(Some(f)),
        }
    }
}

fn error_body(method: &str, bytes: &[u8]) -> Result<ErrorBody, RouteFailure> {
    serde_json::from_slice(bytes).map_err(|e| {
        RouteFailure::new(format!(
            "{method}: an ERROR body that is not {{code, message, detail?}} ({e}): {}",
            String::from_utf8_lossy(bytes)
        ))
    })
}

#[async_trait]
impl RunnerRoute for Route {
    async fn request(&self, method: &str, params: Value) -> Result<Reply, RouteFailure> {
        let (_, mut rx) = self
            .link
            .request(self.channel, 1, &envelope(method, params))
            .await
            .map_err(RouteFailure::new)?;
        let f = Self::first_frame(&mut rx, ANSWER_WITHIN)
            .await?
            .ok_or_else(|| {
                RouteFailure::new(format!("{method}: no answer within {ANSWER_WITHIN:?}"))
            })?;
        match f.header.ty {
            FrameType::Response => cortexkit_role_llm_runner::wire::read_reply::<Value>(&f.body)
                .map(Reply::Response)
                .map_err(|e| {
                    RouteFailure::new(format!(
                        "{method}: the RESPONSE body is refused ({}): {}",
                        e.name(),
                        String::from_utf8_lossy(&f.body)
                    ))
                }),
            FrameType::Error => Ok(Reply::Error(error_body(method, &f.body)?)),
            other => Err(RouteFailure::new(format!(
                "{method}: broca answered a {other:?} frame"
            ))),
        }
    }

    async fn subscribe(&self, params: Value) -> Result<SubscribeOutcome, RouteFailure> {
        let (corr, mut rx) = self
            .link
            .request(self.channel, 1, &envelope("session.subscribe", params))
            .await
            .map_err(RouteFailure::new)?;
        let mut events = Vec::new();
        loop {
            let f = match Self::first_frame(&mut rx, QUIET).await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) if events.is_empty() => return Err(e),
                Err(_) => break,
            };
            match f.header.ty {
                FrameType::StreamData => {
                    let event: Value = serde_json::from_slice(&f.body).map_err(|e| {
                        RouteFailure::new(format!("a STREAM_DATA body that is not JSON: {e}"))
                    })?;
                    events.push(event);
                }
                FrameType::Error if events.is_empty() => {
                    return Ok(SubscribeOutcome::Refused(error_body(
                        "session.subscribe",
                        &f.body,
                    )?))
                }
                FrameType::StreamEnd | FrameType::Error => break,
                other => {
                    return Err(RouteFailure::new(format!(
                        "session.subscribe: broca sent a {other:?} frame"
                    )))
                }
            }
        }
        self.link.cancel(self.channel, 1, corr).await;
        Ok(SubscribeOutcome::Events(events))
    }
}
