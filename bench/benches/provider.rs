//! Provider stream costs: server-sent events decoded and normalized into canonical events,
//! per wire family, measured beside a plain memchr scan of the same bytes (the limit), and
//! rendering a 200-message transcript per family.
//! Run: `cargo bench -p broca-bench --bench provider`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use broca::protocol::{Block, Generation, Json, Message, Request, Role, ToolSpec};
use broca::provider::{family, Aliases, Normalized};
use broca_io::sse::SseDecoder;
use criterion::{Criterion, Throughput};

/// Text pieces as models stream them: a few tokens each, with the escapes real text has.
const PIECES: &[&str] = &[
    "The",
    " quick",
    " brown fox",
    " jumps over",
    " the lazy",
    " dog.",
    "\\n\\n",
    "Here is",
    " a list:",
    "\\n- item",
    " \\\"quoted\\\"",
    " caf\\u00e9",
    " and",
    " more",
    " text,",
    " with numbers 1234",
    " and code `x = y`",
    ".",
];

const DELTAS: usize = 6000;
const ARG_DELTAS: usize = 300;
const CHUNK: usize = 16 * 1024;

fn anthropic_stream() -> Vec<u8> {
    let mut s = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":472,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":2048,\"output_tokens\":2}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    for i in 0..DELTAS {
        if i % 40 == 0 {
            s.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
        }
        s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"");
        s.push_str(PIECES[i % PIECES.len()]);
        s.push_str("\"}}\n\n");
    }
    s.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_01T1x1fJ34qAmk2tNTrN7Up6\",\"name\":\"write_file\",\"input\":{}}}\n\n");
    for i in 0..ARG_DELTAS {
        s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"");
        s.push_str(if i == 0 {
            "{\\\"content\\\": \\\""
        } else {
            "line of code\\\\n"
        });
        s.push_str("\"}}\n\n");
    }
    s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"}\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":6789}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

fn chat_stream() -> Vec<u8> {
    const HEAD: &str = "data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741570283,\"model\":\"gpt-4o-2024-08-06\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_fc9f1d7035\",\"choices\":[{\"index\":0,\"delta\":";
    let mut s = String::new();
    s.push_str(HEAD);
    s.push_str("{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
    for i in 0..DELTAS {
        s.push_str(HEAD);
        s.push_str("{\"content\":\"");
        s.push_str(PIECES[i % PIECES.len()]);
        s.push_str("\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"Xq3\"}\n\n");
    }
    for i in 0..ARG_DELTAS {
        s.push_str(HEAD);
        if i == 0 {
            s.push_str("{\"tool_calls\":[{\"index\":0,\"id\":\"call_DdmO9pD3xa9XTPNJ32zg2hcA\",\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
        } else {
            s.push_str("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"line of code\"}}]},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
        }
    }
    s.push_str(HEAD);
    s.push_str("{},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n");
    s.push_str("data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741570283,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":472,\"completion_tokens\":6789,\"total_tokens\":7261,\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

fn responses_stream() -> Vec<u8> {
    let mut s = String::from(
        "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5e2b4e\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n\
event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5e2b4e\",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}}\n\n",
    );
    let mut seq = 2;
    for i in 0..DELTAS {
        s.push_str(&format!("event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"sequence_number\":{seq},\"item_id\":\"msg_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5e2b4e\",\"output_index\":0,\"content_index\":0,\"delta\":\""));
        s.push_str(PIECES[i % PIECES.len()]);
        s.push_str("\",\"logprobs\":[],\"obfuscation\":\"Xq3\"}\n\n");
        seq += 1;
    }
    s.push_str("event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":9000,\"output_index\":1,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"call_9\",\"name\":\"write_file\"}}\n\n");
    for _ in 0..ARG_DELTAS {
        s.push_str(&format!("event: response.function_call_arguments.delta\ndata: {{\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":{seq},\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"line of code\",\"obfuscation\":\"Xq3\"}}\n\n"));
        seq += 1;
    }
    s.push_str("event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":99999,\"output_index\":1,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"status\":\"completed\",\"arguments\":\"{}\",\"call_id\":\"call_9\",\"name\":\"write_file\"}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":100000,\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":472,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":6789,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":7261}}}\n\n");
    s.into_bytes()
}

/// Gemini's stream; with `counting`, every event's usage counts the output so far, as the API
/// sends it (running totals); without, every event repeats the same usage.
fn gemini_stream(counting: bool) -> Vec<u8> {
    // Whole GenerateContentResponse objects, a few tokens of text each, then one with the
    // function call, the finish and the usage.
    let mut s = String::new();
    for i in 0..DELTAS {
        s.push_str("data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"");
        s.push_str(PIECES[i % PIECES.len()]);
        s.push_str("\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 472,");
        if counting {
            s.push_str(&format!(
                "\"candidatesTokenCount\": {},\"totalTokenCount\": {}",
                i + 1,
                473 + i
            ));
        } else {
            s.push_str("\"totalTokenCount\": 472");
        }
        s.push_str("},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"mHkNaLqWMY2p1dkP3eWw2Ag\"}\r\n\r\n");
    }
    s.push_str("data: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"write_file\",\"args\": {\"content\": \"");
    for _ in 0..ARG_DELTAS {
        s.push_str("line of code");
    }
    s.push_str("\"}},\"thoughtSignature\": \"CiQB0e2Kb3Nlb3Zl\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 472,\"candidatesTokenCount\": 6789,\"totalTokenCount\": 7261},\"responseId\": \"mHkNaLqWMY2p1dkP3eWw2Ag\"}\r\n\r\n");
    s.into_bytes()
}

/// Gemini's stream (running totals) in Code Assist's envelope.
fn code_assist_stream() -> Vec<u8> {
    let gemini = String::from_utf8(gemini_stream(true)).unwrap();
    let mut s = String::new();
    for event in gemini.split_terminator("\r\n\r\n") {
        let data = event.strip_prefix("data: ").unwrap();
        s.push_str(&format!(
            "data: {{\"response\": {data},\"traceId\": \"4f2a9c1e7b3d5a60\"}}\r\n\r\n"
        ));
    }
    s.into_bytes()
}

fn bedrock_stream() -> Vec<u8> {
    use broca_io::eventstream::encode;
    let ev = |kind: &str, payload: String| {
        encode(
            &[
                (":event-type", kind),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.as_bytes(),
        )
    };
    let mut s = ev(
        "messageStart",
        r#"{"p":"abcdefghijkl","role":"assistant"}"#.into(),
    );
    for i in 0..DELTAS {
        s.extend(ev(
            "contentBlockDelta",
            format!(
                r#"{{"contentBlockIndex":0,"delta":{{"text":"{}"}},"p":"abcdefghijklmnopqrstu"}}"#,
                PIECES[i % PIECES.len()]
            ),
        ));
    }
    s.extend(ev(
        "contentBlockStop",
        r#"{"contentBlockIndex":0,"p":"abcd"}"#.into(),
    ));
    s.extend(ev(
        "contentBlockStart",
        r#"{"contentBlockIndex":1,"p":"ab","start":{"toolUse":{"name":"write_file","toolUseId":"tooluse_kZJMlvQmRJ6eAyJE5GIl7Q"}}}"#.into(),
    ));
    for _ in 0..ARG_DELTAS {
        s.extend(ev(
            "contentBlockDelta",
            r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"line of code"}},"p":"abcdefg"}"#
                .into(),
        ));
    }
    s.extend(ev(
        "contentBlockStop",
        r#"{"contentBlockIndex":1,"p":"abcd"}"#.into(),
    ));
    s.extend(ev(
        "messageStop",
        r#"{"p":"abc","stopReason":"tool_use"}"#.into(),
    ));
    s.extend(ev(
        "metadata",
        r#"{"metrics":{"latencyMs":2300},"p":"ab","usage":{"inputTokens":472,"outputTokens":6789,"totalTokens":7261}}"#.into(),
    ));
    s
}

/// Decodes the AWS event stream and normalizes it (Bedrock) in network-sized chunks.
fn normalize_eventstream(stream: &[u8]) -> usize {
    let mut d = broca_io::eventstream::EventStreamDecoder::new(1 << 24);
    let mut n = family("bedrock-converse")
        .unwrap()
        .normalizer(Aliases::default());
    let mut events = 0usize;
    for chunk in stream.chunks(CHUNK) {
        d.push(chunk, &mut |m| {
            let data = std::str::from_utf8(m.payload).unwrap();
            match n.push(m.header_str(":event-type"), data) {
                Ok(Normalized::Events(evs)) => events += evs.len(),
                other => panic!("{other:?}"),
            }
        })
        .unwrap();
    }
    events
}

fn decode_eventstream(stream: &[u8]) -> usize {
    let mut d = broca_io::eventstream::EventStreamDecoder::new(1 << 24);
    let mut bytes = 0usize;
    for chunk in stream.chunks(CHUNK) {
        d.push(chunk, &mut |m| bytes += m.payload.len()).unwrap();
    }
    bytes
}

/// Decodes and normalizes `stream` in network-sized chunks; returns the events made.
fn normalize(family_id: &str, stream: &[u8]) -> usize {
    let mut sse = SseDecoder::default();
    let mut n = family(family_id).unwrap().normalizer(Aliases::default());
    let mut events = 0usize;
    for chunk in stream.chunks(CHUNK) {
        sse.push(chunk, &mut |e| match n.push(e.event, e.data) {
            Ok(Normalized::Events(evs)) => events += evs.len(),
            other => panic!("{other:?}"),
        })
        .unwrap();
    }
    events
}

fn decode_only(stream: &[u8]) -> usize {
    let mut sse = SseDecoder::default();
    let mut bytes = 0usize;
    for chunk in stream.chunks(CHUNK) {
        sse.push(chunk, &mut |e| bytes += e.data.len()).unwrap();
    }
    bytes
}

fn streams(c: &mut Criterion) {
    let all = [
        (
            "anthropic-messages",
            "anthropic-messages",
            anthropic_stream(),
        ),
        ("openai-chat", "openai-chat", chat_stream()),
        ("openai-responses", "openai-responses", responses_stream()),
        ("gemini", "gemini", gemini_stream(true)),
        (
            "gemini (the same usage in every event)",
            "gemini",
            gemini_stream(false),
        ),
        ("code-assist", "code-assist", code_assist_stream()),
        ("chatgpt", "chatgpt", responses_stream()),
    ];
    for (label, id, stream) in &all {
        // The stream is well formed and every delta comes out.
        let events = normalize(id, stream);
        // Gemini sends a function call whole, in one part: one event for its arguments.
        let want = if id.contains("gemini") || *id == "code-assist" {
            DELTAS
        } else {
            DELTAS + ARG_DELTAS
        };
        assert!(events >= want, "{id}: {events} events");
        let mut g = c.benchmark_group(format!("stream/{label}"));
        g.throughput(Throughput::Bytes(stream.len() as u64));
        g.bench_function("memchr scan (limit)", |b| {
            b.iter(|| memchr::memchr_iter(b'\n', black_box(stream)).count())
        });
        g.bench_function("sse decode", |b| b.iter(|| decode_only(black_box(stream))));
        g.bench_function("sse decode + normalize", |b| {
            b.iter(|| normalize(id, black_box(stream)))
        });
        g.finish();
    }
    // Bedrock: the AWS event stream instead of SSE.
    let stream = bedrock_stream();
    let events = normalize_eventstream(&stream);
    assert!(events >= DELTAS + ARG_DELTAS, "bedrock: {events} events");
    let mut g = c.benchmark_group("stream/bedrock-converse");
    g.throughput(Throughput::Bytes(stream.len() as u64));
    g.bench_function("memchr scan (limit)", |b| {
        b.iter(|| memchr::memchr_iter(b'\n', black_box(&stream)).count())
    });
    g.bench_function("event-stream decode", |b| {
        b.iter(|| decode_eventstream(black_box(&stream)))
    });
    g.bench_function("event-stream decode + normalize", |b| {
        b.iter(|| normalize_eventstream(black_box(&stream)))
    });
    g.finish();
}

/// A 200-message transcript: a prompt, then rounds of text + tool call and tool result.
fn transcript() -> Request {
    let mut messages = vec![Message::user_text("Refactor the parser and run the tests.")];
    let mut i = 0;
    while messages.len() < 200 {
        messages.push(Message {
            role: Role::Assistant,
            content: vec![
                Block::Text {
                    text: format!(
                        "Step {i}: reading the next file to see how the parser handles it."
                    ),
                },
                Block::ToolUse {
                    id: format!("toolu_{i:024}"),
                    name: "read_file".into(),
                    input: Json::from_text(format!(
                        "{{\"path\":\"src/parser/mod{i}.rs\",\"limit\":400}}"
                    ))
                    .unwrap(),
                },
            ],
        });
        messages.push(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: format!("toolu_{i:024}"),
                content: "fn parse(input: &str) -> Result<Ast, Error> {\n    let mut p = Parser::new(input);\n    p.expr()\n}\n".repeat(4),
                is_error: false,
            }],
        });
        i += 1;
    }
    let tools = (0..10)
        .map(|t| ToolSpec {
            name: format!("tool_{t}"),
            description: "Reads a file of the project and returns its text.".into(),
            input_schema: serde_json::json!({"type":"object","properties":{"path":{"type":"string"},"limit":{"type":"integer"}},"required":["path"]}),
            route: String::new(),
            reply: None,
        })
        .collect();
    Request {
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        credential_id: "env:ANTHROPIC_API_KEY".into(),
        system: Some("You are a careful engineer.".into()),
        messages: messages.into_iter().map(std::sync::Arc::new).collect(),
        tools,
        generation: Generation::default(),
        prompt_cache: true,
        route: None,
        shape: None,
        media: Default::default(),
    }
}

/// Rendering the transcript whole (nothing held: every message escaped and written), and as
/// a session's next step does: the request before it (two messages shorter) rendered first,
/// untimed, so the session's held prefix has its messages and the timed request renders the
/// new ones and copies the rest (broca_provider::prefix).
fn render(c: &mut Criterion) {
    use broca::provider::prefix;
    let req = transcript();
    let mut before = req.clone();
    before.messages.truncate(req.messages.len() - 2);
    let aliases = Aliases::for_tools(&req.tools);
    let mut g = c.benchmark_group("render 200 messages");
    for &id in broca::provider::FAMILIES {
        let f = family(id).unwrap();
        let bytes = f.render(&req, &aliases).body.len();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(format!("{id}, whole"), |b| {
            b.iter(|| {
                prefix::clear();
                f.render(black_box(&req), &aliases).body.len()
            })
        });
        g.bench_function(format!("{id}, next step"), |b| {
            b.iter_batched(
                || drop(f.render(&before, &aliases)),
                |()| f.render(black_box(&req), &aliases).body.len(),
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(std::time::Duration::from_secs(3))
        .warm_up_time(std::time::Duration::from_secs(1));
    streams(&mut c);
    render(&mut c);
    c.final_summary();
}
