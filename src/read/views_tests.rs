//! The answers a re-send gets, from the session as the run left it: a steer delivered at a
//! step or as a turn of its own, and an ordered send that ended undelivered.

use broca_core::machine::Event;
use broca_core::support_tests::Live;
use broca_wal::runrec::{ResultBlock, SendEnded};

use super::{ended_answer, steer_answer};

fn ok(id: &str) -> ResultBlock {
    ResultBlock {
        call_id: id.into(),
        content: "ok".into(),
        is_error: false,
        reason: None,
        size: None,
        parts: Vec::new(),
    }
}

#[test]
fn a_steer_delivered_at_a_step_answers_that_step() {
    let mut live = Live::new();
    live.tool_step("c1");
    let seq = live.steer("st-1", "also check the tests");
    let pending = steer_answer(&live.session, seq).expect("the steer is the run's");
    assert_eq!(
        pending["state"], "active",
        "accepted, not yet delivered: {pending}"
    );
    assert!(pending.get("delivered").is_none(), "{pending}");
    live.feed(Event::ToolResult(ok("c1")));
    live.text_step("done");
    let answer = steer_answer(&live.session, seq).expect("the steer is the run's");
    assert_eq!(answer["delivered"]["as"], "step");
    assert_eq!(answer["delivered"]["ref"], seq.to_string());
    assert_eq!(answer["run_id"], "r");
    assert_eq!(answer["state"], "finished");
    assert_eq!(
        steer_answer(&live.session, seq + 100),
        None,
        "no steer of that seq"
    );
}

#[test]
fn a_steer_its_run_never_rendered_answers_the_turn_it_started() {
    let mut live = Live::new();
    live.tool_step("c1");
    let seq = live.steer("st-3", "then summarize");
    live.feed(Event::Cancel);
    live.feed(Event::ToolResult(ok("c1")));
    let next = broca_core::admission::start_queued(&live.session, "r2".into(), 1)
        .expect("the steer starts a turn");
    live.apply(broca_wal::Record::RunStarted(Box::new(next)));
    let answer = steer_answer(&live.session, seq).expect("the steer is the run's");
    assert_eq!(
        (
            &answer["delivered"]["as"],
            &answer["delivered"]["ref"],
            &answer["run_id"]
        ),
        (&"turn".into(), &"r2".into(), &"r2".into())
    );
}

#[test]
fn an_ordered_send_that_ended_answers_its_end() {
    assert_eq!(
        ended_answer(&SendEnded::Superseded { by: "s2".into() }),
        serde_json::json!({"state": "superseded"})
    );
    let gone = SendEnded::TemplatePartGone {
        slot: "part".into(),
    };
    assert_eq!(
        ended_answer(&gone),
        serde_json::json!({"state": "template_part_gone", "slot": "part"})
    );
}
