//! A provider's view checked against a transcript a real run machine wrote, and the request
//! messages rendered under it.

use std::sync::Arc;

use broca_protocol::{Block, FinishReason, Message, Role as MsgRole, StreamEvent};
use cortexkit_role_compaction::read::{Entry, Role};
use cortexkit_role_compaction::rules::{EditCost, ProviderRules, SignedParts};
use cortexkit_role_compaction::view::{
    Edit, EditOp, InsertAt, InsertedImage, InsertedMessage, View, ViewRefusal,
};
use serde_json::json;

use super::{check, render};
use crate::neutral::transcript;
use broca_core::machine::Event;
use broca_core::support_tests::config;
use broca_core::support_tests::Live;

/// The send "read the file", a step calling `echo` (call `c1`) with `{"path": "a.rs"}`, its
/// result (when `done`) and the answer "It says hello.".
fn run(done: bool) -> Live {
    let mut live = Live::start(config(), "read the file");
    live.call_step(Some("Reading."), "c1", "echo", r#"{"path": "a.rs"}"#);
    if done {
        live.answered("c1", "hello");
        live.text_step("It says hello.");
    }
    live
}

fn rules() -> ProviderRules {
    ProviderRules::new(SignedParts::None, EditCost::Suffix)
}

fn neutral(live: &Live) -> Vec<Entry> {
    transcript(live.session.entries.as_ref().unwrap(), 0)
}

/// The request messages under `edits` (as view 1), as (role, blocks) pairs.
fn rendered(live: &Live, edits: Vec<EditOp>) -> Vec<(MsgRole, Vec<Block>)> {
    let list = neutral(live);
    let view = View::seal(1, edits.into_iter().map(|op| Edit::new(1, op)).collect());
    let plan = check(&list, None, &view, &rules()).expect("the view is accepted");
    render(
        &live.session.entries.as_ref().unwrap().list,
        &live.session.transcript,
        &plan,
    )
    .iter()
    .map(|m| (m.role, m.content.clone()))
    .collect()
}

fn text(t: &str) -> Block {
    Block::Text { text: t.into() }
}

fn result(content: &str) -> Block {
    Block::ToolResult {
        tool_use_id: "c1".into(),
        content: content.into(),
        is_error: false,
    }
}

fn call(args: &str) -> Block {
    Block::ToolUse {
        id: "c1".into(),
        name: "echo".into(),
        input: broca_protocol::Json::from_text(args.into()).unwrap(),
    }
}

#[test]
fn an_empty_view_shows_every_numbered_part_behind_its_number() {
    let live = run(true);
    assert_eq!(
        rendered(&live, vec![]),
        [
            (MsgRole::User, vec![text("§1§ read the file")]),
            (
                MsgRole::Assistant,
                vec![text("§2§ Reading."), call(r#"{"path": "a.rs"}"#)]
            ),
            (MsgRole::User, vec![result("§3§ hello")]),
            (MsgRole::Assistant, vec![text("§4§ It says hello.")]),
        ]
    );
}

#[test]
fn dropping_a_tool_part_leaves_out_its_call_and_its_result() {
    let live = run(true);
    let mid = neutral(&live)[1].mid.clone();
    assert_eq!(
        rendered(
            &live,
            vec![EditOp::Drop {
                mid,
                part: Some("1".into())
            }]
        ),
        [
            (MsgRole::User, vec![text("§1§ read the file")]),
            (MsgRole::Assistant, vec![text("§2§ Reading.")]),
            (MsgRole::Assistant, vec![text("§4§ It says hello.")]),
        ]
    );
}

#[test]
fn a_cut_and_a_head_replace_the_oldest_turns_and_replaced_bytes_are_final() {
    let live = run(true);
    let list = neutral(&live);
    let tool = &list[1].parts[1];
    let answer = &list[3].parts[0];
    let got = rendered(
        &live,
        vec![
            EditOp::Insert {
                at: InsertAt::Start,
                message: InsertedMessage::new("head", Role::User, vec!["Earlier: a file.".into()]),
            },
            EditOp::Cut {
                through: list[0].mid.clone(),
            },
            EditOp::Replace {
                mid: list[1].mid.clone(),
                part: "1".into(),
                field: "output".into(),
                value: json!("[result dropped §3§]"),
                expect: tool.digest.clone(),
            },
            EditOp::Replace {
                mid: list[1].mid.clone(),
                part: "1".into(),
                field: "input.path".into(),
                value: json!("…"),
                expect: tool.digest.clone(),
            },
            EditOp::Replace {
                mid: list[3].mid.clone(),
                part: "0".into(),
                field: "text".into(),
                value: json!("Hello."),
                expect: answer.digest.clone(),
            },
        ],
    );
    assert_eq!(
        got,
        [
            (MsgRole::User, vec![text("Earlier: a file.")]),
            (
                MsgRole::Assistant,
                vec![text("§2§ Reading."), call(r#"{"path":"…"}"#)]
            ),
            (MsgRole::User, vec![result("[result dropped §3§]")]),
            (MsgRole::Assistant, vec![text("Hello.")]),
        ]
    );
}

#[test]
fn a_view_is_refused_by_name_and_a_refusal_changes_nothing() {
    let live = run(true);
    let list = neutral(&live);
    let mid = list[1].mid.clone();
    let drop = |since| {
        Edit::new(
            since,
            EditOp::Drop {
                mid: mid.clone(),
                part: None,
            },
        )
    };

    let mut forged = View::seal(1, vec![drop(1)]);
    forged.version = 2;
    assert_eq!(
        check(&list, None, &forged, &rules()),
        Err(ViewRefusal::BadChecksum)
    );

    let first = View::seal(3, vec![drop(3)]);
    check(&list, None, &first, &rules()).unwrap();
    assert_eq!(
        check(&list, Some(&first), &View::seal(3, vec![drop(3)]), &rules()),
        Err(ViewRefusal::StaleVersion {
            version: 3,
            latest: 3
        })
    );
    // An edit claiming it was in view 2 when view 3 was the one applied.
    assert_eq!(
        check(&list, Some(&first), &View::seal(4, vec![drop(2)]), &rules()),
        Err(ViewRefusal::BadSince)
    );
    let stale = View::seal(
        1,
        vec![Edit::new(
            1,
            EditOp::Replace {
                mid: mid.clone(),
                part: "0".into(),
                field: "text".into(),
                value: json!("x"),
                expect: "0".repeat(64),
            },
        )],
    );
    assert_eq!(
        check(&list, None, &stale, &rules()),
        Err(ViewRefusal::StalePart {
            mid: mid.clone(),
            part: "0".into()
        })
    );
    let image = InsertedMessage::new("pic", Role::User, vec!["see".into()]);
    let mut image = image;
    image.images.push(InsertedImage::new("image/png", "AAAA"));
    let images = View::seal(
        1,
        vec![
            drop(1),
            Edit::new(
                1,
                EditOp::Insert {
                    at: InsertAt::Start,
                    message: image,
                },
            ),
        ],
    );
    assert_eq!(
        check(&list, None, &images, &rules()),
        Err(ViewRefusal::UnsupportedEdit { index: 1 })
    );
    let tagged = View::seal(
        1,
        vec![Edit::new(
            1,
            EditOp::Insert {
                at: InsertAt::Start,
                message: InsertedMessage::new("h", Role::User, vec!["see §2§".into()]),
            },
        )],
    );
    assert_eq!(
        check(&list, None, &tagged, &rules()),
        Err(ViewRefusal::TaggedInsert { id: "h".into() })
    );
    // A call still running cannot be dropped.
    let running = run(false);
    let list = neutral(&running);
    let running_drop = View::seal(
        1,
        vec![Edit::new(
            1,
            EditOp::Drop {
                mid: list[1].mid.clone(),
                part: Some("1".into()),
            },
        )],
    );
    assert_eq!(
        check(&list, None, &running_drop, &rules()),
        Err(ViewRefusal::RunningTool {
            mid: list[1].mid.clone(),
            part: "1".into()
        })
    );
}

#[test]
fn a_message_the_view_keeps_whole_is_the_transcripts_own() {
    // Reasoning-only messages take no number: under an empty view the same Arc goes out.
    let mut live = Live::start(config(), "think");
    live.feed(Event::Stream(StreamEvent::ThinkingDelta("hm".into())));
    live.feed(Event::Stream(StreamEvent::ThinkingSignature("sig".into())));
    live.feed(Event::Stream(StreamEvent::Finish {
        reason: FinishReason::EndTurn,
        request_id: None,
    }));
    live.feed(Event::StepEnded);
    let list = neutral(&live);
    let plan = check(&list, None, &View::seal(1, vec![]), &rules()).unwrap();
    let out = render(
        &live.session.entries.as_ref().unwrap().list,
        &live.session.transcript,
        &plan,
    );
    let thought: &Arc<Message> = &live.session.transcript[1];
    assert!(Arc::ptr_eq(&out[1], thought));
}
