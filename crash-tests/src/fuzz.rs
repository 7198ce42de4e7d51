//! Entry points shared by the cargo-fuzz targets (`fuzz/`) and the bounded property run in CI
//! (`tests/fuzz_props.rs`): each takes arbitrary bytes and must return without panicking,
//! without allocating without bound and without hanging.

use broca_io::eventstream::EventStreamDecoder;
use broca_io::http1::{Limits, ResponseDecoder};
use broca_io::sse::SseDecoder;

/// The WAL reader: header, frames, the recovery case table, and the decode of every record.
pub fn wal_reader(data: &[u8]) {
    if let Ok(scan) = broca::wal::scan(data) {
        let _ = scan.decode(data);
        let _ = broca::core::Session::replay_scan(&scan, data);
    }
}

/// The SSE decoder, fed in two chunks split where the first byte says.
pub fn sse(data: &[u8]) {
    let split = split_at(data);
    let mut d = SseDecoder::new(64 * 1024);
    let mut events = 0usize;
    for part in [&data[..split], &data[split..]] {
        if d.push(part, &mut |_ev| events += 1).is_err() {
            return;
        }
    }
}

/// The HTTP/1.1 response decoder, fed in two chunks.
pub fn http_response(data: &[u8]) {
    let split = split_at(data);
    let limits = Limits {
        head_bytes_max: 16 * 1024,
        headers_max: 64,
        body_bytes_max: 1024 * 1024,
    };
    let mut d = ResponseDecoder::new(limits, data.first().is_some_and(|b| b & 1 == 1));
    let mut parts = Vec::new();
    for part in [&data[..split], &data[split..]] {
        if d.push(part, &mut parts).is_err() {
            return;
        }
        parts.clear();
    }
}

/// The management request parsing (envelope, method, triple, send parameters, admission).
pub fn management_json(data: &[u8]) {
    let _ = broca::host::check_request(data);
}

/// The AWS event-stream decoder (both CRCs), fed in two chunks.
pub fn event_stream(data: &[u8]) {
    let split = split_at(data);
    let mut d = EventStreamDecoder::new(1024 * 1024);
    for part in [&data[..split], &data[split..]] {
        if d.push(part, &mut |_m| {}).is_err() {
            return;
        }
    }
}

fn split_at(data: &[u8]) -> usize {
    match data.first() {
        Some(b) => (*b as usize * data.len()) / 256,
        None => 0,
    }
}

/// The import readers (Claude Code and Codex): a log read whole, then as a longer version of
/// its first part (the split where the first byte says), with calls left open before it.
pub fn import_log(data: &[u8]) {
    use broca::import::{identify, plan, Format, Plan, Prior};
    let split = split_at(data);
    for format in [Format::ClaudeCode, Format::Codex] {
        let Ok(id) = identify(format, "fuzz.jsonl", data) else {
            continue;
        };
        let open = ["c1".to_string()];
        let first = plan(format, "f", &data[..split], &id, None, &open, &mut |_| {});
        if let Ok(Plan::Episode(e)) = first {
            let prior = Prior {
                import_id: "imp_1".into(),
                bytes: e.origin.bytes,
                blake3: e.origin.blake3.clone(),
                last_line: e.origin.last_line,
                diverged: false,
            };
            let _ = plan(
                format,
                "f",
                data,
                &id,
                Some(&prior),
                &e.pending,
                &mut |_| {},
            );
        }
    }
}

/// The daemon connection's frames (broca-subc's decoder, fed in two chunks) and the
/// channel-0 bodies broca reads (subc-protocol's types); on a route, the answers a tool
/// module or the catalog module may send (route.open, role.describe, tool.catalog, a call's
/// terminal frame, catalog.get).
pub fn subc_frames(data: &[u8]) {
    use broca::subc::protocol::session::{ModuleControlCommand, ModuleControlRequest};
    use broca::subc::toolprov;
    let split = split_at(data);
    let mut d = broca::subc::frames::Decoder::new();
    for part in [&data[..split], &data[split..]] {
        d.push(part);
        loop {
            match d.next_frame() {
                Ok(Some(f)) if f.header.channel == 0 => {
                    let _ = serde_json::from_slice::<ModuleControlRequest>(&f.body);
                    let _ = serde_json::from_slice::<ModuleControlCommand>(&f.body);
                    let _ = toolprov::read_open(&f);
                }
                Ok(Some(f)) => {
                    let _ = toolprov::read_describe(&f);
                    let _ = toolprov::read_catalog("m", &f);
                    let _ = toolprov::read_reply("m", &f, false);
                    let _ = toolprov::read_reply("m", &f, true);
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&f.body) {
                        let _ = broca::catalog::fusiform::read(&v);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
}
