//! Mid-session changes in the domain alone (llm-runner/v1 `session_change`): a refresh's
//! order against what the session accepted, its acceptance, when a run applies it, and the
//! baseline's change members.

use crate::admission::{admit_prepared, Admitted};
use crate::plan_tests::{admitted, send};
use crate::replay::Session;
use broca_fetch_plan::change::{self, Refresh};
use broca_wal::Record;
use broca_wire::Refusal;
use cortexkit_role_llm_runner::baseline::BaselineReply;
use serde_json::Value;

fn start(
    p: crate::admission::Prepared,
    s: &Session,
    run_id: &str,
) -> Box<broca_wal::runrec::RunStarted> {
    match admit_prepared(p, s, run_id.into(), 1).unwrap() {
        Admitted::New(r) => r,
        other => panic!("{other:?}"),
    }
}

/// A session whose one run (plan-less, the configured tool) is over; the next seq.
fn idle() -> (Session, u64) {
    let mut s = Session::default();
    let first = start(send(None, None), &s, "r1");
    s.apply(1, Record::RunStarted(first)).unwrap();
    s.apply(2, crate::retention_tests::finished("r1", 2))
        .unwrap();
    (s, 3)
}

fn run(s: &mut Session, seq: &mut u64, p: crate::admission::Prepared, run_id: &str) -> Vec<String> {
    let started = start(p, s, run_id);
    let names = started
        .config
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    s.apply(*seq, Record::RunStarted(started)).unwrap();
    s.apply(*seq + 1, crate::retention_tests::finished(run_id, 5))
        .unwrap();
    *seq += 2;
    names
}

fn accept(s: &mut Session, seq: &mut u64, generation: u64, policy: &str) -> Value {
    let current = s.runs.last().unwrap().config.tools_digest.clone();
    let (record, answer) = change::accept(
        &s.change,
        s.plan.as_deref(),
        &current,
        (generation, policy),
        admitted(),
        false,
        10,
    )
    .unwrap();
    s.apply(*seq, Record::SessionChange(Box::new(record.unwrap())))
        .unwrap();
    *seq += 1;
    answer
}

fn baseline(s: &Session) -> cortexkit_role_llm_runner::baseline::Baseline {
    let names = s
        .runs
        .last()
        .unwrap()
        .config
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    let mut value = match &s.plan {
        Some(p) => broca_fetch_plan::plan::baseline(p, names),
        None => broca_wire::role::baseline(Some(names)),
    };
    change::baseline(&mut value, &s.change, s.plan.as_deref());
    let reply: BaselineReply = serde_json::from_value(value).unwrap();
    reply.baseline.unwrap()
}

#[test]
fn a_refresh_applies_at_the_next_run_and_moves_the_generations() {
    let (mut s, mut seq) = idle();
    let before = baseline(&s);
    assert_eq!(
        (before.accepted_generation, before.applied_generation),
        (0, 0)
    );
    assert_eq!(
        before.rungs.unwrap().tools,
        ["on_prefix_rebuild", "immediately"]
    );
    let identity = admitted().identity;
    assert_eq!(
        change::order(&s.change, 1, &identity, "immediately"),
        Ok(Refresh::Fetch)
    );
    let answer = accept(&mut s, &mut seq, 1, "immediately");
    assert_eq!(answer["applies_from_next_run"], true);
    assert_eq!(answer["run_in_progress"], false);
    let pending = baseline(&s);
    assert_eq!(pending.accepted_generation, 1);
    assert_eq!(pending.applied_generation, 0);
    assert_eq!(pending.pending.unwrap().policy, "immediately");
    // An identical repeat answers as before; anything else at or below 1 is stale.
    assert_eq!(
        change::order(&s.change, 1, &identity, "immediately"),
        Ok(Refresh::Repeat(answer))
    );
    for (g, id, policy) in [
        (1, "other", "immediately"),
        (1, identity.as_str(), "on_prefix_rebuild"),
        (0, identity.as_str(), "immediately"),
    ] {
        assert_eq!(
            change::order(&s.change, g, id, policy),
            Err(Refusal::GenerationStale { accepted: 1 })
        );
    }
    // The next run offers the new plan's tools and carries the plan, generation 1.
    let names = run(&mut s, &mut seq, send(None, None), "r2");
    assert_eq!(names, ["read", "edit", "bash", "ctx_search"]);
    assert_eq!(s.plan.as_ref().unwrap().generation, 1);
    let after = baseline(&s);
    assert_eq!(
        (after.accepted_generation, after.applied_generation),
        (1, 1)
    );
    assert!(after.pending.is_none());
    let effective = after.effective.unwrap();
    assert_eq!(
        (effective.generation, effective.applied_by.as_str()),
        (1, "fold")
    );
    // Later runs stay on it, without carrying it again.
    let started = start(send(None, None), &s, "r3");
    assert!(started.config.plan.is_none());
    assert_eq!(started.config.tools.len(), 4);
}

#[test]
fn a_change_at_the_prefix_rebuild_waits_for_a_flush_or_another_model() {
    let (mut s, mut seq) = idle();
    let answer = accept(&mut s, &mut seq, 1, "on_prefix_rebuild");
    assert_eq!(answer["applies_from_next_run"], false);
    // The next run on the same model keeps the configured tool; the change stays pending.
    assert_eq!(
        run(&mut s, &mut seq, send(None, None), "r2"),
        ["configured_tool"]
    );
    assert_eq!(baseline(&s).pending.map(|p| p.generation), Some(1));
    // Another model rebuilds the prefix: that run applies it.
    let mut other = send(None, None);
    other.config.model = "another-model".into();
    let started = start(other, &s, "r3");
    assert_eq!(started.config.plan.as_ref().map(|p| p.generation), Some(1));
    // A flush asks for it as well, once per send_id.
    let (record, flushed) = change::flush_prefix(&s.change, s.plan.as_deref(), "f1", 20);
    assert_eq!(flushed["pending_generation"], 1);
    s.apply(seq, Record::SessionChange(Box::new(record.unwrap())))
        .unwrap();
    seq += 1;
    let (again, repeated) = change::flush_prefix(&s.change, s.plan.as_deref(), "f1", 21);
    assert!(again.is_none());
    assert_eq!(repeated, flushed);
    assert_eq!(run(&mut s, &mut seq, send(None, None), "r4").len(), 4);
    assert_eq!(baseline(&s).applied_generation, 1);
    // With nothing pending, a flush names no generation.
    let (_, none) = change::flush_prefix(&s.change, s.plan.as_deref(), "f2", 22);
    assert!(
        none.get("pending_generation").is_none_or(Value::is_null),
        "{none}"
    );
}

#[test]
fn a_pending_changes_rung_is_changed_once_per_send_id_and_never_after_it_applied() {
    let (mut s, mut seq) = idle();
    accept(&mut s, &mut seq, 1, "on_prefix_rebuild");
    let current = s.runs.last().unwrap().config.tools_digest.clone();
    let policy = |s: &Session, g: u64, p: &str, id: &str| {
        change::refresh_policy(&s.change, s.plan.as_deref(), &current, (g, p, id), 30)
    };
    // A rung broca does not serve, for a change that touches the tools.
    assert_eq!(
        policy(&s, 1, "on_system_rebuild", "p0").unwrap_err(),
        Refusal::RungUnsupported {
            surface: "tools".into(),
            rung: "on_system_rebuild".into()
        }
    );
    let (record, answer) = policy(&s, 1, "immediately", "p1").unwrap();
    s.apply(seq, Record::SessionChange(Box::new(record.unwrap())))
        .unwrap();
    seq += 1;
    assert_eq!(answer["pending"]["policy"], "immediately");
    assert_eq!(policy(&s, 1, "immediately", "p1").unwrap(), (None, answer));
    assert_eq!(
        policy(&s, 1, "on_prefix_rebuild", "p1").unwrap_err(),
        Refusal::ChangeSendIdReuse { field: "policy" }
    );
    assert_eq!(
        policy(&s, 2, "immediately", "p2").unwrap_err(),
        Refusal::PendingSuperseded {
            generation: 2,
            pending: 1
        }
    );
    // Now immediately: the next run applies it, and the generation can no longer change.
    run(&mut s, &mut seq, send(None, None), "r2");
    assert_eq!(
        policy(&s, 1, "on_prefix_rebuild", "p3").unwrap_err(),
        Refusal::AlreadyApplied {
            generation: 1,
            applied_by: "fold".into()
        }
    );
    let e = broca_wire::RpcError::refusal(&Refusal::GenerationStale { accepted: 2 });
    assert_eq!(e.code.as_str(), "generation_stale");
    assert_eq!(e.detail["accepted"], 2);
}

#[test]
fn a_send_queued_before_a_change_runs_on_it_with_its_own_text_kept() {
    let old = admitted();
    let mut next = admitted();
    next.system_text = Some("new text".into());
    next.generation = 3;
    let mut config = start(send(None, None), &Session::default(), "r").config;
    broca_fetch_plan::plan::apply(&mut config, &old, false).unwrap();
    assert_eq!(
        config.system.as_deref(),
        Some("aft text\n\ncore text\n\nown")
    );
    broca_fetch_plan::plan::reapply(&mut config, Some(&old), &next);
    assert_eq!(config.system.as_deref(), Some("new text\n\nown"));
    assert_eq!(config.plan.as_ref().map(|p| p.generation), Some(3));
}

#[test]
fn the_change_records_read_back_as_written() {
    let (s, _) = idle();
    let current = s.runs.last().unwrap().config.tools_digest.clone();
    let (record, _) = change::accept(
        &s.change,
        None,
        &current,
        (4, "immediately"),
        admitted(),
        true,
        9,
    )
    .unwrap();
    let rec = Record::SessionChange(Box::new(record.unwrap()));
    let mut out = Vec::new();
    rec.encode_payload(&mut out);
    let back = Record::decode(rec.kind(), &out).unwrap();
    let mut replayed = Session::default();
    replayed.apply(1, back).unwrap();
    let accepted = replayed.change.accepted.unwrap();
    assert_eq!(
        accepted.plan.tools.len(),
        4,
        "its tools written beside the plan"
    );
    assert_eq!(accepted.plan.generation, 4);
    assert!(accepted.run_in_progress);
    assert_eq!(Record::kind_name(rec.kind()), Some("session_change"));
}
