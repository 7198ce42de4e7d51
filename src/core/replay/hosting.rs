//! Who hosts and owns a session, folded from its `host_started` and `adopted` records (the
//! checks of a host's start and of an adoption are `crate::adopt`'s).

use std::collections::HashMap;

use broca_wal::changerec::SessionChangeRecord;
use broca_wire::Caller;
use cortexkit_role_llm_runner::adopt::AdoptReply;
use cortexkit_role_llm_runner::session_retention::RetentionPolicy;

use super::Session;

/// Who hosts and owns a session, as its records tell it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hosting {
    /// Its host started it (`host_started`).
    pub hosted: bool,
    /// Its adopter and the adopter's scope owner, once adopted.
    pub owner: Option<(String, Option<String>)>,
    /// Each adoption by its `send_id`: what a repeat is compared with, and its answer.
    pub(crate) adoptions: HashMap<String, Adoption>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Adoption {
    pub(crate) plan: String,
    pub(crate) retention_policy: Option<RetentionPolicy>,
    pub(crate) reply: AdoptReply,
}

impl Session {
    /// The session's owners: its adopter (and the adopter's scope owner) once adopted; else
    /// who sent its first run, and that route's scope owner (none for a session first sent
    /// over serve's HTTP surface, by an unattested caller, or started by its host).
    pub fn owners(&self) -> Vec<&str> {
        if let Some((principal, scope_owner)) = &self.hosting.owner {
            return std::iter::once(principal.as_str())
                .chain(scope_owner.as_deref())
                .collect();
        }
        let Some(first) = self.runs.first() else {
            return Vec::new();
        };
        first
            .principal
            .iter()
            .chain(first.scope_owner.iter())
            .map(String::as_str)
            .collect()
    }

    /// Whether `caller` is the host's own surface on a session its host started: the
    /// person's app, which starts the person's turns.
    pub fn is_host(&self, caller: &Caller) -> bool {
        self.hosting.hosted && caller.principal.is_none()
    }

    /// A `host_started` or `adopted` record (the other change records are the changes').
    pub(crate) fn apply_hosting(&mut self, r: &SessionChangeRecord) {
        match r {
            SessionChangeRecord::HostStarted { plan, tools, .. } => {
                self.hosting.hosted = true;
                if self.plan.is_none() {
                    let mut plan = plan.clone();
                    if plan.tools.is_empty() {
                        plan.tools = tools.clone().into();
                    }
                    self.plan = Some(plan);
                }
            }
            SessionChangeRecord::Adopted {
                send_id,
                principal,
                scope_owner,
                plan,
                retention_policy,
                last_ordinal,
                ..
            } => {
                if self.hosting.owner.is_none() {
                    self.hosting.owner = Some((principal.clone(), scope_owner.clone()));
                }
                self.note_policy(retention_policy.as_ref());
                let mut reply = AdoptReply::new(plan.clone());
                reply.last_ordinal = *last_ordinal;
                let adoption = Adoption {
                    plan: plan.clone(),
                    retention_policy: retention_policy.clone(),
                    reply,
                };
                self.hosting.adoptions.insert(send_id.clone(), adoption);
            }
            _ => {}
        }
    }
}
