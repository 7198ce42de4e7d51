//! Routes a session's compaction provider opens to broca (cortexkit-role-compaction W2.2,
//! role `compaction-runner` `v1`): refused at bind when the route cannot be one (W2.4), and
//! each request answered by the host (`Host::compaction_call`) with the op's bare answer
//! object, or its refusal `{code, message, detail?}` as an ERROR frame.

use std::collections::BTreeMap;

use super::*;

/// The role compaction routes declare in `role_versions`, and the version broca serves.
const ROLE: &str = "compaction-runner";
const VERSION: &str = "v1";

/// Whether a bind declares a compaction route (`Ok(true)`), an llm-runner one (`Ok(false)`,
/// as every route without `compaction-runner` is), or why it cannot be bound: the role's code
/// and a message.
pub(super) fn is_compaction_route(
    role_versions: Option<&BTreeMap<String, String>>,
    attested: bool,
    session: &str,
) -> Result<bool, (&'static str, String)> {
    use cortexkit_role_compaction::wire::codes;
    let Some(version) = role_versions.and_then(|r| r.get(ROLE)) else {
        return Ok(false);
    };
    if role_versions.is_some_and(|r| r.len() > 1) {
        return Err((
            codes::UNKNOWN_ROUTE_ROLE,
            "the route declares more than one role; a compaction route declares \
             `compaction-runner` alone"
                .into(),
        ));
    }
    if version != VERSION {
        return Err((
            codes::UNKNOWN_ROUTE_ROLE,
            format!(
                "`{ROLE}` {}: broca serves {VERSION}",
                version.escape_debug()
            ),
        ));
    }
    if !attested {
        return Err((
            codes::UNATTESTED_RUNNER,
            "the daemon attests no module for this route's caller".into(),
        ));
    }
    if session.is_empty() {
        return Err((
            codes::ROUTE_UNBOUND,
            "a compaction route is bound to one session; this bind names none".into(),
        ));
    }
    Ok(true)
}

impl Routes {
    /// A bind refused under the role's own code.
    pub(super) async fn refuse_bind(&self, corr: u64, code: &str, message: String) {
        let body = serde_json::to_value(ErrorBody::new(code, message)).expect("a body serializes");
        self.reply(FrameType::Error, 0, 0, corr, &body).await;
    }

    /// One compaction-runner request on route `r`.
    pub(super) async fn compaction_request(
        &self,
        r: &Route,
        channel: u16,
        epoch: u32,
        corr: u64,
        body: Vec<u8>,
    ) {
        let answer = self
            .host
            .compaction_call(r.triple.clone(), &r.caller, &body)
            .await;
        let (ty, value) = match answer {
            Ok(v) => (FrameType::Response, v),
            Err(refusal) => (
                FrameType::Error,
                serde_json::to_value(refusal).expect("a refusal serializes"),
            ),
        };
        let bytes = serde_json::to_vec(&value).expect("JSON values serialize");
        if bytes.len() + broca_subc::protocol::HEADER_LEN > MAX_DELIVERED_FRAME_LEN {
            let e = RpcError::new(
                Code::ReplyTooLarge,
                format!(
                    "the answer is {} bytes, more than a frame carries \
                     ({MAX_DELIVERED_FRAME_LEN}); ask with a smaller `max_bytes`",
                    bytes.len()
                ),
            );
            return self.error(channel, epoch, corr, &e).await;
        }
        self.reply(ty, channel, epoch, corr, &value).await;
    }
}
