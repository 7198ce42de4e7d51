//! broca-core: the run loop's domain, sans-IO: admission, the state machine, stream folding,
//! replay, what a run spent (usage totals, cost, budgets' measures) and usage facts. Nothing
//! here touches a file, a socket or a clock: time, the catalog and randomness come in from
//! the caller.
//!
//! Its floors, from the ground up (a file imports only downward; `tests/tidy.rs` refuses a
//! circle):
//! - the session as its records tell it: `replay` (`Session` and its `apply`, shared by replay
//!   and live appends, so the two cannot drift), with what it folds in its children: steered
//!   sends and their receipts (`replay/steer.rs`), a send found by its sender and `send_id`
//!   (`replay/sends.rs`), uploads (`replay/uploads.rs`), who hosts and owns the session
//!   (`replay/hosting.rs`), reasoning prunes (`replay/prunes.rs`), a compaction provider's
//!   view (`replay/view.rs`), where an open run resumes and where a result goes
//!   (`replay/point.rs`), a record that does not fit (`replay/misfit.rs`); beside it, the
//!   role's entries with each call's facts (`entries.rs`), the meter (`spend.rs`), stream
//!   folding (`stream.rs`), the built-in compaction's pure parts (`compaction.rs`), late
//!   results (`late.rs`) and usage facts (`usage.rs`);
//! - the run machine (`machine.rs`: events in with `handle`, commands out with
//!   `poll_command`; its children in `machine/`: limits, resume, step_end, stop, submit,
//!   steer, compact) and whether an earlier start's run resumes (`resume.rs`);
//! - admission (`admission.rs`, before any record is written: a repeated send_id, a planned
//!   session's config, retention and storage policy, a steer checked against the run it
//!   joins, the next queued send, ordered delivery; what a send must be on its own in
//!   `admission/checks.rs`), a host's start and an adoption (`adopt.rs`), call keys.
//!
//! What the brief gives other crates is theirs: plans (broca-fetch-plan, below), the
//! compaction contract's view (broca-ck) and the reads (broca-read), above.

pub mod admission;
pub mod adopt;
#[cfg(test)]
mod change_tests;
#[cfg(test)]
mod commands_tests;
pub mod compaction;
#[cfg(test)]
mod compaction_tests;
pub mod entries;
#[cfg(test)]
mod input_cap_tests;
pub mod late;
pub mod machine;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod plan_tests;
pub mod replay;
pub mod resume;
#[cfg(test)]
mod retention_tests;
pub mod spend;
#[cfg(test)]
mod steer_tests;
pub mod stream;
#[cfg(any(test, feature = "test-support"))]
pub mod support_tests;
pub mod usage;

pub use admission::{admit, Admitted, Refusal, SendRequest};
pub use machine::{
    Command, DeltaKind, DisplayDelta, Event, Outcome, ResumeFrom, ResumePoint, RunMachine, Timeout,
    TimeoutKind,
};
pub use replay::{Expiry, Misfit, ReplayError, RunState, RunView, Session};

/// The key of the call at `index` of the tool batch `batch_id` of session `triple` (the
/// llm-runner/v1 role's `call_key`, which a tool provider deduplicates on): minted when the
/// call's dispatch intent is written and recorded there, so it never changes after a
/// restart. From the session, the run and step (the batch), the call's place in the batch
/// and the model's id: sibling calls and a model id reused by a later step get keys of
/// their own. `broca:` and 32 hex digits (printable ASCII, as tool-provider/v1 bounds it).
pub fn call_key(
    triple: &broca_wal::SessionTriple,
    batch_id: &str,
    index: usize,
    call_id: &str,
) -> String {
    let mut h = blake3::Hasher::new();
    let index = index.to_string();
    for part in [
        "broca-call-v2",
        triple.project_root.as_str(),
        triple.harness.as_str(),
        triple.session.as_str(),
        batch_id,
        index.as_str(),
        call_id,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("broca:{}", &h.finalize().to_hex()[..32])
}

#[cfg(test)]
mod call_key_tests {
    #[test]
    fn keys_differ_between_siblings_steps_and_sessions_and_never_change() {
        let t = broca_wal::SessionTriple::new("/p", "h", "s").unwrap();
        let other = broca_wal::SessionTriple::new("/p", "h", "s2").unwrap();
        let a = super::call_key(&t, "run_1.1", 0, "call_0");
        assert_eq!(a, super::call_key(&t, "run_1.1", 0, "call_0"), "stable");
        for b in [
            super::call_key(&t, "run_1.1", 1, "call_0"),
            super::call_key(&t, "run_1.2", 0, "call_0"),
            super::call_key(&other, "run_1.1", 0, "call_0"),
        ] {
            assert_ne!(a, b);
        }
        assert!(a.len() <= 256 && a.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    }
}
