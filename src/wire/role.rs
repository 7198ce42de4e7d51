//! The `llm-runner/v1` role (the ecosystem's `cortexkit-role-llm-runner`, whose types these
//! answers are): `role.describe`, what this build serves of the role, and `session.baseline`,
//! what a session froze. broca declares the role's required ops and the capability groups in
//! [`GROUPS`]: a group is declared only once every op in it keeps the role's contract (a
//! consumer uses only what is declared). Sessions take no fetch plan, so a baseline is plan-less: no items,
//! the tool names its latest run froze. broca has no admission baseline, so session-level
//! capabilities come from `session.baseline`.

use cortexkit_role_llm_runner::baseline::{Baseline, BaselineReply};
use cortexkit_role_llm_runner::describe::{Major, RoleDescribe};
use serde_json::Value;

pub use cortexkit_role_llm_runner::{PROVIDES, REQUIRED_OPS};

use cortexkit_role_llm_runner::capabilities as groups;

/// The capability groups broca declares: each served whole, as the role's contract says.
pub const GROUPS: &[&str] = &[
    groups::TRANSCRIPT_READS,
    groups::QUEUE,
    groups::RUN_OPS,
    groups::RUN_STATUS,
    groups::RUN_USAGE,
    groups::FINISH_REASON,
    groups::INTERRUPT_REASON,
    groups::RUN_CANCEL,
    groups::RETRACT,
    groups::MAX_STEPS,
    groups::MAX_OUTPUT_TOKENS,
    groups::NO_TOOLS,
    groups::SEND_STATUS,
    groups::STREAMING,
    groups::INPUT_TOKEN_CAP,
    groups::DISPATCH_ATTRIBUTION,
    groups::RUN_TOOL_CALLS,
    groups::SESSION_USAGE,
    groups::HOST_HISTORY,
    groups::HISTORY_DISPLAY,
    groups::CLIENT_MESSAGE_ID,
    groups::READ_DISPLAY_FACTS,
    groups::LIVE_EVENTS,
    groups::RUN_CAUSE,
    groups::CALL_IDENTITY,
    groups::TURN_DIRECTIVES,
    groups::STRUCTURED_OUTPUT,
    groups::STEER,
    groups::INTERRUPT,
    groups::ATTACHMENTS,
    groups::RETENTION,
    groups::SESSION_RETENTION,
];

/// The longest `retention` a send may ask, in seconds (ten years).
pub const RETENTION_MAX_SECONDS: u64 = 10 * 365 * 86_400;
/// How long after a session's expiry its content is gone (docs/retention.md): the tombstone
/// is written at expiry, and the deletion follows it at once; a shard looks for expired
/// sessions every [`RETENTION_SWEEP_MS`].
pub const RETENTION_DELETE_WITHIN_MS: u64 = 30_000;
/// How often a shard looks for expired sessions.
pub const RETENTION_SWEEP_MS: u64 = 5_000;

/// `session_retention`'s limits (docs/retention.md): the longest `keep: {days}`, in days.
pub const POLICY_MAX_DAYS: u32 = 3650;
/// How long a `keep: "none"` session nobody released is kept after its last run ends.
pub const UNRELEASED_HOLD_MS: u64 = 86_400_000;
/// The floor: no session's content is deleted sooner than this many days after the later of
/// its last activity and its release.
pub const MIN_HOLD_DAYS: u32 = 0;
/// A day, in milliseconds.
pub const DAY_MS: u64 = 86_400_000;

/// `session.read`'s byte cap: the default, and the largest honoured.
pub const READ_MAX_BYTES: (u64, u64) = (256 * 1024, 3 * 1024 * 1024);

/// The ops this build serves: the required ones and every op of each declared group.
pub fn ops(plans: bool) -> Vec<String> {
    let mut ops: Vec<String> = REQUIRED_OPS.iter().map(|op| op.to_string()).collect();
    for (group, group_ops) in groups::GROUPS {
        let planned = [groups::USER_COMMANDS, groups::SESSION_CHANGE, groups::ADOPT];
        if GROUPS.contains(group) || (plans && planned.contains(group)) {
            for op in *group_ops {
                if !ops.iter().any(|o| o == op) {
                    ops.push(op.to_string());
                }
            }
        }
    }
    ops
}

/// What a front declares beyond [`GROUPS`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Declared {
    /// This front publishes step hints (module mode, on the daemon's bus).
    pub step_events: bool,
    /// A session's first send must name a `retention_policy` (module mode, where every
    /// starter sends one).
    pub policy_required: bool,
    /// The archive prunes reasoning as it packs (`archive_prunes_reasoning`, the kinds
    /// [`PRUNE_KINDS`]): the serve config's `prune_reasoning`.
    pub prunes_reasoning: bool,
    /// Sends may carry a fetch plan (`plans`), and the commands a plan's providers declare
    /// are relayed (`user_commands`): the serve config's `plans`.
    pub plans: bool,
    /// Sends may carry an ordered delivery and a plan its senders (`delivery_order`): the
    /// serve config's `delivery_order`.
    pub delivery_order: bool,
    /// The runner runs a plan's `pre_user` hooks (`step_hooks`): module mode hosting
    /// compaction providers, whose contract has the runner run that hook (A10).
    pub pre_user: bool,
}

/// The list modes broca delivers (`delivery_order_modes`): every mode but `turn_system`,
/// which no provider route of broca is confirmed to take.
pub const DELIVERY_ORDER_MODES: &[&str] = &["tool_result", "steer", "idle_start"];

/// The kinds of `archive_prunes_reasoning` broca applies: a reasoning block's text and
/// signature emptied (broca's other blocks carry no signature).
pub const PRUNE_KINDS: &[&str] =
    &[cortexkit_role_llm_runner::archive_prunes_reasoning::kinds::REASONING];

/// The `role.describe` answer of this build, for a front declaring `declared`.
pub fn describe(declared: Declared) -> Value {
    let Declared {
        step_events,
        policy_required,
        prunes_reasoning,
        plans,
        delivery_order,
        pre_user,
    } = declared;
    let major = Major {
        version: PROVIDES.to_string(),
        ops: ops(plans),
        stability: "alpha".to_string(),
    };
    let mut answer = RoleDescribe::new(vec![major], env!("CARGO_PKG_VERSION"))
        .with_capabilities(
            GROUPS
                .iter()
                .copied()
                .chain(step_events.then_some(groups::STEP_EVENTS))
                .chain(prunes_reasoning.then_some(groups::ARCHIVE_PRUNES_REASONING))
                .chain(plans.then_some(groups::PLANS))
                .chain(plans.then_some(groups::SYSTEM_TEXT_DEFAULT))
                .chain(plans.then_some(groups::USER_COMMANDS))
                .chain(plans.then_some(groups::SESSION_CHANGE))
                .chain(plans.then_some(groups::ADOPT))
                .chain(delivery_order.then_some(groups::DELIVERY_ORDER))
                .chain(delivery_order.then_some(groups::SENDER_SUCCESSION))
                .chain(delivery_order.then_some(groups::RETRACT_OWN_SEND))
                .chain(delivery_order.then_some(groups::RUN_CANCEL_BY_INTERRUPT))
                .map(str::to_string)
                .collect(),
        )
        .with_session_capabilities_from("baseline");
    if delivery_order {
        answer = answer.with_delivery_order_modes(
            DELIVERY_ORDER_MODES.iter().map(|m| m.to_string()).collect(),
        );
    }
    if GROUPS.contains(&groups::RETENTION) {
        answer = answer.with_retention(RETENTION_MAX_SECONDS, RETENTION_DELETE_WITHIN_MS);
    }
    if GROUPS.contains(&groups::SESSION_RETENTION) {
        let limits = cortexkit_role_llm_runner::describe::SessionRetention::new(
            POLICY_MAX_DAYS,
            UNRELEASED_HOLD_MS,
            policy_required,
        )
        .with_min_hold_days(MIN_HOLD_DAYS);
        answer = answer.with_session_retention(limits);
    }
    if GROUPS.contains(&groups::TRANSCRIPT_READS) {
        answer = answer.with_max_bytes(READ_MAX_BYTES.0, READ_MAX_BYTES.1);
    }
    answer = answer.with_run_cancel(
        crate::CancelAt::ALL
            .iter()
            .map(|at| at.to_string())
            .collect(),
    );
    if step_events {
        answer = answer.with_step_events(step_hint_policy());
    }
    if pre_user {
        answer = answer.with_step_hooks(["pre_user"]);
    }
    if prunes_reasoning {
        answer = answer.with_archive_prunes_reasoning(
            cortexkit_role_llm_runner::archive_prunes_reasoning::ArchivePrunesReasoning::new(
                PRUNE_KINDS.iter().map(|k| k.to_string()).collect(),
            ),
        );
    }
    serde_json::to_value(answer).expect("a describe answer serializes")
}

/// broca's `step_events` policy: one hint per recorded model attempt, positioned by the WAL
/// record (broca_read::step_events says how).
fn step_hint_policy() -> cortexkit_role_llm_runner::step_events::StepEvents {
    cortexkit_role_llm_runner::step_events::StepEvents::new("per_attempt", "step_ref")
}

/// The `session.baseline` answer: `not_yet` for a session nothing has reached (`None`), else
/// the plan-less baseline with the tool names its latest run froze.
pub fn baseline(tool_names: Option<Vec<String>>) -> Value {
    let reply = match tool_names {
        None => BaselineReply::not_yet(),
        Some(mut names) => {
            names.sort();
            names.dedup();
            BaselineReply::ready(Baseline::plan_less(names))
        }
    };
    serde_json::to_value(reply).expect("a baseline serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_describe_answer_holds_for_the_roles_own_check() {
        let d = cortexkit_role_llm_runner::describe::check_describe(&describe(Declared::default()))
            .unwrap_or_else(|p| panic!("{p:?}"));
        assert_eq!(d.capabilities, GROUPS);
        assert!(d.session_retention.is_some_and(|l| !l.required));
        let all = Declared {
            step_events: true,
            policy_required: true,
            prunes_reasoning: true,
            plans: true,
            delivery_order: true,
            pre_user: true,
        };
        let d = cortexkit_role_llm_runner::describe::check_describe(&describe(all))
            .unwrap_or_else(|p| panic!("{p:?}"));
        assert!(d.serves_step_hooks(["pre_user"]));
        assert!(!d.serves_step_hooks(["pre_user", "post_tool"]));
        assert_eq!(
            d.archive_prunes_reasoning.map(|a| a.kinds),
            Some(vec!["reasoning".to_string()])
        );
        assert!(d.session_retention.is_some_and(|l| l.required
            && l.max_days == POLICY_MAX_DAYS
            && l.max_unreleased_hold_ms == UNRELEASED_HOLD_MS));
        assert_eq!(
            &d.capabilities[GROUPS.len()..],
            [
                groups::STEP_EVENTS,
                groups::ARCHIVE_PRUNES_REASONING,
                groups::PLANS,
                groups::SYSTEM_TEXT_DEFAULT,
                groups::USER_COMMANDS,
                groups::SESSION_CHANGE,
                groups::ADOPT,
                groups::DELIVERY_ORDER,
                groups::SENDER_SUCCESSION,
                groups::RETRACT_OWN_SEND,
                groups::RUN_CANCEL_BY_INTERRUPT
            ]
        );
        assert_eq!(
            d.delivery_order_modes,
            Some(vec![
                "tool_result".into(),
                "steer".into(),
                "idle_start".into()
            ])
        );
        assert_eq!(d.step_events, Some(step_hint_policy()));
    }

    #[test]
    fn baselines_read_back_as_the_role_defines_them() {
        let r: BaselineReply = serde_json::from_value(baseline(None)).unwrap();
        assert!(r.is_not_yet());
        let r: BaselineReply =
            serde_json::from_value(baseline(Some(vec!["b".into(), "a".into(), "b".into()])))
                .unwrap();
        let b = r.baseline.unwrap();
        assert_eq!(b.tool_names, ["a", "b"]);
        assert!(b.plan_consistent());
    }
}
