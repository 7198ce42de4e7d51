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

/// What a send was admitted with, as a repeat of its send_id compares it.
struct Earlier<'a> {
    inputs_digest: &'a str,
    prompt_digest: String,
    delivery: Option<String>,
    client_id: Option<&'a str>,
    config: &'a broca_wal::runrec::FrozenConfig,
    /// The run (or submission) it was admitted as.
    admitted_as: &'a str,
}

impl Earlier<'_> {
    /// A send still queued, or withdrawn before it started.
    fn queued(q: &broca_wal::runrec::SendQueued) -> Earlier<'_> {
        Earlier {
            inputs_digest: &q.inputs_digest,
            prompt_digest: prompt_digest(&q.prompt),
            delivery: delivery_identity(q.delivery.as_deref(), q.order.as_ref()),
            client_id: q.client_message_id.as_deref(),
            config: &q.config,
            admitted_as: &q.submission_id,
        }
    }
}

impl Identity<'_> {
    /// The refusal of a send whose send_id was admitted as `e` under other inputs, or none.
    fn reuse(&self, e: &Earlier<'_>) -> Option<Refusal> {
        (e.inputs_digest != self.inputs_digest).then(|| Refusal::SendIdReuse {
            run_id: e.admitted_as.to_string(),
            field: self.differs(
                &e.prompt_digest,
                e.delivery.as_deref(),
                e.client_id,
                super::frozen_so_key(e.config.structured_output.as_ref()),
            ),
        })
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
    let found = session.lookup_send(caller.principal.as_deref(), send_id?)?;
    let refused_or = |earlier: Earlier<'_>, then: Admitted| match asked.reuse(&earlier) {
        None => Ok(then),
        Some(refusal) => Err(refusal),
    };
    Some(match found {
        // A steer (its answer names the run that carried it, however it was delivered).
        Found::Steer(steer) => {
            let joined = &session.runs[steer.accepted_by];
            let earlier = Earlier {
                inputs_digest: &steer.inputs_digest,
                prompt_digest: steer.prompt_digest.clone(),
                delivery: Some(steer.delivery.clone()),
                client_id: steer.client_message_id.as_deref(),
                config: &joined.config,
                admitted_as: &joined.run_id,
            };
            refused_or(earlier, Admitted::SteerExisting { seq: steer.seq })
        }
        Found::Run(index) => {
            let run = &session.runs[index];
            let earlier = Earlier {
                inputs_digest: &run.inputs_digest,
                prompt_digest: run.prompt_digest.clone(),
                delivery: run.delivery.clone(),
                client_id: run.client_message_id.as_deref(),
                config: &run.config,
                admitted_as: &run.run_id,
            };
            refused_or(earlier, Admitted::Existing { run_index: index })
        }
        Found::Queued(q) => {
            let submission_id = q.submission_id.clone();
            refused_or(Earlier::queued(q), Admitted::Pending { submission_id })
        }
        Found::Retracted(q, ended) => match (asked.reuse(&Earlier::queued(q)), ended) {
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
