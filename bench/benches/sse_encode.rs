//! A subscriber's batch of items as server-sent events, the bytes of one write: each item
//! encoded into the batch's one buffer (broca::wire::lanes::sse_into, what serve does), against
//! what serve did before: each unit's text copied out of its item, built into a string of its
//! own, and that copied onto the batch. A step's batch: five control units of 1 KiB each (a
//! tool call, its result, the model's answer, as a step's units come together).
//! Run: `cargo bench -p broca-bench --bench sse_encode`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use broca::wire::lanes::{sse_into, Cursor, SubItem};
use criterion::Criterion;

fn batch() -> Vec<SubItem> {
    (0..5)
        .map(|i| SubItem::Control {
            cursor: Cursor {
                seq: 40 + i,
                sub: 0,
            },
            unit: format!(
                "{{\"kind\":\"tool_result\",\"seq\":{i},\"text\":\"{}\"}}",
                "x".repeat(1000)
            ),
            event: None,
        })
        .collect()
}

/// What serve did before, for a control unit: the unit's text cloned, an event string built
/// from it, and its bytes appended to the batch (the first item's bytes were the buffer).
fn before(items: &[SubItem], out: &mut Vec<u8>) {
    for item in items {
        let SubItem::Control { cursor, unit, .. } = item else {
            unreachable!("the batch is control units")
        };
        let (id, data) = (cursor.to_string(), unit.clone());
        let mut s = String::with_capacity(data.len() + 32);
        s.push_str("id: ");
        s.push_str(&id);
        s.push('\n');
        s.push_str("data: ");
        s.push_str(&data);
        s.push_str("\n\n");
        // The first item's bytes became the batch's buffer; the rest were appended.
        if out.is_empty() {
            *out = s.into_bytes();
        } else {
            out.extend_from_slice(&s.into_bytes());
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let items = batch();
    let (mut old, mut new) = (Vec::new(), Vec::new());
    before(&items, &mut old);
    items.iter().for_each(|i| sse_into(i, &mut new));
    assert_eq!(old, new, "both write the same bytes");
    let mut g = c.benchmark_group("a step's five 1 KiB units as SSE, one write's bytes");
    g.bench_function("a string per unit, then appended (before)", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            before(black_box(&items), &mut out);
            out
        })
    });
    g.bench_function("into one buffer (broca)", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            black_box(&items).iter().for_each(|i| sse_into(i, &mut out));
            out
        })
    });
    g.finish();
}
