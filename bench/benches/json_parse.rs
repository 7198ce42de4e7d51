//! simd-json against serde_json on broca's hot parse inputs (issue: the serve path at its cost
//! floor, part 2): a provider stream's events, a management request, WAL records on replay.
//! Each input is parsed whole by both (simd-json's serde API parses in place, so its input is
//! first copied into a reused buffer, as broca's shared buffers would need); beside them, what
//! broca does today where it differs (the Anthropic normalizer's fast path for delta events).
//! Run: `cargo bench -p broca-bench --bench json_parse`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use broca::provider::{family, Aliases, Normalized};
use criterion::{Criterion, Throughput};
use serde_json::Value;

const DELTA: &str = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" jumps over the lazy"}}"#;

const MESSAGE_START: &str = r#"{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048,"output_tokens":2}}}"#;

const SEND: &str = r#"{"method":"session.send","params":{"project_root":"/home/user/projects/broca","harness":"claude-code","session":"9f1c2e7a-4b1d-4c55-9a0e-3f2b8d7e6a51","prompt":"Run the tests in the io crate and fix the first failure you find; keep the change small.","model":"anthropic/claude-sonnet-4-5","send_id":"send-000123","max_steps":40,"tools":["read_file","write_file","run"]}}"#;

/// A step record's payload as the WAL holds it: an answer with text (no tool call: simd-json's
/// serde API cannot fill the raw JSON text broca keeps a call's arguments in).
fn step_record() -> String {
    use broca::protocol::{Block, FinishReason, Usage};
    let text =
        "I ran the tests. The first failure is in `log::tests::torn_tail`: the tail block is \
                rewritten before the header is checked. I will move the check first. "
            .repeat(3);
    let step = broca::wal::runrec::ModelStepFinished {
        run_id: "run_01JF3Q8Z6V3W4X5Y6Z7A8B9C0D".into(),
        step: 7,
        attempt: 1,
        content: vec![Block::Text { text }],
        usage: Usage {
            input: Some(18_422),
            output: Some(311),
            cache_read: Some(16_384),
            cache_write: Some(1_024),
            ..Default::default()
        },
        finish_reason: FinishReason::EndTurn,
        request_id: Some("req_011CQ9T7h2g5w3y4u6i8o0p2".into()),
        quota: None,
        at_unix_ms: Some(1_765_000_000_000),
        step_seq: Some(41),
    };
    serde_json::to_string(&step).unwrap()
}

fn serde(c: &mut Criterion, name: &str, input: &str) {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Bytes(input.len() as u64));
    g.bench_function("serde_json", |b| {
        b.iter(|| black_box(serde_json::from_str::<Value>(black_box(input)).unwrap()))
    });
    let mut buf = Vec::with_capacity(input.len());
    g.bench_function("simd_json (copy + parse)", |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(black_box(input).as_bytes());
            black_box(simd_json::serde::from_slice::<Value>(&mut buf).unwrap())
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let step = step_record();
    // The inputs parse alike with both.
    for input in [DELTA, MESSAGE_START, SEND, step.as_str()] {
        let mut buf = input.as_bytes().to_vec();
        let simd: Value = simd_json::serde::from_slice(&mut buf).unwrap();
        assert_eq!(simd, serde_json::from_str::<Value>(input).unwrap());
    }
    serde(&mut c, "provider text delta event", DELTA);
    {
        // What broca does with that event today: the normalizer's fast path.
        let mut n = family("anthropic-messages")
            .unwrap()
            .normalizer(Aliases::default());
        let mut g = c.benchmark_group("provider text delta event");
        g.throughput(Throughput::Bytes(DELTA.len() as u64));
        g.bench_function("broca normalizer (fast path)", |b| {
            b.iter(
                || match n.push(Some("content_block_delta"), black_box(DELTA)) {
                    Ok(Normalized::Events(e)) => black_box(e.len()),
                    other => panic!("{other:?}"),
                },
            )
        });
        g.finish();
    }
    serde(&mut c, "provider message_start event", MESSAGE_START);
    serde(&mut c, "management request (session.send)", SEND);
    serde(&mut c, "WAL step record", &step);
    {
        // Typed, as replay decodes it.
        type Step = broca::wal::runrec::ModelStepFinished;
        let mut g = c.benchmark_group("WAL step record, typed");
        g.throughput(Throughput::Bytes(step.len() as u64));
        g.bench_function("serde_json", |b| {
            b.iter(|| black_box(serde_json::from_str::<Step>(black_box(&step)).unwrap()))
        });
        let mut buf = Vec::with_capacity(step.len());
        g.bench_function("simd_json (copy + parse)", |b| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(black_box(step.as_bytes()));
                black_box(simd_json::serde::from_slice::<Step>(&mut buf).unwrap())
            })
        });
        g.finish();
    }
    c.final_summary();
}
