//! A session its host started, and its adoption (llm-runner/v1 §9.5 `adopt`), sans-IO.
//!
//! A person's own app (a caller with no attested identity: a direct caller of the daemon,
//! or serve's operator) starts a session with the installation's fetch plan applied
//! (`session.host_start`, a `host_started` record), and starts the person's turns as
//! ordinary sends carrying no `send_id`. Such a session has no owner until a consumer
//! adopts it (`session.adopt`): the adopter, and its route's scope owner, own it from then
//! on, and the host's own surface keeps starting the person's turns.

use broca_wal::changerec::SessionChangeRecord;
use broca_wal::planrec::FrozenPlan;
use broca_wire::{Caller, Refusal};
use cortexkit_role_llm_runner::adopt::{AdoptReply, AdoptRequest};
use serde_json::Value;

use crate::replay::Session;

/// What a `session.host_start` comes to before its plan is fetched.
#[derive(Debug, Clone, PartialEq)]
pub enum HostStart {
    /// Its host started the session with this plan already: the same answer again.
    Answer(Value),
    /// A new session: fetch the plan, then [`host_started`].
    Fetch,
}

fn host_answer(identity: &str) -> Value {
    serde_json::json!({"applied_plan_digest": identity})
}

/// `session.host_start {plan}` from `caller` (its plan's identity `identity`): only the
/// host's own surface (no attested identity) starts a session, before anything else
/// reached it; a session started with this plan answers again, any other is `plan_drift`.
pub fn host_start(
    session: &Session,
    caller: &Caller,
    identity: &str,
) -> Result<HostStart, Refusal> {
    if caller.principal.is_some() {
        return Err(Refusal::ScopeOwnerMismatch);
    }
    let applied = session.plan.as_ref().map(|p| p.identity.as_str());
    if session.hosting.hosted && applied == Some(identity) {
        return Ok(HostStart::Answer(host_answer(identity)));
    }
    if !session.is_new() || applied.is_some() {
        return Err(Refusal::PlanDrift {
            frozen: applied.map(str::to_string),
            sent: identity.to_string(),
        });
    }
    Ok(HostStart::Fetch)
}

/// The `host_started` record of a session [`host_start`] said to fetch for, with its
/// answer; the tools are written beside the plan.
pub fn host_started(plan: FrozenPlan, now_unix_ms: u64) -> (SessionChangeRecord, Value) {
    let answer = host_answer(&plan.identity);
    let tools = plan.tools.to_vec();
    let record = SessionChangeRecord::HostStarted {
        plan: Box::new(plan),
        tools,
        at_unix_ms: now_unix_ms,
    };
    (record, answer)
}

/// `session.adopt` from `caller` (its plan's identity `identity`), checked in the role's
/// order: the caller (only an attested one, and only the owner once there is one), the
/// `send_id` (a repeat answers as before; another plan or policy under it is
/// `send_id_reuse`), the plan (the one applied, or `plan_drift`), then the storage policy
/// (`retention_required` where `required` and none is frozen, `retention_conflict`). The
/// record to append (none for a repeat) and the answer.
pub fn adopt(
    session: &Session,
    caller: &Caller,
    req: &AdoptRequest,
    identity: &str,
    required: bool,
    now_unix_ms: u64,
) -> Result<(Option<SessionChangeRecord>, Value), Refusal> {
    let Some(principal) = caller.principal.as_deref() else {
        return Err(Refusal::ScopeOwnerMismatch);
    };
    let owners = session.owners();
    if !owners.is_empty() && !owners.contains(&principal) {
        return Err(Refusal::ScopeOwnerMismatch);
    }
    if let Some(earlier) = session.hosting.adoptions.get(&req.send_id) {
        if earlier.plan != identity {
            return Err(Refusal::ChangeSendIdReuse { field: "plan" });
        }
        if earlier.retention_policy != req.retention_policy {
            return Err(Refusal::ChangeSendIdReuse {
                field: "retention_policy",
            });
        }
        return Ok((None, reply_json(&earlier.reply)));
    }
    let applied = session.plan.as_ref().map(|p| p.identity.as_str());
    if let Err(detail) = cortexkit_role_llm_runner::adopt::check_drift(applied, identity) {
        return Err(Refusal::PlanDrift {
            frozen: detail.frozen,
            sent: detail.sent,
        });
    }
    match (&session.policy, &req.retention_policy) {
        (Some(frozen), Some(asked)) if frozen != asked => {
            return Err(Refusal::RetentionConflict {
                frozen: serde_json::to_value(frozen).expect("a policy serializes"),
            })
        }
        (None, None) if required => return Err(Refusal::RetentionRequired),
        _ => {}
    }
    let last_ordinal = (session.entry_count > 0).then_some(session.entry_count);
    let mut reply = AdoptReply::new(identity);
    reply.last_ordinal = last_ordinal;
    let record = SessionChangeRecord::Adopted {
        send_id: req.send_id.clone(),
        principal: principal.to_string(),
        scope_owner: caller.scope_owner.clone(),
        plan: identity.to_string(),
        retention_policy: req.retention_policy.clone(),
        last_ordinal,
        at_unix_ms: now_unix_ms,
    };
    Ok((Some(record), reply_json(&reply)))
}

fn reply_json(reply: &AdoptReply) -> Value {
    serde_json::to_value(reply).expect("an adopt reply serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use broca_wal::Record;
    use cortexkit_role_llm_runner::session_retention::RetentionPolicy;

    fn caller(principal: Option<&str>) -> Caller {
        Caller {
            principal: principal.map(str::to_string),
            ..Caller::default()
        }
    }

    fn policy(days: u32) -> RetentionPolicy {
        serde_json::from_value(serde_json::json!({"keep": {"days": days},
            "archive_after_days": 0, "backup": false, "request_dumps": false}))
        .unwrap()
    }

    fn request(send_id: &str, note: &str, policy: Option<RetentionPolicy>) -> AdoptRequest {
        let plan = serde_json::json!({"composition": {"note": note}});
        let mut r = AdoptRequest::new(send_id, plan.as_object().unwrap().clone());
        r.retention_policy = policy;
        r
    }

    /// The session its host started with `plan`'s identity `identity`.
    fn hosted(identity: &str) -> Session {
        let mut s = Session::default();
        let mut plan = crate::plan_tests::admitted();
        plan.identity = identity.to_string();
        let (record, _) = host_started(plan, 1);
        s.apply(1, Record::SessionChange(Box::new(record))).unwrap();
        s
    }

    #[test]
    fn only_the_host_surface_starts_a_session_and_its_plan_stays() {
        let fresh = Session::default();
        assert_eq!(
            host_start(&fresh, &caller(Some("reserved:m")), "p1"),
            Err(Refusal::ScopeOwnerMismatch)
        );
        assert_eq!(
            host_start(&fresh, &caller(None), "p1"),
            Ok(HostStart::Fetch)
        );
        let s = hosted("p1");
        assert!(!s.is_new() && s.is_host(&caller(None)));
        assert!(matches!(
            host_start(&s, &caller(None), "p1"),
            Ok(HostStart::Answer(_))
        ));
        assert_eq!(
            host_start(&s, &caller(None), "p2"),
            Err(Refusal::PlanDrift {
                frozen: Some("p1".into()),
                sent: "p2".into()
            })
        );
    }

    #[test]
    fn an_adoption_checks_the_caller_then_the_send_id_then_the_plan_then_the_policy() {
        let mut s = hosted("p1");
        let owner = caller(Some("reserved:owner"));
        let stranger = caller(Some("reserved:stranger"));
        let asked = request("a1", "n", Some(policy(3)));
        // No attested identity; then the policy a required runner needs; then drift.
        let refused = |s: &Session, c: &Caller, r: &AdoptRequest, id: &str| {
            adopt(s, c, r, id, true, 2).unwrap_err()
        };
        assert_eq!(
            refused(&s, &caller(None), &asked, "p1"),
            Refusal::ScopeOwnerMismatch
        );
        assert_eq!(
            refused(&s, &owner, &request("a1", "n", None), "p1"),
            Refusal::RetentionRequired
        );
        assert!(matches!(
            refused(&s, &owner, &asked, "p2"),
            Refusal::PlanDrift { frozen: Some(f), .. } if f == "p1"
        ));
        let (record, answer) = adopt(&s, &owner, &asked, "p1", true, 2).unwrap();
        assert_eq!(
            answer,
            serde_json::json!({"owner_bound": true, "applied_plan_digest": "p1"})
        );
        s.apply(2, Record::SessionChange(Box::new(record.unwrap())))
            .unwrap();
        assert_eq!(s.owners(), ["reserved:owner"]);
        // Another caller repeating it exactly is still refused: the caller comes first.
        assert_eq!(
            refused(&s, &stranger, &asked, "p1"),
            Refusal::ScopeOwnerMismatch
        );
        // A repeat answers as before and writes nothing; another plan under its send_id is
        // a reuse before it is a drift; a new send_id with another policy conflicts.
        assert_eq!(adopt(&s, &owner, &asked, "p1", true, 3), Ok((None, answer)));
        assert_eq!(
            refused(&s, &owner, &request("a1", "m", Some(policy(3))), "p2"),
            Refusal::ChangeSendIdReuse { field: "plan" }
        );
        assert!(matches!(
            refused(&s, &owner, &request("a2", "n", Some(policy(4))), "p1"),
            Refusal::RetentionConflict { .. }
        ));
        // Adopting again under a new send_id, leaving the frozen policy out, is answered.
        let (again, _) = adopt(&s, &owner, &request("a2", "n", None), "p1", true, 3).unwrap();
        assert!(again.is_some());
        // The host's surface still starts the person's turns; a stranger does not.
        assert!(s.is_host(&caller(None)) && !s.is_host(&stranger));
    }
}
