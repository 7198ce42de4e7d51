//! Adoption (llm-runner/v1 `adopt`): a session a person's app starts (broca's
//! `session.host_start` over a route the daemon attests as `direct`, then the person's turn as
//! a send without a `send_id`).

use cortexkit_role_harness::{HarnessError, RouteStamp};
use cortexkit_role_llm_runner_conformance::{Reply, RunnerRoute};
use serde_json::{json, Map, Value};

use crate::subject::{Module, Subject};
use crate::tools::MODULE;

impl Subject {
    /// The installation's plan: the module's tools (the scripted tool among them); the
    /// alternate names a composition too, so its identity differs.
    pub(crate) fn installation_plan(alternate: bool) -> Map<String, Value> {
        let mut plan = Map::new();
        plan.insert(
            "tool_items".into(),
            json!([{"provider": MODULE, "params": {}}]),
        );
        if alternate {
            plan.insert(
                "composition".into(),
                json!({"join_version": 1, "note": "the alternate installation"}),
            );
        }
        plan
    }

    /// Starts `session` as the person's app does: `session.host_start` with `plan`, then,
    /// with `prompt`, the person's turn (a send without a `send_id`), answered once its run
    /// started.
    pub(crate) async fn host_start(
        &self,
        handle: &Module,
        session: &str,
        plan: &Map<String, Value>,
        prompt: Option<&str>,
    ) -> Result<(), HarnessError> {
        use cortexkit_role_llm_runner_conformance::LlmRunnerSubject;
        let direct = RouteStamp {
            principal: "direct".into(),
            scope: None,
        };
        let route = self.session_route(handle, session, &direct).await?;
        let answered = |what: &str, reply: Reply| match reply {
            Reply::Response(_) => Ok(()),
            other => Err(HarnessError::new(format!("{what} refused: {other:?}"))),
        };
        let started = route
            .request("session.host_start", json!({"plan": plan}))
            .await
            .map_err(|e| HarnessError::new(format!("session.host_start: {}", e.message)))?;
        answered("session.host_start", started)?;
        let Some(prompt) = prompt else {
            return Ok(());
        };
        let mut params = self.send_fields(session, false);
        params.insert("prompt".into(), json!(prompt));
        let sent = route
            .request("session.send", Value::Object(params))
            .await
            .map_err(|e| HarnessError::new(format!("the person's turn: {}", e.message)))?;
        answered("the person's turn", sent)
    }
}
