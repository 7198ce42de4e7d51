//! A session's compaction provider (and its step-transform providers) asked over the daemon (cortexkit-role-compaction W2.1, role
//! `compaction-provider` `v2`): `compaction.setup`, `compaction.notice` and `compaction.ride`,
//! each on the session's own route to the provider (kept per module, role and session triple,
//! apart from its tool route), under the session's scope. An op's answer is its bare answer
//! object; a refusal is the provider's `{code, message, detail?}`.

use std::time::Duration;

use broca_io::net::with_timeout;
use broca_subc::protocol::{ErrorBody, FrameType};
use broca_wal::SessionTriple;
use serde_json::Value;

use super::{ModuleTools, NotSent};

/// The role a compaction provider's route speaks.
const ROLE: (&str, &str) = ("compaction-provider", "v2");

/// The role a step-transform provider's hook route speaks.
const STEP_ROLE: (&str, &str) = ("step-transform-provider", "v2");

/// Why a compaction op got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// The provider refused it: its code and message.
    Refused { code: String, message: String },
    /// No answer within the deadline (the request is cancelled).
    Timeout,
    /// It could not be asked, or its answer was lost: why.
    Unreachable(String),
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::Refused { code, message } => write!(f, "refused {code}: {message}"),
            Miss::Timeout => write!(f, "no answer in time"),
            Miss::Unreachable(why) => write!(f, "{why}"),
        }
    }
}

impl ModuleTools {
    /// Asks session `t`'s compaction provider `provider` the op `body` (`{method, params}`),
    /// waiting `deadline` at most (the route's opening included).
    pub async fn compaction_op(
        &self,
        t: &SessionTriple,
        scope_epoch: u64,
        provider: &str,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<Value, Miss> {
        self.role_op(ROLE, t, Some(scope_epoch), provider, body, deadline)
            .await
    }

    /// Asks session `t`'s step-transform provider `provider` the op `body` (`transform.declare`
    /// or `transform.hook`, step-transform-provider/v2) on the session's own route to it,
    /// waiting `deadline` at most (the route's opening included).
    pub async fn step_transform_op(
        &self,
        t: &SessionTriple,
        provider: &str,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<Value, Miss> {
        self.role_op(STEP_ROLE, t, None, provider, body, deadline)
            .await
    }

    /// `body` asked of `provider` on session `t`'s route selecting `role`.
    async fn role_op(
        &self,
        role: (&'static str, &'static str),
        t: &SessionTriple,
        scope_epoch: Option<u64>,
        provider: &str,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<Value, Miss> {
        let opened = self.route_as(
            Some(role),
            provider,
            &t.project_root,
            &t.harness,
            &t.session,
            scope_epoch,
        );
        let route = with_timeout(deadline, opened)
            .await
            .map_err(|()| Miss::Timeout)?
            .map_err(|e| match e {
                NotSent::Refused(why) | NotSent::Indeterminate(why) => Miss::Unreachable(why),
            })?;
        let sent = route
            .link
            .request(route.channel, route.epoch, body)
            .map_err(|e| Miss::Unreachable(e.to_string()))?;
        let frame = match with_timeout(deadline, sent.reply).await {
            Ok(Ok(Ok(frame))) => frame,
            Ok(Ok(Err(why))) => return Err(Miss::Unreachable(why.to_string())),
            Ok(Err(_)) => {
                return Err(Miss::Unreachable(
                    "the connection to the daemon ended".into(),
                ))
            }
            Err(()) => {
                route.link.cancel(route.channel, route.epoch, sent.corr);
                return Err(Miss::Timeout);
            }
        };
        match frame.header.ty {
            FrameType::Response => serde_json::from_slice(&frame.body)
                .map_err(|e| Miss::Unreachable(format!("its answer is not JSON: {e}"))),
            FrameType::Error => {
                let e: ErrorBody = serde_json::from_slice(&frame.body)
                    .map_err(|_| Miss::Unreachable("an error frame that does not parse".into()))?;
                Err(Miss::Refused {
                    code: e.code,
                    message: e.message,
                })
            }
            other => Err(Miss::Unreachable(format!(
                "a {other:?} frame as its answer"
            ))),
        }
    }
}
