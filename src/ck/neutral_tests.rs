//! The transcript in the compaction contract's neutral part model, from records a real run
//! machine appended, and `session.entries` answered from it.

use broca_protocol::StreamEvent;
use cortexkit_role_compaction::part::{PartBody, Seal, ToolStatus};
use cortexkit_role_compaction::read::{Entry, Role};
use serde_json::{json, Value};

use super::{read, transcript};
use broca_core::machine::Event;
use broca_core::support_tests::config;
use broca_core::support_tests::Live;

/// A run: the send, a step calling `example-tool` (call `call-tool`), its result `content`
/// when given, and a closing answer once it is.
fn run(content: Option<&str>) -> Live {
    let mut config = config();
    let mut tools = config.tools.to_vec();
    tools[0].name = "example-tool".into();
    config.tools = tools.into();
    let mut live = Live::start(config, "read the file");
    live.call_step(None, "call-tool", "example-tool", "{}");
    if let Some(content) = content {
        live.answered("call-tool", content);
        live.text_step("It says hello.");
    }
    live
}

fn neutral(live: &Live) -> Vec<Entry> {
    transcript(live.session.entries.as_ref().unwrap(), 0)
}

#[test]
fn a_call_and_its_result_are_one_tool_part_and_parts_are_numbered_in_order() {
    let list = neutral(&run(Some("hello")));
    let roles: Vec<_> = list.iter().map(|e| (e.ordinal, e.role.clone())).collect();
    // The send, the tool step, the result's own entry (no parts), the answer.
    assert_eq!(
        roles,
        [
            (1, Role::User),
            (2, Role::Assistant),
            (3, Role::User),
            (4, Role::Assistant)
        ]
    );
    let read_mids: Vec<_> = run(Some("hello"))
        .session
        .entries
        .unwrap()
        .list
        .iter()
        .map(|e| e.mid.clone())
        .collect();
    let mids: Vec<_> = list.iter().map(|e| e.mid.clone()).collect();
    assert_eq!(mids, read_mids, "the same mids as the role's reads");
    assert!(
        list[2].parts.is_empty(),
        "a result's own entry has no parts"
    );

    let PartBody::Tool(tool) = &list[1].parts[0].body else {
        panic!("the call is a tool part: {:?}", list[1].parts)
    };
    assert_eq!(
        (
            tool.status.clone(),
            tool.output.as_deref(),
            tool.output_bytes
        ),
        (ToolStatus::Completed, Some("hello"), Some(5))
    );
    let tags: Vec<Vec<Option<u64>>> = list
        .iter()
        .map(|e| e.parts.iter().map(|p| p.tag).collect())
        .collect();
    assert_eq!(tags, [vec![Some(1)], vec![Some(2)], vec![], vec![Some(3)]]);
    // From a checkpoint, numbers go on from it.
    let from_40 = transcript(run(Some("hello")).session.entries.as_ref().unwrap(), 40);
    assert_eq!(from_40[3].parts[0].tag, Some(43));
}

#[test]
fn a_call_without_its_result_is_running_and_its_checksum_is_the_contracts() {
    let list = neutral(&run(None));
    let part = &list[1].parts[0];
    let PartBody::Tool(tool) = &part.body else {
        panic!("a tool part")
    };
    assert_eq!(tool.status, ToolStatus::Running);
    assert_eq!(tool.output, None);
    // cortexkit-role-compaction 0.2.1, test-vectors/compaction-v2/checksum-empty-attachments.json:
    // the running call `call-tool` of `example-tool` with input `{}`.
    assert_eq!(
        part.digest,
        "85cfcae9d5cf4db7e37a41402dcf81c9b06eceeb8dc030952fe38996bd48e034"
    );
    // The result changes the entry (W4.9), so its checksum, never the call's identity.
    let done = neutral(&run(Some("hello")));
    assert_ne!(done[1].digest, list[1].digest);
    assert_eq!(done[1].mid, list[1].mid);
    assert_eq!(
        done[0].digest, list[0].digest,
        "the send's entry is unchanged"
    );
}

#[test]
fn signed_reasoning_is_sealed_and_compact_reads_keep_full_checksums() {
    let mut live = Live::start(config(), "think");
    live.feed(Event::Stream(StreamEvent::ThinkingDelta(
        "mull it over".into(),
    )));
    live.feed(Event::Stream(StreamEvent::ThinkingSignature("sig".into())));
    live.text_step("done");
    let list = neutral(&live);
    let parts = &list[1].parts;
    assert_eq!(parts[0].seal, Seal::Signed);
    assert_eq!(parts[0].tag, None, "reasoning takes no number");
    assert_eq!(parts[1].tag, Some(2));

    let full = read(
        &list,
        json!({"select": {"by": "after"}, "detail": "full"}),
        None,
    )
    .unwrap();
    let compact = read(
        &list,
        json!({"select": {"by": "after"}, "detail": "compact"}),
        None,
    )
    .unwrap();
    let full_part = serde_json::to_value(&full.entries[1].parts[0]).unwrap();
    let compact_part = serde_json::to_value(&compact.entries[1].parts[0]).unwrap();
    assert_eq!(full_part["text"], "mull it over");
    assert_eq!(compact_part.get("text"), None);
    assert_eq!(compact_part["text_bytes"], 12);
    assert_eq!(compact_part["digest"], full_part["digest"]);
    assert_eq!(compact.entries[1].digest, full.entries[1].digest);
}

fn page(list: &[Entry], params: Value) -> Value {
    serde_json::to_value(read(list, params, None).unwrap()).unwrap()
}

fn ordinals(page: &Value) -> Vec<u64> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ordinal"].as_u64().unwrap())
        .collect()
}

#[test]
fn entries_are_read_after_an_ordinal_by_mid_or_by_tag_and_paged() {
    let list = neutral(&run(Some("hello")));
    let newest = json!({"ordinal": 4, "mid": list[3].mid, "digest": list[3].digest});

    // The contract's own request (test-vectors/compaction-v2/entries-request.json).
    let all = page(
        &list,
        json!({"detail": "compact", "max_bytes": 65536, "select": {"by": "after", "limit": 10}}),
    );
    assert_eq!(ordinals(&all), [1, 2, 3, 4]);
    assert_eq!(all.get("next_after"), None);
    assert_eq!(all["head"]["newest"], newest);

    let first = page(
        &list,
        json!({"detail": "full", "select": {"by": "after", "limit": 2}}),
    );
    assert_eq!(
        (ordinals(&first), first["next_after"].clone()),
        (vec![1, 2], json!(2))
    );
    let rest = page(
        &list,
        json!({"detail": "full", "select": {"by": "after", "after_ordinal": 2}}),
    );
    assert_eq!(ordinals(&rest), [3, 4]);

    // A byte budget cuts the page, but never below one entry.
    let one = page(
        &list,
        json!({"detail": "full", "max_bytes": 1, "select": {"by": "after"}}),
    );
    assert_eq!(
        (ordinals(&one), one["next_after"].clone()),
        (vec![1], json!(1))
    );

    let by_mid = page(
        &list,
        json!({"detail": "full", "select": {"by": "mids", "mids": [list[3].mid, "gone", list[0].mid]}}),
    );
    assert_eq!(
        ordinals(&by_mid),
        [1, 4],
        "transcript order, unknown ids left out"
    );
    let by_tag = page(
        &list,
        json!({"detail": "full", "select": {"by": "tags", "tags": [2, 9]}}),
    );
    assert_eq!(ordinals(&by_tag), [2]);
}

#[test]
fn a_request_that_does_not_decode_is_refused_naming_its_field() {
    let list = neutral(&run(Some("hello")));
    for (params, field) in [
        (
            json!({"select": {"by": "after", "limit": 0}, "detail": "full"}),
            "select.limit",
        ),
        (
            json!({"select": {"by": "after"}, "detail": "some"}),
            "detail",
        ),
        (
            json!({"select": {"by": "sideways"}, "detail": "full"}),
            "select",
        ),
        (json!({"detail": "full"}), ""),
    ] {
        let refusal = read(&list, params.clone(), None).unwrap_err();
        assert_eq!(refusal.code, "invalid_params", "{params}");
        assert_eq!(
            refusal.detail.as_ref().unwrap()["field"],
            field,
            "{params}: {}",
            refusal.message
        );
    }
}

#[test]
fn the_kept_numbering_brought_up_to_date_is_the_whole_transcripts_numbering() {
    // Refreshed after every record of three runs with tool steps, it always equals the
    // transcript numbered from scratch.
    let mut live = run(Some("hello"));
    let mut kept = super::Numbered::default();
    let same = |live: &Live, kept: &mut super::Numbered| {
        let entries = live.session.entries.as_ref().unwrap();
        assert_eq!(kept.refresh(entries), transcript(entries, 0).as_slice());
    };
    same(&live, &mut kept);
    for turn in ["two", "three"] {
        let config = {
            let mut c = config();
            let mut tools = c.tools.to_vec();
            tools[0].name = "example-tool".into();
            c.tools = tools.into();
            c
        };
        live.next_run(turn, turn, config);
        same(&live, &mut kept);
        live.call_step(None, &format!("call-{turn}"), "example-tool", "{}");
        // The call is running: its part changes once the result comes.
        same(&live, &mut kept);
        live.answered(&format!("call-{turn}"), &format!("result of {turn}"));
        same(&live, &mut kept);
        live.text_step("done");
        same(&live, &mut kept);
    }
}
