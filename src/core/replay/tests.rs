//! Replay's own checks: records that do not fit are corruption named by their seq.

use super::*;
use broca_protocol::{Json, ToolCall};
use broca_wal::runrec::{ResultBlock, ToolDispatchIntent, ToolResult};

pub(crate) use crate::support_tests::{started, started_with, step};

#[test]
fn steps_out_of_order_and_results_no_intent_waits_for_are_corruption_with_their_seq() {
    let gap = [(1, started()), (2, step(1)), (3, step(3))];
    let e = Session::replay(gap.into_iter()).unwrap_err();
    assert_eq!(e.seq, 3);
    assert!(
        matches!(
            e.reason,
            Misfit::StepOutOfOrder {
                step: 3,
                previous: 1,
                ..
            }
        ),
        "{}",
        e.reason
    );

    let intent = Record::ToolDispatchIntent(ToolDispatchIntent {
        run_id: "r".into(),
        step: 1,
        batch_id: "r.1".into(),
        calls: vec![ToolCall {
            id: "c1".into(),
            name: "t".into(),
            input: Json::from_text("{}".into()).unwrap(),
        }],
        call_keys: Vec::new(),
        dispatched_to: Vec::new(),
        schema_pins: Vec::new(),
        step_seq: None,
        at_unix_ms: None,
    });
    let result = |id: &str| {
        Record::ToolResult(ToolResult {
            run_id: "r".into(),
            batch_id: "r.1".into(),
            result: ResultBlock {
                call_id: id.into(),
                content: "x".into(),
                is_error: false,
                reason: None,
                size: None,
                parts: Vec::new(),
            },
            step_seq: None,
            call_key: None,
            schema_pin: None,
            at_unix_ms: None,
        })
    };
    let stray = [
        (1, started()),
        (2, step(1)),
        (3, intent.clone()),
        (4, result("c9")),
    ];
    let e = Session::replay(stray.into_iter()).unwrap_err();
    assert_eq!(e.seq, 4);
    assert!(
        matches!(&e.reason, Misfit::StrayResult { call_id, .. } if call_id == "c9"),
        "{}",
        e.reason
    );
    let fine = [(1, started()), (2, step(1)), (3, intent), (4, result("c1"))];
    let s = Session::replay(fine.into_iter()).unwrap();
    assert_eq!(s.open.unwrap().point, ResumePoint::ToolsDone);
}
