//! A send whose send_id the session has seen (a child of `admission`): answered with what
//! the first send under it started, or refused naming the field that differs.

use broca_protocol::delivery::delivery_identity;

use super::{prompt_digest, Admitted, Refusal, Session};
use crate::replay::Found;

/// What a repeated send_id is compared on: the digest of all its inputs, and the two the
/// refusal of a reuse names when they differ.
pub(super) struct Identity<'a> {
    pub(super) inputs_digest: &'a str,
    pub(super) prompt_digest: &'a str,
    pub(super) client_message_id: Option<&'a str>,
    /// The send's `structured_output` as compared (`so_key`).
    pub(super) structured_output: Option<String>,
    /// Its delivery when not `queue`, as compared (`delivery_identity`).
    pub(super) delivery: Option<String>,
}

impl Identity<'_> {
    /// The field a send reusing a send_id differs in from the send first admitted under it
    /// (of `prompt`, `delivery`, `client_message_id` and `structured_output`, in that order),
    /// when one of those is it.
    fn differs(
        &self,
        prompt_digest: &str,
        delivery: Option<&str>,
        client_message_id: Option<&str>,
        structured_output: Option<String>,
    ) -> Option<&'static str> {
        if prompt_digest != self.prompt_digest {
            Some("prompt")
        } else if delivery != self.delivery.as_deref() {
            Some("delivery")
        } else if client_message_id != self.client_message_id {
            Some("client_message_id")
        } else if structured_output != self.structured_output {
            Some("structured_output")
        } else {
            None
        }
    }
}

/// The answer to a send whose send_id the session has seen: its run, its queued
/// submission, its retraction, or a reuse with other inputs. The send_id is `caller`'s, in
/// its namespace (§9.7: the owner's, or a named sender's after its predecessor's).
pub(super) fn repeated(
    session: &Session,
    caller: &broca_wire::Caller,
    send_id: Option<&str>,
    asked: &Identity<'_>,
) -> Option<Result<Admitted, Refusal>> {
    let send_id = send_id?;
    // The refusal of a send whose send_id was admitted under other inputs, or none.
    let same = |digest: &str,
                prompt_digest: &str,
                delivery: Option<&str>,
                client_id: Option<&str>,
                config: &broca_wal::runrec::FrozenConfig,
                admitted_as: &str| {
        (digest != asked.inputs_digest).then(|| Refusal::SendIdReuse {
            run_id: admitted_as.to_string(),
            field: asked.differs(
                prompt_digest,
                delivery,
                client_id,
                super::frozen_so_key(config.structured_output.as_ref()),
            ),
        })
    };
    // The same for a send still queued, or withdrawn before it started.
    let queued_same = |q: &broca_wal::runrec::SendQueued| {
        let delivery = delivery_identity(q.delivery.as_deref(), q.order.as_ref());
        same(
            &q.inputs_digest,
            &prompt_digest(&q.prompt),
            delivery.as_deref(),
            q.client_message_id.as_deref(),
            &q.config,
            &q.submission_id,
        )
    };
    let found = session.lookup_send(caller.principal.as_deref(), send_id)?;
    Some(match found {
        // A steer (its answer names the run that carried it, however it was delivered).
        Found::Steer(steer) => {
            let joined = &session.runs[steer.accepted_by];
            match same(
                &steer.inputs_digest,
                &steer.prompt_digest,
                Some(steer.delivery.as_str()),
                steer.client_message_id.as_deref(),
                &joined.config,
                &joined.run_id,
            ) {
                None => Ok(Admitted::SteerExisting { seq: steer.seq }),
                Some(refusal) => Err(refusal),
            }
        }
        Found::Run(index) => {
            let run = &session.runs[index];
            match same(
                &run.inputs_digest,
                &run.prompt_digest,
                run.delivery.as_deref(),
                run.client_message_id.as_deref(),
                &run.config,
                &run.run_id,
            ) {
                None => Ok(Admitted::Existing { run_index: index }),
                Some(refusal) => Err(refusal),
            }
        }
        Found::Queued(q) => match queued_same(q) {
            None => Ok(Admitted::Pending {
                submission_id: q.submission_id.clone(),
            }),
            Some(refusal) => Err(refusal),
        },
        Found::Retracted(q, ended) => match (queued_same(q), ended) {
            (Some(refusal), _) => Err(refusal),
            (None, None) => Err(Refusal::SendRetracted),
            (None, Some(ended)) => Ok(Admitted::Ended(ended.clone())),
        },
    })
}

/// A send's `structured_output` as a repeated send_id compares it: mode, name and the
/// schema's canonical text (an unreadable one as sent).
pub(super) fn so_key(raw: Option<&serde_json::Value>) -> Option<String> {
    use cortexkit_role_llm_runner::structured_output::StructuredOutput;
    let raw = raw?;
    Some(
        match serde_json::from_value::<StructuredOutput>(raw.clone()) {
            Ok(so) => match so.schema_jcs() {
                Ok(jcs) => format!(
                    "{}\n{}\n{}",
                    so.mode.as_str(),
                    so.effective_name(),
                    String::from_utf8_lossy(&jcs)
                ),
                Err(_) => raw.to_string(),
            },
            Err(_) => raw.to_string(),
        },
    )
}

/// [`so_key`] of what a run froze.
pub(super) fn frozen_so_key(
    f: Option<&broca_wal::runrec::FrozenStructuredOutput>,
) -> Option<String> {
    f.map(|f| format!("{}\n{}\n{}", f.mode, f.name, f.schema))
}
