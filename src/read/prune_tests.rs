//! The archive's reasoning prune in the domain alone: a log rewritten with its reasoning
//! emptied in place, every other record's bytes kept, and reads that still serve the
//! originals' digests and list the emptied parts.

use broca_protocol::{Block, FinishReason};
use broca_wal::runrec::ModelStepFinished;
use broca_wal::{frame, Record, SessionTriple, WalHeader};
use cortexkit_role_llm_runner::content_digest::content_digest;
use cortexkit_role_llm_runner::read::ReadRequest;
use serde_json::json;

use crate::prune::prune_log;
use broca_core::replay::Session;
use broca_core::support_tests::finished;
use broca_core::support_tests::{started, step};

/// A log of `records` (seq 1 on), as a writer leaves it.
fn log(records: &[Record]) -> Vec<u8> {
    log_skipping(records, None)
}

/// [`log`], with the seq of the record at index `gap` one too high.
fn log_skipping(records: &[Record], gap: Option<usize>) -> Vec<u8> {
    let triple = SessionTriple::new("/p", "h", "s").unwrap();
    let header = WalHeader::new(triple, 1);
    let mut out = header.encode();
    out.resize(header.data_offset as usize, 0);
    for (i, r) in records.iter().enumerate() {
        let mut payload = Vec::new();
        r.encode_payload(&mut payload);
        let at = out.len();
        out.resize(at + frame::FRAME_HEADER_BYTES + payload.len(), 0);
        let tag = header.lineage_tag();
        let seq = i as u64 + 1 + u64::from(gap.is_some_and(|g| i >= g));
        frame::write_frame(&mut out[at..], seq, tag, 0, 1, r.kind(), &payload);
    }
    out
}

fn model_step(content: Vec<Block>) -> Record {
    Record::ModelStepFinished(Box::new(ModelStepFinished {
        run_id: "r".into(),
        step: 1,
        attempt: 1,
        content,
        usage: Default::default(),
        finish_reason: FinishReason::EndTurn,
        request_id: None,
        quota: None,
        at_unix_ms: Some(5),
        step_seq: Some(2),
    }))
}

fn thought() -> Block {
    Block::Thinking {
        text: "the door is blue".into(),
        signature: Some("c2lnbmVk".into()),
    }
}

fn answer() -> Block {
    Block::Text {
        text: "open it".into(),
    }
}

fn replayed(bytes: &[u8]) -> Session {
    let scan = broca_wal::scan(bytes).unwrap();
    Session::with_entries()
        .replay_scan_into(&scan, bytes)
        .unwrap()
}

fn page(s: &Session, media: &str, part_keys: bool) -> serde_json::Value {
    let req: ReadRequest =
        serde_json::from_value(json!({"from_ordinal": 1, "media": media})).unwrap();
    serde_json::to_value(crate::role::read_page(Some(s), 1, "l", &req, part_keys).unwrap()).unwrap()
}

#[test]
fn a_prune_empties_reasoning_in_place_and_reads_keep_the_originals_digests() {
    let records = [
        started(),
        step(1),
        model_step(vec![thought(), answer()]),
        finished("r", 6),
    ];
    let bytes = log(&records);
    let before = replayed(&bytes);
    let blocks_before = page(&before, "blocks", false);
    let original = blocks_before["messages"][1]["message"].clone();

    let pruned = prune_log(&bytes, 77).unwrap().expect("reasoning to prune");
    assert_eq!(pruned.parts, 1);
    assert_eq!(
        (pruned.state.generation, pruned.state.through_ordinal),
        (1, 2)
    );
    // The rewritten log scans whole: the same records, then the prune's.
    let scan = broca_wal::scan(&pruned.bytes).unwrap();
    assert_eq!(scan.end, pruned.bytes.len() as u64);
    assert_eq!(scan.frames.len(), records.len() + 1);
    let decoded = scan.decode(&pruned.bytes).unwrap().records;
    for ((seq, r), old) in decoded.iter().zip(&records) {
        if *seq == 3 {
            continue;
        }
        assert_eq!(r, old, "record {seq} keeps its content");
    }
    let Record::ModelStepFinished(step) = &decoded[2].1 else {
        panic!("{:?}", decoded[2]);
    };
    assert_eq!(
        step.content,
        vec![
            Block::Thinking {
                text: String::new(),
                signature: None
            },
            answer()
        ]
    );
    // The signed text is nowhere in the rewritten bytes.
    let text = String::from_utf8_lossy(&pruned.bytes);
    assert!(!text.contains("the door is blue") && !text.contains("c2lnbmVk"));

    let after = replayed(&pruned.bytes);
    let blocks = page(&after, "blocks", false);
    let m = &blocks["messages"][1];
    assert_eq!(
        m["message"]["content"][0],
        json!({"thinking": {"text": ""}})
    );
    assert_eq!(m["message"]["content"][1], original["content"][1]);
    // Write-time digests: the message's and each part's, over the original.
    assert_eq!(
        m["digest"],
        json!(content_digest(&original)),
        "a pruned message serves its write-time digest"
    );
    assert_eq!(
        m["part_digests"], blocks_before["messages"][1]["part_digests"],
        "a pruned message serves its write-time part digests"
    );
    let part = &original["content"][0];
    let row = json!({"mid": m["mid"], "part": "0", "kind": "reasoning",
        "bytes": serde_jcs::to_vec(part).unwrap().len(), "sha256": content_digest(part)});
    assert_eq!(blocks["pruned_reasoning"], json!([row]));
    assert_eq!(
        blocks["reasoning_pruned"],
        json!({"generation": 1, "through_ordinal": 2, "at_ms": 77})
    );
    // Inline reads name the parts' keys when the runner prunes, and list the same rows.
    let inline = page(&after, "inline", true);
    assert_eq!(inline["messages"][1]["part_keys"], json!(["0", "1"]));
    assert_eq!(inline["messages"][0]["part_keys"], json!(["0"]));
    assert_eq!(inline["pruned_reasoning"], json!([row]));
    assert!(page(&after, "inline", false)["messages"][1]
        .get("part_keys")
        .is_none());
    // A page serving no pruned part lists none.
    let req: ReadRequest = serde_json::from_value(json!({"from_ordinal": 1, "limit": 1})).unwrap();
    let first = crate::role::read_page(Some(&after), 1, "l", &req, true).unwrap();
    assert!(first.pruned_reasoning.is_empty());
    let head = serde_json::to_value(crate::role::head(Some(&after), 1, "l")).unwrap();
    assert_eq!(head["reasoning_pruned"]["generation"], 1);
    assert!(
        serde_json::to_value(crate::role::head(Some(&before), 1, "l"))
            .unwrap()
            .get("reasoning_pruned")
            .is_none()
    );
}

#[test]
fn a_log_with_nothing_left_to_prune_is_kept_and_a_damaged_one_is_refused() {
    let bytes = log(&[
        started(),
        step(1),
        model_step(vec![answer()]),
        finished("r", 6),
    ]);
    assert!(prune_log(&bytes, 1).unwrap().is_none());
    let once = prune_log(
        &log(&[
            started(),
            step(1),
            model_step(vec![thought()]),
            finished("r", 6),
        ]),
        1,
    )
    .unwrap()
    .unwrap();
    // Pruned already: a second prune finds nothing, and the generation stays.
    assert!(prune_log(&once.bytes, 2).unwrap().is_none());
    // A record out of sequence is corruption: nothing is rewritten.
    let records = [
        started(),
        step(1),
        model_step(vec![thought()]),
        finished("r", 6),
    ];
    let e = prune_log(&log_skipping(&records, Some(3)), 1).unwrap_err();
    assert!(matches!(e, crate::prune::PruneError::Damaged(_)), "{e}");
    assert!(e.to_string().contains("damaged"), "{e}");
}
