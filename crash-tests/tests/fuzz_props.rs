//! The fuzz targets' entry points (`crash-tests/src/fuzz.rs`) run on seeded inputs: random
//! bytes, and valid inputs mutated (bits flipped, bytes inserted, removed, repeated, cut,
//! spliced). No input may panic, allocate past a bound, or take long. Bounded for CI:
//! `BROCA_FUZZ_CASES` inputs per target (default 20,000); the output ends with the counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use broca_crash_tests::{fuzz, mix, Rng};

/// The system allocator, keeping the peak of live bytes.
struct Peak;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; the counters only observe sizes.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > l.size() {
            let now = LIVE.fetch_add(new - l.size(), Ordering::Relaxed) + new - l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Peak = Peak;

/// Growth of live memory one input may cause at most.
const ALLOC_BOUND: usize = 256 * 1024 * 1024;
/// The time one input may take at most (a hang, not a speed target: inputs take microseconds).
const TIME_BOUND: Duration = Duration::from_secs(5);

/// A mutation of one of `seeds`, or random bytes.
/// A number below `n`, as an index.
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

fn input(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if below(rng, 8) == 0 {
        let n = below(rng, 512);
        return (0..n).map(|_| rng.next_u64() as u8).collect();
    }
    let mut v = seeds[below(rng, seeds.len())].clone();
    for _ in 0..1 + below(rng, 4) {
        let len = v.len().max(1);
        match below(rng, 7) {
            0 if !v.is_empty() => {
                let i = below(rng, v.len());
                v[i] ^= 1 << below(rng, 8);
            }
            1 => {
                let i = below(rng, v.len() + 1);
                v.insert(i, rng.next_u64() as u8);
            }
            2 if !v.is_empty() => {
                let i = below(rng, v.len());
                let n = below(rng, len - i).max(1);
                v.drain(i..(i + n).min(v.len()));
            }
            3 if !v.is_empty() => {
                let i = below(rng, v.len());
                let n = (below(rng, 64) + 1).min(v.len() - i);
                let chunk = v[i..i + n].to_vec();
                v.splice(i..i, chunk);
            }
            4 => v.truncate(below(rng, len)),
            5 if !v.is_empty() => {
                // An interesting number where a length or count may be.
                let i = below(rng, v.len());
                let vals = [0u8, 0x7f, 0x80, 0xff];
                v[i] = vals[below(rng, vals.len())];
            }
            _ => {
                let other = &seeds[below(rng, seeds.len())];
                let at = below(rng, other.len() + 1);
                v.extend_from_slice(&other[at..]);
            }
        }
    }
    v
}

fn wal_seeds() -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let t = broca::wal::SessionTriple::new("/fuzz", "props", "s").unwrap();
    let wal = broca_crash_tests::write_two_part(dir.path(), &t, 6, 3);
    vec![wal.bytes[..wal.batch_end as usize].to_vec(), wal.bytes]
}

fn sse_seeds() -> Vec<Vec<u8>> {
    vec![
        b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n: ping\n\nid: 7\nretry: 10\ndata: a\ndata: b\n\n".to_vec(),
        b"\xEF\xBB\xBFdata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n".to_vec(),
    ]
}

fn http_seeds() -> Vec<Vec<u8>> {
    vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\nretry-after: 1\r\n\r\n{}".to_vec(),
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nbody until close".to_vec(),
    ]
}

fn json_seeds() -> Vec<Vec<u8>> {
    vec![
        br#"{"method":"session.send","params":{"project_root":"/p","harness":"h","session":"s","prompt":"hi","model":"anthropic/m","send_id":"k","max_steps":3,"tools":["a"],"generation":{"temperature":0.5}}}"#.to_vec(),
        br#"{"method":"session.read","params":{"project_root":"/p","harness":"h","session":"s","from_ordinal":2,"limit":10}}"#.to_vec(),
        br#"{"method":"run.status","params":{"project_root":"/p","harness":"h","session":"s","run_id":"r"}}"#.to_vec(),
    ]
}

fn event_stream_seeds() -> Vec<Vec<u8>> {
    let msg = |event: &str, payload: &[u8]| {
        broca_io::eventstream::encode(
            &[(":event-type", event), (":message-type", "event")],
            payload,
        )
    };
    vec![
        [
            msg("contentBlockDelta", br#"{"delta":{"text":"hi"}}"#),
            msg("messageStop", b"{}"),
        ]
        .concat(),
        msg("metadata", br#"{"usage":{"inputTokens":3}}"#),
    ]
}

/// Logs the real CLIs wrote (tests/fixtures/import), their long lines left out (Codex's
/// session_meta, whose instructions are long, replaced by its id and cwd) so the mutations
/// reach the conversation's fields.
fn import_seeds() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/import");
    let short = |name: &str| {
        let bytes = std::fs::read(format!("{dir}/{name}")).unwrap();
        let lines: Vec<Vec<u8>> = bytes
            .split_inclusive(|&b| b == b'\n')
            .filter(|l| l.len() < 2048)
            .map(<[u8]>::to_vec)
            .collect();
        lines.concat()
    };
    let meta = br#"{"type":"session_meta","payload":{"id":"s1","cwd":"/p"}}"#;
    vec![
        short("claude_resumed.jsonl"),
        [&meta[..], b"\n", &short("codex_resumed.jsonl")].concat(),
    ]
}

/// Frames a daemon sends: a route bind, a health check, a request on a route, a drain.
fn subc_seeds() -> Vec<Vec<u8>> {
    use broca::subc::frames::{control, data, encode};
    use broca::subc::protocol::FrameType;
    let bind = br#"{"op":"route.bind","route_channel":3,"epoch":1,"target":{"kind":"management_surface","module_id":"ck-broca"},"identity":{"harness":"h","session":"s"}}"#;
    let frames = [
        encode(FrameType::Request, control(), 0, 0, 7, bind.to_vec()).unwrap(),
        encode(
            FrameType::Request,
            control(),
            0,
            0,
            8,
            br#"{"op":"health.check"}"#.to_vec(),
        )
        .unwrap(),
        encode(
            FrameType::Request,
            data(),
            3,
            1,
            9,
            br#"{"method":"run.status","params":{}}"#.to_vec(),
        )
        .unwrap(),
        encode(
            FrameType::Push,
            control(),
            0,
            0,
            10,
            br#"{"op":"module.draining","reason":"restart","deadline_ms":1}"#.to_vec(),
        )
        .unwrap(),
    ];
    vec![frames.concat(), frames[0].clone()]
}

#[test]
fn every_target_survives_seeded_and_mutated_inputs() {
    let cases: usize = std::env::var("BROCA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let targets: Vec<(&str, fn(&[u8]), Vec<Vec<u8>>)> = vec![
        ("wal_reader", fuzz::wal_reader, wal_seeds()),
        ("sse", fuzz::sse, sse_seeds()),
        ("http_response", fuzz::http_response, http_seeds()),
        ("management_json", fuzz::management_json, json_seeds()),
        ("event_stream", fuzz::event_stream, event_stream_seeds()),
        ("import_log", fuzz::import_log, import_seeds()),
        ("subc_frames", fuzz::subc_frames, subc_seeds()),
    ];
    let mut total = 0;
    for (name, target, seeds) in &targets {
        let mut rng = Rng(mix(name.len() as u64 * 7919));
        for case in 0..cases {
            let data = if case < seeds.len() {
                seeds[case].clone()
            } else {
                input(&mut rng, seeds)
            };
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let t = Instant::now();
            let outcome = std::panic::catch_unwind(|| target(&data));
            let took = t.elapsed();
            let grew = PEAK.load(Ordering::Relaxed).saturating_sub(before);
            let hex: String = data.iter().take(256).map(|b| format!("{b:02x}")).collect();
            assert!(outcome.is_ok(), "{name} case {case} panicked on {hex}");
            assert!(
                grew <= ALLOC_BOUND,
                "{name} case {case} allocated {grew} bytes on {hex}"
            );
            assert!(
                took <= TIME_BOUND,
                "{name} case {case} took {took:?} on {hex}"
            );
            total += 1;
        }
    }
    println!(
        "fuzz property run: {total} inputs over {} targets, no panic, no allocation over {} MiB, none over {:?}",
        targets.len(),
        ALLOC_BOUND >> 20,
        TIME_BOUND
    );
}
