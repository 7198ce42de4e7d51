//! OTLP's `ExportTraceServiceRequest` in protobuf's wire format, for the few messages traces
//! need (opentelemetry-proto's `collector/trace/v1`, `trace/v1`, `common/v1`,
//! `resource/v1`): written by hand, as protobuf's encoding is a handful of rules.

use super::spans::{Span, Value};

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u32) {
    varint(out, u64::from(field << 3 | wire));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn message(out: &mut Vec<u8>, field: u32, build: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    build(&mut inner);
    bytes(out, field, &inner);
}

fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, VARINT);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

/// An `AnyValue`'s body.
fn any_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Str(s) => bytes(out, 1, s.as_bytes()),
        Value::Bool(b) => uint(out, 2, u64::from(*b)),
        Value::Int(i) => uint(out, 3, *i as u64),
        Value::Strs(list) => message(out, 5, |arr| {
            for s in list {
                message(arr, 1, |any| bytes(any, 1, s.as_bytes()));
            }
        }),
    }
}

/// A `KeyValue` as field `field`.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, v: &Value) {
    message(out, field, |kv| {
        bytes(kv, 1, key.as_bytes());
        message(kv, 2, |any| any_value(any, v));
    });
}

fn span(out: &mut Vec<u8>, s: &Span) {
    bytes(out, 1, &s.trace_id);
    bytes(out, 2, &s.span_id);
    if let Some(parent) = &s.parent {
        bytes(out, 4, parent);
    }
    bytes(out, 5, s.name.as_bytes());
    uint(out, 6, s.kind as u64);
    fixed64(out, 7, s.start_ns);
    fixed64(out, 8, s.end_ns);
    for (k, v) in &s.attrs {
        key_value(out, 9, k, v);
    }
    // Status: ERROR (2) with its message, else UNSET (left out).
    if let Some(why) = &s.error {
        message(out, 15, |st| {
            bytes(st, 2, why.as_bytes());
            uint(st, 3, 2);
        });
    }
}

/// One export request: `resource` attributes, the instrumentation scope, the spans.
pub fn export_request(
    resource: &[(String, Value)],
    scope_version: &str,
    spans: &[Span],
) -> Vec<u8> {
    let mut out = Vec::new();
    message(&mut out, 1, |rs| {
        message(rs, 1, |res| {
            for (k, v) in resource {
                key_value(res, 1, k, v);
            }
        });
        message(rs, 2, |ss| {
            message(ss, 1, |scope| {
                bytes(scope, 1, b"broca");
                bytes(scope, 2, scope_version.as_bytes());
            });
            for s in spans {
                message(ss, 2, |out| span(out, s));
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_tags_follow_protobufs_rules() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        uint(&mut out, 6, 3);
        assert_eq!(out, [0x30, 0x03]);
        let mut out = Vec::new();
        fixed64(&mut out, 7, 1);
        assert_eq!(out, [0x39, 1, 0, 0, 0, 0, 0, 0, 0]);
        // A negative int64 is ten bytes (two's complement as a varint).
        let mut out = Vec::new();
        any_value(&mut out, &Value::Int(-1));
        assert_eq!(out.len(), 11);
    }
}
