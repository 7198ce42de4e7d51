//! Mid-session changes (llm-runner/v1 §10.2 `session_change`), sans-IO: the refreshes a
//! session accepted as its WAL tells them (`session_change` records, broca_wal::changerec),
//! what a `session.refresh`, `session.refresh_policy` or `session.flush_prefix` comes to
//! before anything is written, and the baseline's change members.
//!
//! broca applies a change to a session's tools and system text at the start of a run, never
//! inside a running one (no step ever sees tools its run did not start with), at one of two
//! rungs: `immediately` (the next run) or `on_prefix_rebuild` (the first run whose prefix is
//! rebuilt: after a `session.flush_prefix`, or on another model than the session's latest
//! run). A change touching a surface under another rung is refused `rung_unsupported`. The
//! run that applies a change carries its plan in its `run_started` (`config.plan`, with the
//! change's `generation`), which moves `applied_generation`.

use std::collections::HashMap;

use broca_wal::changerec::SessionChangeRecord;
use broca_wal::planrec::FrozenPlan;
use broca_wire::Refusal;
use cortexkit_role_llm_runner::baseline::{EffectiveBaseline, PendingChange, Rungs};
use cortexkit_role_llm_runner::rungs;
use cortexkit_role_llm_runner::session_change::{
    refresh_order, surfaces, FlushPrefixReply, RefreshOrder, RefreshPolicyReply, RefreshReply,
};

use serde_json::Value;

/// The rungs broca supports for each surface, cheapest first.
pub const RUNGS: &[&str] = &[rungs::ON_PREFIX_REBUILD, rungs::IMMEDIATELY];

/// How a change that applied is named in `effective.applied_by`: the run's prefix is built
/// from the new plan.
pub const APPLIED_BY: &str = cortexkit_role_llm_runner::baseline::applied_by::FOLD;

/// The latest accepted refresh.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub generation: u64,
    pub policy: String,
    /// The refreshed plan, its `generation` set.
    pub plan: Box<FrozenPlan>,
    /// The answer it was given (an identical repeat gets the same).
    pub run_in_progress: bool,
    pub applies_from_next_run: bool,
}

impl Accepted {
    fn reply(&self) -> Value {
        let reply = RefreshReply::new(
            PendingChange {
                generation: self.generation,
                policy: self.policy.clone(),
            },
            self.run_in_progress,
            self.applies_from_next_run,
        );
        serde_json::to_value(reply).expect("a refresh reply serializes")
    }
}

/// A session's changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    pub accepted: Option<Accepted>,
    /// `session.refresh_policy` answers by send_id: the generation and policy it named.
    policies: HashMap<String, (u64, String)>,
    /// `session.flush_prefix` answers by send_id.
    flushes: HashMap<String, Option<u64>>,
    /// The highest pending generation a flush asked to apply (0: none).
    flushed: u64,
}

impl Changes {
    pub fn apply(&mut self, r: &SessionChangeRecord) {
        match r {
            SessionChangeRecord::Refreshed {
                generation,
                policy,
                plan,
                tools,
                run_in_progress,
                applies_from_next_run,
                ..
            } => {
                let mut plan = plan.clone();
                plan.generation = *generation;
                if plan.tools.is_empty() {
                    plan.tools = tools.clone().into();
                }
                self.accepted = Some(Accepted {
                    generation: *generation,
                    policy: policy.clone(),
                    plan,
                    run_in_progress: *run_in_progress,
                    applies_from_next_run: *applies_from_next_run,
                });
            }
            SessionChangeRecord::PolicyChanged {
                generation,
                policy,
                send_id,
                ..
            } => {
                if let Some(a) = self
                    .accepted
                    .as_mut()
                    .filter(|a| a.generation == *generation)
                {
                    a.policy = policy.clone();
                }
                self.policies
                    .insert(send_id.clone(), (*generation, policy.clone()));
            }
            SessionChangeRecord::Flushed {
                send_id,
                pending_generation,
                ..
            } => {
                self.flushes.insert(send_id.clone(), *pending_generation);
                self.flushed = self.flushed.max(pending_generation.unwrap_or(0));
            }
            // Who hosts and owns the session: `Session::apply_hosting`.
            SessionChangeRecord::HostStarted { .. } | SessionChangeRecord::Adopted { .. } => {}
        }
    }

    /// The highest accepted generation (0 before any).
    pub fn accepted_generation(&self) -> u64 {
        self.accepted.as_ref().map_or(0, |a| a.generation)
    }

    /// The accepted change not applied yet, given the session's effective plan.
    pub fn pending(&self, effective: Option<&FrozenPlan>) -> Option<&Accepted> {
        let applied = effective.map_or(0, |p| p.generation);
        self.accepted.as_ref().filter(|a| a.generation > applied)
    }

    /// The pending change a run starting now applies: one at `immediately`, or one whose
    /// rung's point the run meets (`rebuilt`: it runs on another model than the session's
    /// latest run; or a flush asked for the change).
    pub fn due(&self, effective: Option<&FrozenPlan>, rebuilt: bool) -> Option<&Accepted> {
        self.pending(effective)
            .filter(|a| a.policy == rungs::IMMEDIATELY || rebuilt || self.flushed >= a.generation)
    }
}

/// What a `session.refresh` comes to before its plan is fetched.
#[derive(Debug, Clone, PartialEq)]
pub enum Refresh {
    /// An identical repeat of the accepted refresh: its answer, nothing fetched or written.
    Repeat(Value),
    /// A new generation: fetch its plan, then [`accept`] it.
    Fetch,
}

/// Classifies a refresh of `generation` with a plan of identity `identity` under `policy`.
pub fn order(
    changes: &Changes,
    generation: u64,
    identity: &str,
    policy: &str,
) -> Result<Refresh, Refusal> {
    let accepted = changes.accepted_generation();
    let earlier = changes
        .accepted
        .as_ref()
        .filter(|a| a.generation == generation)
        .map(|a| (a.plan.identity.as_str(), a.policy.as_str()));
    match refresh_order(accepted, generation, identity, policy, earlier) {
        RefreshOrder::New => Ok(Refresh::Fetch),
        RefreshOrder::Repeat => Ok(Refresh::Repeat(
            changes.accepted.as_ref().expect("a repeat has one").reply(),
        )),
        RefreshOrder::Stale => Err(Refusal::GenerationStale { accepted }),
    }
}

/// The surfaces a change from `effective` to `next` touches (`tools`, `system_text`); a
/// session without a plan offered its tools config's (`current_tools`, their digest).
fn touched(effective: Option<&FrozenPlan>, current_tools: &str, next: &FrozenPlan) -> Vec<String> {
    let (tools_before, text_before) = match effective {
        Some(p) => (p.tools_digest.as_str(), p.system_text.as_deref()),
        None => (current_tools, None),
    };
    let mut touched = Vec::new();
    if tools_before != next.tools_digest {
        touched.push(surfaces::TOOLS.to_string());
    }
    if text_before != next.system_text.as_deref() {
        touched.push(surfaces::SYSTEM_TEXT.to_string());
    }
    touched
}

/// Accepts a fetched refresh: the record to write (none for an identical repeat, which a
/// refresh racing its own repeat may find) and the answer. `current_tools` is the tools
/// digest of the session's latest run (what a plan-less session offers); `run_in_progress`,
/// whether a run of the session is running now.
pub fn accept(
    changes: &Changes,
    effective: Option<&FrozenPlan>,
    current_tools: &str,
    (generation, policy): (u64, &str),
    mut plan: FrozenPlan,
    run_in_progress: bool,
    now_ms: u64,
) -> Result<(Option<SessionChangeRecord>, Value), Refusal> {
    if let Refresh::Repeat(answer) = order(changes, generation, &plan.identity, policy)? {
        return Ok((None, answer));
    }
    if !RUNGS.contains(&policy) {
        if let Some(surface) = touched(effective, current_tools, &plan).into_iter().next() {
            return Err(Refusal::RungUnsupported {
                surface,
                rung: policy.to_string(),
            });
        }
    }
    plan.generation = generation;
    let tools = plan.tools.to_vec();
    // A new generation is above any a flush asked for: only `immediately` applies at once.
    let applies_from_next_run = policy == rungs::IMMEDIATELY;
    let accepted = Accepted {
        generation,
        policy: policy.to_string(),
        plan: Box::new(plan.clone()),
        run_in_progress,
        applies_from_next_run,
    };
    let answer = accepted.reply();
    let record = SessionChangeRecord::Refreshed {
        generation,
        policy: policy.to_string(),
        plan: Box::new(plan),
        tools,
        run_in_progress,
        applies_from_next_run,
        at_unix_ms: now_ms,
    };
    Ok((Some(record), answer))
}

/// `session.refresh_policy {generation, policy, send_id}`: the record to write (none for a
/// repeat) and the answer.
pub fn refresh_policy(
    changes: &Changes,
    effective: Option<&FrozenPlan>,
    current_tools: &str,
    (generation, policy, send_id): (u64, &str, &str),
    now_ms: u64,
) -> Result<(Option<SessionChangeRecord>, Value), Refusal> {
    let answer = |generation: u64, policy: &str| {
        serde_json::to_value(RefreshPolicyReply::new(PendingChange {
            generation,
            policy: policy.to_string(),
        }))
        .expect("a policy reply serializes")
    };
    if let Some((g, p)) = changes.policies.get(send_id) {
        return if *g != generation {
            Err(Refusal::ChangeSendIdReuse {
                field: "generation",
            })
        } else if p != policy {
            Err(Refusal::ChangeSendIdReuse { field: "policy" })
        } else {
            Ok((None, answer(*g, p)))
        };
    }
    let applied = effective.map_or(0, |p| p.generation);
    if generation <= applied && applied > 0 {
        return Err(Refusal::AlreadyApplied {
            generation,
            applied_by: APPLIED_BY.to_string(),
        });
    }
    let Some(pending) = changes.pending(effective) else {
        return Err(Refusal::PendingSuperseded {
            generation,
            pending: changes.accepted_generation(),
        });
    };
    if pending.generation != generation {
        return Err(Refusal::PendingSuperseded {
            generation,
            pending: pending.generation,
        });
    }
    if !RUNGS.contains(&policy) {
        if let Some(surface) = touched(effective, current_tools, &pending.plan)
            .into_iter()
            .next()
        {
            return Err(Refusal::RungUnsupported {
                surface,
                rung: policy.to_string(),
            });
        }
    }
    let record = SessionChangeRecord::PolicyChanged {
        generation,
        policy: policy.to_string(),
        send_id: send_id.to_string(),
        at_unix_ms: now_ms,
    };
    Ok((Some(record), answer(generation, policy)))
}

/// `session.flush_prefix {send_id}`: the record to write (none for a repeat) and the answer,
/// the pending generation the next run applies.
pub fn flush_prefix(
    changes: &Changes,
    effective: Option<&FrozenPlan>,
    send_id: &str,
    now_ms: u64,
) -> (Option<SessionChangeRecord>, Value) {
    let answer = |g: Option<u64>| {
        serde_json::to_value(FlushPrefixReply::new(g)).expect("a flush reply serializes")
    };
    if let Some(g) = changes.flushes.get(send_id) {
        return (None, answer(*g));
    }
    let pending_generation = changes.pending(effective).map(|a| a.generation);
    let record = SessionChangeRecord::Flushed {
        send_id: send_id.to_string(),
        pending_generation,
        at_unix_ms: now_ms,
    };
    (Some(record), answer(pending_generation))
}

/// Puts the change members into a ready baseline `value` (`{state, baseline}`): the rungs
/// broca supports, the accepted and applied generations, the pending change and the
/// effective one.
pub fn baseline(value: &mut Value, changes: &Changes, effective: Option<&FrozenPlan>) {
    let Some(b) = value.get_mut("baseline").and_then(Value::as_object_mut) else {
        return;
    };
    let rungs = Rungs {
        tools: RUNGS.iter().map(|r| r.to_string()).collect(),
        system_text: RUNGS.iter().map(|r| r.to_string()).collect(),
    };
    b.insert(
        "rungs".into(),
        serde_json::to_value(rungs).expect("serializes"),
    );
    b.insert(
        "accepted_generation".into(),
        changes.accepted_generation().into(),
    );
    let applied = effective.map_or(0, |p| p.generation);
    b.insert("applied_generation".into(), applied.into());
    if let Some(p) = changes.pending(effective) {
        let pending = PendingChange {
            generation: p.generation,
            policy: p.policy.clone(),
        };
        b.insert(
            "pending".into(),
            serde_json::to_value(pending).expect("serializes"),
        );
    }
    if let Some(plan) = effective.filter(|p| p.generation > 0) {
        let e = EffectiveBaseline {
            generation: plan.generation,
            applied_by: APPLIED_BY.to_string(),
            manifest_digest: plan.identity.clone(),
        };
        b.insert(
            "effective".into(),
            serde_json::to_value(e).expect("serializes"),
        );
    }
}
