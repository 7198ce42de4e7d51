//! Held first replies against the role's vectors, and late entries as broca settles them.

use super::*;
use serde_json::json;

fn frame(ty: FrameType, body: &Value) -> FrameIn {
    crate::frames::test_frame(ty, crate::frames::data(), body)
}

fn vectors() -> Value {
    serde_json::from_str(cortexkit_role_tool_provider::vectors::HELD_REPLY_V1_JSON).unwrap()
}

#[test]
fn a_valid_held_reply_is_held_and_an_invalid_one_is_an_error_answer() {
    let v = vectors();
    for case in v["valid"].as_array().unwrap() {
        let reply =
            super::super::read_reply("ck-t", &frame(FrameType::Response, &case["body"]), true);
        let Reply::Held { parts, reason } = reply else {
            panic!("{}: {reply:?}", case["name"]);
        };
        assert_eq!(
            reason,
            case["body"]["held"]["reason"].as_str().unwrap(),
            "{}",
            case["name"]
        );
        assert!(!text_of(&parts).is_empty());
    }
    for group in ["invalid", "decode_invalid"] {
        for case in v[group].as_array().unwrap() {
            let reply =
                super::super::read_reply("ck-t", &frame(FrameType::Response, &case["body"]), true);
            assert!(
                matches!(reply, Reply::Answer { is_error: true, .. }),
                "{group} {}: {reply:?}",
                case["name"]
            );
        }
    }
    // broca's routes declare both capabilities the role's gate asks for.
    let open: Value =
        serde_json::from_slice(&super::super::route_open("ck-t", "h", "s", None, None)).unwrap();
    let declared: Vec<String> =
        serde_json::from_value(open["consumer_capabilities"].clone()).unwrap();
    for case in v["gating"].as_array().unwrap() {
        let caps: Option<Vec<String>> =
            serde_json::from_value(case["consumer_capabilities"].clone()).unwrap();
        assert_eq!(
            cortexkit_role_tool_provider::consumer_reads_held_reply_v1(caps.as_deref()),
            case["held"].as_bool().unwrap(),
            "{}",
            case["name"]
        );
    }
    assert!(cortexkit_role_tool_provider::consumer_reads_held_reply_v1(
        Some(&declared)
    ));
}

fn entry(kind: &str, extra: Value) -> LateEntry {
    let mut e = json!({"kind": kind, "owner": "reserved:ck-broca", "ref": "broca-session:1",
        "scope_epoch": 3, "custodian": "reserved:ck-broca", "call_key": "broca:k1",
        "event_id": format!("e-{kind}"), "settled_at": 1});
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::from_value(e).unwrap()
}

#[test]
fn each_kind_of_entry_settles_its_call_as_the_role_says() {
    let v1 = entry(
        "result",
        json!({"result": {"content": [{"type": "text", "text": "approved"}]}}),
    );
    assert_eq!(
        settle("ck-t", &v1),
        Settled::Answer(Reply::Parts {
            parts: vec![Part::Text("approved".into())],
            is_error: false
        })
    );
    let legacy = entry("result", json!({"result": "plain text"}));
    assert_eq!(
        settle("ck-t", &legacy),
        Settled::Answer(Reply::Answer {
            text: "plain text".into(),
            is_error: false
        })
    );
    let reduced = entry("result", json!({"reduced": true, "outcome": "merged"}));
    assert_eq!(
        settle("ck-t", &reduced),
        Settled::Answer(Reply::Answer {
            text: "merged".into(),
            is_error: false
        })
    );
    let held_again = entry(
        "result",
        json!({"result": {"content": [{"type": "text", "text": "x"}], "held": {"reason": "consent"}}}),
    );
    assert!(matches!(
        settle("ck-t", &held_again),
        Settled::Answer(Reply::Answer { is_error: true, .. })
    ));
    let never = entry("not_started", json!({"reason": "restart_before_dispatch"}));
    assert_eq!(
        settle("ck-t", &never),
        Settled::NotStarted("restart_before_dispatch".into())
    );
    assert_eq!(
        settle("ck-t", &entry("expired", json!({}))),
        Settled::Expired
    );
    let update = entry("held", json!({"held": {"reason": "running"}}));
    assert_eq!(
        settle("ck-t", &update),
        Settled::Note("held: running".into())
    );
    assert!(matches!(
        settle("ck-t", &entry("future_kind", json!({}))),
        Settled::Note(n) if n.contains("future_kind")
    ));
}

#[test]
fn reads_acks_and_a_refused_cursor() {
    let req: Value = serde_json::from_slice(&read_request(None)).unwrap();
    assert_eq!(
        req,
        json!({"name": "late_results", "arguments": {"since": null, "limit": 100}})
    );
    let cursor = LateCursor {
        provider_incarnation: "inc-1".into(),
        seq: 4,
    };
    let req: Value = serde_json::from_slice(&read_request(Some(&cursor))).unwrap();
    assert_eq!(
        req["arguments"]["since"],
        json!({"provider_incarnation": "inc-1", "seq": 4})
    );
    let ack: Value = serde_json::from_slice(&ack_request(&cursor)).unwrap();
    assert_eq!(
        ack,
        json!({"name": "late_results.ack", "arguments": {"through": {"provider_incarnation": "inc-1", "seq": 4}}})
    );
    let got = read_answer(
        "ck-t",
        &frame(
            FrameType::Response,
            &json!({"entries": [], "cursor": {"provider_incarnation": "inc-1", "seq": 0}, "more": false}),
        ),
    );
    assert!(matches!(got, Read::Entries(r) if r.entries.is_empty() && !r.more));
    let refused = frame(
        FrameType::Error,
        &json!({"code": "cursor_incarnation_changed", "message": "re-read"}),
    );
    assert!(matches!(read_answer("ck-t", &refused), Read::FromStart));
    let other = frame(
        FrameType::Error,
        &json!({"code": "forbidden", "message": "no"}),
    );
    assert!(matches!(read_answer("ck-t", &other), Read::Failed(w) if w.contains("forbidden")));
}
