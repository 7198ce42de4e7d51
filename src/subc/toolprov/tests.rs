//! The tool-provider/v1 bodies against hand-made frames, golden bytes and the role's vectors.

use super::*;
use subc_protocol::{Flags, Priority};

fn frame(ty: FrameType, flags: Flags, body: &Value) -> FrameIn {
    crate::frames::test_frame(ty, flags, body)
}

fn plain() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

#[test]
fn a_catalog_becomes_pinned_routes() {
    let answer = json!({
        "generation": "g1", "catalog_digest": "d",
        "tools": [
            {"name": "echo", "schema_digest": "x", "semantics": 2, "capabilities": [],
             "description": "says it back",
             "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}},
            {"name": "deep", "schema_digest": "x", "semantics": 1, "capabilities": [],
             "input_schema": {"anyOf": [{"type": "object"}, {"type": "string"}]}}
        ]
    });
    let Catalog { specs, notes, .. } =
        read_catalog("ck-echo", &frame(FrameType::Response, plain(), &answer)).unwrap();
    assert_eq!(specs.len(), 1, "{notes:?}");
    assert_eq!(specs[0].name, "echo");
    let (module, pin) = parse_route(&specs[0].route).unwrap();
    assert_eq!(module, "ck-echo");
    let pin = SchemaPin::parse(pin).unwrap();
    assert_eq!(pin.semantics, 2);
    assert_eq!(
        pin.schema_digest,
        schema_digest(&specs[0].input_schema).unwrap(),
        "the pin names the schema broca froze"
    );
    assert!(notes.iter().any(|n| n.contains("`deep`")), "{notes:?}");
}

/// The role's reply-deadline vectors: `vectors` of one kind.
fn reply_vectors(kind: &str) -> (Value, Vec<Value>) {
    let all: Value =
        serde_json::from_str(cortexkit_role_tool_provider::vectors::REPLY_DEADLINE_JSON).unwrap();
    let cases = all[kind].as_array().unwrap().clone();
    assert!(!cases.is_empty(), "{kind}");
    (all, cases)
}

#[test]
fn reply_deadlines_follow_the_roles_vectors() {
    let (all, cases) = reply_vectors("deadlines");
    for case in cases {
        // A case may run under a fallback of its own.
        let fallback_ms = case
            .get("runner_fallback_ms")
            .unwrap_or(&all["runner_fallback_ms"])
            .as_u64()
            .unwrap();
        let fallback = std::time::Duration::from_millis(fallback_ms);
        let reply = Some(&case["reply"]).filter(|r| !r.is_null());
        let got = reply_deadline(reply, &case["arguments"], fallback);
        assert_eq!(
            got.as_millis() as u64,
            case["expected_ms"].as_u64().unwrap(),
            "{}",
            case["name"]
        );
    }
}

/// A catalog of one tool `t` declaring `reply` (with the vectors' schema, or the case's).
fn catalog_with_reply(all: &Value, case: &Value) -> Result<Catalog, LinkError> {
    let schema = case
        .get("input_schema")
        .cloned()
        .unwrap_or_else(|| all["input_schema"].clone());
    let mut tool = json!({"name": "t", "schema_digest": "x", "semantics": 1,
        "capabilities": [], "input_schema": schema});
    if !case["reply"].is_null() {
        tool["reply"] = case["reply"].clone();
    }
    let answer = json!({"generation": "g1", "catalog_digest": "d", "tools": [tool]});
    read_catalog("ck-t", &frame(FrameType::Response, plain(), &answer))
}

#[test]
fn a_catalog_declaring_a_reply_freezes_it_and_a_bad_one_is_an_invalid_answer() {
    let (all, valid) = reply_vectors("valid");
    for case in valid {
        let catalog =
            catalog_with_reply(&all, &case).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        let want = Some(case["reply"].clone()).filter(|r| !r.is_null());
        assert_eq!(catalog.specs[0].reply, want, "{}", case["name"]);
    }
    let (_, invalid) = reply_vectors("invalid");
    for case in invalid {
        let e = catalog_with_reply(&all, &case)
            .err()
            .unwrap_or_else(|| panic!("{} was taken", case["name"]))
            .to_string();
        let member = case["member"].as_str().unwrap();
        assert!(
            e.contains("invalid_answer") && e.contains("`t`") && e.contains(member),
            "{}: {e}",
            case["name"]
        );
    }
    let (_, malformed) = reply_vectors("malformed");
    for case in malformed {
        assert!(
            catalog_with_reply(&all, &case).is_err(),
            "{} was taken",
            case["name"]
        );
    }
}

#[test]
fn keepalives_are_taken_only_from_a_module_whose_manifest_provides_them() {
    let listed = |provides: Value| {
        json!({"op": "catalog.list", "generation": 3, "subc_ops": [],
            "modules": [{"module_id": "ck-t", "roles": [], "control_ops": [],
                "capabilities": {"provides": provides}}]})
    };
    let keepalive = cortexkit_role_tool_provider::CALL_KEEPALIVE_CAPABILITY;
    let yes = frame(FrameType::Response, plain(), &listed(json!([keepalive])));
    assert!(provides_keepalive("ck-t", &yes));
    assert!(
        !provides_keepalive("ck-other", &yes),
        "another module's manifest"
    );
    let no = frame(
        FrameType::Response,
        plain(),
        &listed(json!(["tool-result/v1"])),
    );
    assert!(!provides_keepalive("ck-t", &no));
    let refused = frame(FrameType::Error, plain(), &json!({"code": "forbidden"}));
    assert!(!provides_keepalive("ck-t", &refused));
    // broca declares it on every route it opens, beside tool-result/v1 and held-reply/v1.
    let open: Value = serde_json::from_slice(&route_open("ck-t", "h", "s", None, None)).unwrap();
    assert_eq!(
        open["consumer_capabilities"],
        json!([
            cortexkit_role_tool_provider::TOOL_RESULT_V1_CAPABILITY,
            cortexkit_role_tool_provider::HELD_REPLY_V1,
            keepalive
        ]),
        "{open}"
    );
    // A keepalive pair waits up to the role's ceiling for a tool without `reply`.
    let fallback = std::time::Duration::from_secs(300);
    assert_eq!(
        reply_deadline_with_keepalive(None, &json!({}), fallback, true).as_millis(),
        86_400_000
    );
    assert_eq!(reply_deadline(None, &json!({}), fallback), fallback);
}

#[test]
fn a_tool_result_v1_body_is_read_in_parts_only_where_the_tool_opts_in() {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII=";
    let body = json!({"content": [{"type": "text", "text": "before"},
        {"type": "image", "mimeType": "image/png", "data": png, "width": 1, "height": 1},
        {"type": "text", "text": "after"}]});
    let f = frame(FrameType::Response, plain(), &body);
    let Reply::Parts { parts, is_error } = read_reply("m", &f, true) else {
        panic!("parts")
    };
    assert!(!is_error);
    assert_eq!(parts.len(), 3);
    assert!(
        matches!(&parts[1], Part::Image { mime, data } if mime == "image/png" && data.starts_with(b"\x89PNG"))
    );
    // Without the opt-in the same body is the legacy body: its JSON text.
    assert!(matches!(
        read_reply("m", &f, false),
        Reply::Answer {
            is_error: false,
            ..
        }
    ));
    // A body that does not hold is an error result naming why.
    let bad = json!({"content": [{"type": "image", "mimeType": "image/png", "data": "data:x", "width": 1, "height": 1}]});
    let Reply::Answer { text, is_error } =
        read_reply("m", &frame(FrameType::Response, plain(), &bad), true)
    else {
        panic!("an error answer")
    };
    assert!(is_error && text.contains("does not hold"), "{text}");
    let big = json!({"content": [{"type": "text", "text": "x".repeat(70_000)}]});
    assert_eq!(
        read_reply("m", &frame(FrameType::Response, plain(), &big), true),
        Reply::TooLarge { bytes: 70_000 }
    );
}

#[test]
fn replies_are_classified_by_who_ended_the_call() {
    let r = read_reply(
        "m",
        &frame(FrameType::Response, plain(), &json!("hi")),
        false,
    );
    assert_eq!(
        r,
        Reply::Answer {
            text: "hi".into(),
            is_error: false
        }
    );
    let r = read_reply(
        "m",
        &frame(FrameType::Response, plain(), &json!({"n": 1})),
        false,
    );
    assert_eq!(
        r,
        Reply::Answer {
            text: "{\"n\":1}".into(),
            is_error: false
        }
    );
    let refused = json!({"code": "tool_schema_changed", "message": "schema moved"});
    match read_reply("m", &frame(FrameType::Error, plain(), &refused), false) {
        Reply::Answer {
            text,
            is_error: true,
        } => assert!(text.contains("tool_schema_changed")),
        other => panic!("{other:?}"),
    }
    let dead = json!({"code": "stale_route_epoch", "message": ""});
    assert_eq!(
        read_reply("m", &frame(FrameType::Error, plain(), &dead), false),
        Reply::NotDelivered("stale_route_epoch".into())
    );
    let reloading = json!({"code": "module_reloading", "message": ""});
    assert!(matches!(
        read_reply("m", &frame(FrameType::Error, plain(), &reloading), false),
        Reply::NotDelivered(_)
    ));
    // The daemon's own error after delivery: the outcome is unknown.
    let odd = json!({"code": "something_new", "message": "x"});
    assert!(matches!(
        read_reply(
            "m",
            &frame(FrameType::Error, plain().with_daemon_origin(), &odd),
            false
        ),
        Reply::Indeterminate(_)
    ));
    let timeout = json!({"code": "module_timeout", "message": "x"});
    assert!(matches!(
        read_reply("m", &frame(FrameType::Error, plain(), &timeout), false),
        Reply::Indeterminate(_)
    ));
}

#[test]
fn opens_are_retried_only_when_the_daemon_says_so() {
    let ok = json!({"op": "route.open", "route_channel": 5, "route_epoch": 2});
    assert_eq!(
        read_open(&frame(FrameType::Response, plain(), &ok)),
        Opened::Route {
            channel: 5,
            epoch: 2
        }
    );
    for code in ["module_reloading", "module_warming", "target_unavailable"] {
        let e = json!({"code": code, "message": ""});
        assert_eq!(
            read_open(&frame(FrameType::Error, plain(), &e)),
            Opened::Retry(code.into())
        );
    }
    let e = json!({"code": "unknown_module", "message": "no such module"});
    assert!(
        matches!(read_open(&frame(FrameType::Error, plain(), &e)), Opened::Refused(m) if m.contains("unknown_module"))
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The frames broca writes to open a tool route and call on it, and a provider's answer
/// as it reads it, pinned byte for byte (src/subc/golden/tool_route.json).
#[test]
fn golden_frames_of_a_route_open_a_call_and_its_answer() {
    use crate::frames::{self, Decoder};
    let golden: Value = serde_json::from_str(include_str!("../golden/tool_route.json")).unwrap();
    let open = route_open("ck-tools", "h", "s", Some(("ck-broca", "nonce-1")), None);
    let frame =
        frames::encode(FrameType::Request, frames::control(), 0, 0, 1, open.clone()).unwrap();
    assert_eq!(
        hex(&frame[..21]),
        golden["open"]["header"].as_str().unwrap()
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&open).unwrap(),
        golden["open"]["body"]
    );
    let call = call_body(
        "echo",
        json!({"message": "hi"}),
        "toolu_1",
        "broca:0123".into(),
        "tp1:echo:ab:1",
    );
    let frame = frames::encode(FrameType::Request, frames::data(), 11, 1, 2, call.clone()).unwrap();
    assert_eq!(
        hex(&frame[..21]),
        golden["call"]["header"].as_str().unwrap()
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&call).unwrap(),
        golden["call"]["body"]
    );
    // The provider's RESPONSE, as bytes on the wire.
    let bytes: Vec<u8> = (0..golden["answer"]["frame"].as_str().unwrap().len() / 2)
        .map(|i| {
            u8::from_str_radix(
                &golden["answer"]["frame"].as_str().unwrap()[2 * i..2 * i + 2],
                16,
            )
            .unwrap()
        })
        .collect();
    let mut d = Decoder::new();
    d.push(&bytes);
    let f = d.next_frame().unwrap().unwrap();
    assert_eq!(
        (f.header.ty, f.header.channel, f.header.epoch, f.header.corr),
        (FrameType::Response, 11, 1, 2)
    );
    assert_eq!(
        read_reply("ck-tools", &f, false),
        Reply::Answer {
            text: "echo: hi".into(),
            is_error: false
        }
    );
}

#[test]
fn a_call_body_carries_its_recorded_key_id_and_pin() {
    let a = "broca:0123456789abcdef0123456789abcdef".to_string();
    let body: Value = serde_json::from_slice(&call_body(
        "echo",
        json!({"text": "x"}),
        "toolu_1",
        a.clone(),
        "tp1:echo:00:1",
    ))
    .unwrap();
    assert_eq!(body["call_key"], a.as_str());
    assert_eq!(body["tool_call_id"], "toolu_1");
    assert_eq!(body["schema_pin"], "tp1:echo:00:1");
}

#[test]
fn a_plan_items_catalog_request_carries_its_members_and_its_answer_keeps_a_refusals_code() {
    use cortexkit_role_tool_provider::catalog::{CatalogRequest, SystemTextItem};
    let request = CatalogRequest::new(serde_json::Map::from_iter([(
        "scope".into(),
        json!("repo"),
    )]))
    .with_preset("head")
    .with_composition(serde_json::Map::from_iter([(
        "join_version".into(),
        json!(1),
    )]))
    .with_system_text(SystemTextItem::new(serde_json::Map::new()));
    let body: Value = serde_json::from_slice(&plan_catalog_request(&request)).unwrap();
    assert_eq!(
        body,
        json!({"name": "tool.catalog", "arguments": {"params": {"scope": "repo"},
            "preset": "head", "composition": {"join_version": 1},
            "system_text": {"params": {}}}})
    );
    // An answer: its tools routed to the module, the answer kept whole for the plan's checks.
    let schema = json!({"type": "object", "properties": {"p": {"type": "string"}}});
    let answer = json!({"generation": "g", "catalog_digest": "c", "composition_digest": "d",
        "tools": [{"name": "t", "schema_digest":
            cortexkit_role_tool_provider::catalog::schema_digest(&schema).unwrap(),
            "semantics": 1, "capabilities": [], "input_schema": schema}]});
    let (kept, catalog) =
        read_plan_catalog("ck-t", &frame(FrameType::Response, plain(), &answer)).unwrap();
    assert_eq!(kept.composition_digest.as_deref(), Some("d"));
    assert_eq!(catalog.specs.len(), 1);
    assert!(catalog.specs[0].route.starts_with("subc:ck-t@tp1:t:"));
    // A refusal keeps the module's code; an answer that does not decode is unavailable.
    let refused = frame(
        FrameType::Error,
        plain(),
        &json!({"code": "invalid_request", "message": "no such preset"}),
    );
    assert_eq!(
        read_plan_catalog("ck-t", &refused).unwrap_err(),
        PlanMiss::Refused {
            code: "invalid_request".into(),
            message: "no such preset".into()
        }
    );
    let garbled = frame(FrameType::Response, plain(), &json!({"tools": 7}));
    assert!(matches!(
        read_plan_catalog("ck-t", &garbled).unwrap_err(),
        PlanMiss::Unavailable(why) if why.contains("does not decode")
    ));
    // Answers the role calls invalid: a text without the tool names it was composed for, a
    // malformed or repeated command name.
    let mut textless_names = answer.clone();
    textless_names["system_text"] = json!({"text": "t", "item_digest": "i",
        "preflight_digest": "p"});
    let mut bad_command = answer.clone();
    bad_command["user_commands"] = json!([{"name": "Bad_Name", "description": "d"}]);
    let mut twice = answer.clone();
    twice["user_commands"] = json!([{"name": "go", "description": "d"},
        {"name": "go", "description": "e"}]);
    for (invalid, why) in [
        (textless_names, "tool_names"),
        (bad_command, "user_commands"),
        (twice, "duplicate"),
    ] {
        let got = read_plan_catalog("ck-t", &frame(FrameType::Response, plain(), &invalid));
        assert!(
            matches!(&got, Err(PlanMiss::Unavailable(w)) if w.starts_with("invalid_answer") && w.contains(why)),
            "{got:?}"
        );
    }
    let mut with_commands = answer.clone();
    with_commands["user_commands"] = json!([{"name": "ctx-status", "description": "d"}]);
    let (kept, _) =
        read_plan_catalog("ck-t", &frame(FrameType::Response, plain(), &with_commands)).unwrap();
    assert_eq!(kept.user_commands[0].name, "ctx-status");
}
