//! The official SDKs as oracles: recorded streams (tests/fixtures/gemini_stream.sse, and
//! bedrock_converse.eventstream, framed by tests/fixtures/make_bedrock_converse.py apart from
//! broca) are decoded by `google-genai` and `boto3` (tests/peers/sdk_oracle.py, which serves
//! the bytes on loopback to the SDK) and by broca's decoder and normalizer, fed in small
//! chunks: the two must agree on every part in order (text, thoughts and their signatures,
//! calls with their ids, names and arguments), on the usage (mapped onto the canonical
//! measures as docs/usage.md says), on the finish and on the request path the SDK used; and
//! broca's SigV4 signs boto3's own request to the signature boto3 gave it. google-genai's
//! request types (tests/peers/sdk_request_oracle.py) read a Gemini request broca rendered with
//! a response schema, and one with an image and a PDF; botocore's model of ConverseStream
//! (tests/peers/converse_request_oracle.py) reads a Bedrock request with an image and a PDF.

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use broca_protocol::{FinishReason, Message, Request, StreamEvent, Usage};
use broca_provider::{family, Aliases, Normalized};
use serde_json::{json, Value};
use support::{fixture, peers_dir, python_sdks};

/// What the SDK decoded of `fixture`, and the requests it made (path, headers, body).
fn sdk(family: &str, fixture: &Path) -> (Vec<Value>, Vec<Value>) {
    let out = Command::new(python_sdks())
        .arg(peers_dir().join("sdk_oracle.py"))
        .arg(family)
        .arg(fixture)
        .output()
        .expect("the oracle runs");
    assert!(
        out.status.success(),
        "the {family} SDK refused the recorded stream: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let requests = v["requests"].as_array().unwrap().clone();
    (v["decoded"].as_array().unwrap().clone(), requests)
}

/// broca's events for a stream, fed 7 bytes at a time.
fn broca_events(family_id: &str, bytes: &[u8]) -> Vec<StreamEvent> {
    let mut n = family(family_id).unwrap().normalizer(Aliases::default());
    let mut out = Vec::new();
    let mut push = |event: Option<&str>, data: &str| match n.push(event, data).unwrap() {
        Normalized::Events(e) => out.extend(e),
        Normalized::Error(e) => panic!("{e:?}"),
    };
    if family_id == "bedrock-converse" {
        let mut d = broca_io::eventstream::EventStreamDecoder::default();
        for chunk in bytes.chunks(7) {
            d.push(chunk, &mut |m| {
                push(
                    m.header_str(":event-type"),
                    std::str::from_utf8(m.payload).unwrap(),
                )
            })
            .unwrap();
        }
        assert!(!d.is_mid_message());
    } else {
        let mut d = broca_io::sse::SseDecoder::default();
        for chunk in bytes.chunks(7) {
            d.push(chunk, &mut |e| push(e.event, e.data)).unwrap();
        }
    }
    out
}

/// broca's parts in the oracle's shape, its usage, its finish and request id.
fn parts(events: Vec<StreamEvent>) -> (Vec<Value>, Usage, FinishReason, Option<String>) {
    let (mut parts, mut usage, mut finish) = (Vec::new(), None, None);
    let mut call: Option<(String, String, String)> = None;
    for e in events {
        match e {
            StreamEvent::TextDelta(t) => parts.push(json!({"text": t})),
            StreamEvent::ThinkingDelta(t) => parts.push(json!({"thought": t})),
            StreamEvent::ThinkingSignature(s) => parts.push(json!({"thought_signature": s})),
            StreamEvent::PartSignature(s) => parts.push(json!({"signature": s})),
            StreamEvent::ToolCallStart { id, name, .. } => call = Some((id, name, String::new())),
            StreamEvent::ToolCallArgsDelta { json, .. } => call.as_mut().unwrap().2 += &json,
            StreamEvent::ToolCallEnd { .. } => {
                let (id, name, args) = call.take().unwrap();
                // A Gemini call without an id gets broca's own, which is never sent back.
                let id = (!id.starts_with("gemini-call-")).then_some(id);
                let args: Value = serde_json::from_str(&args).unwrap();
                parts.push(json!({"call": {"id": id, "name": name, "args": args}}));
            }
            StreamEvent::Usage(u) => usage = Some(u),
            StreamEvent::Finish { reason, request_id } => finish = Some((reason, request_id)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let (reason, id) = finish.expect("a finish");
    (parts, usage.expect("usage"), reason, id)
}

/// The SDK's parts (without usage, finish and response ids), its last usage, its finish and
/// response id.
fn sdk_parts(decoded: Vec<Value>) -> (Vec<Value>, Value, String, Option<String>) {
    let (mut parts, mut usage, mut finish, mut id) = (Vec::new(), None, None, None);
    for d in decoded {
        if let Some(u) = d.get("usage") {
            usage = Some(u.clone());
        } else if let Some(f) = d.get("finish") {
            finish = Some(f.as_str().unwrap().to_string());
        } else if let Some(r) = d.get("response_id") {
            id = Some(r.as_str().unwrap().to_string());
        } else {
            parts.push(d);
        }
    }
    (parts, usage.expect("usage"), finish.expect("a finish"), id)
}

/// Standard base64 (the oracle's encoding of request bodies).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for quad in s.trim_end_matches('=').as_bytes().chunks(4) {
        let n = quad
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (value(c) as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..quad.len()]);
    }
    out
}

fn request(provider: &str, model: &str) -> Request {
    Request {
        provider: provider.into(),
        model: model.into(),
        credential_id: String::new(),
        system: None,
        messages: vec![Arc::new(Message::user_text("hi"))],
        tools: Arc::from(Vec::new()),
        generation: Default::default(),
        prompt_cache: false,
        route: None,
        shape: None,
        media: Default::default(),
    }
}

#[test]
fn google_genai_decodes_a_recorded_gemini_stream_as_broca_does() {
    let path = fixture("gemini_stream.sse");
    let (decoded, requests) = sdk("gemini", &path);
    let (want, usage, finish, id) = sdk_parts(decoded);
    let (got, u, reason, request_id) =
        parts(broca_events("gemini", &std::fs::read(&path).unwrap()));
    assert_eq!(got, want);
    assert_eq!(want.len(), 7, "the fixture's parts all decoded: {want:?}");
    let count = |k: &str| usage.get(k).map(|v| v.as_u64().unwrap());
    assert_eq!(u.input, count("prompt_token_count"));
    assert_eq!(
        u.output,
        Some(count("candidates_token_count").unwrap() + count("thoughts_token_count").unwrap())
    );
    assert_eq!(u.cache_read, count("cached_content_token_count"));
    assert_eq!(u.reasoning, count("thoughts_token_count"));
    assert_eq!(u.cache_write, None, "Gemini reports no cache writes");
    assert_eq!(finish, "STOP");
    assert_eq!(reason, FinishReason::ToolUse, "STOP after function calls");
    assert_eq!(request_id, id);
    // The same model path (the SDK's API version aside).
    let rendered = family("gemini")
        .unwrap()
        .render(&request("gemini", "gemini-2.5-flash"), &Aliases::default());
    let ours = rendered.path.split_once("/models/").unwrap().1;
    assert_eq!(requests.len(), 1);
    let asked = requests[0]["path"].as_str().unwrap();
    assert_eq!(asked.split_once("/models/").unwrap().1, ours);
}

/// google-genai's own request types read the Gemini request broca renders for an enforced
/// final-text shape (llm-runner/v1 `structured_output`): JSON output under the schema.
#[test]
fn google_genai_reads_a_gemini_request_with_a_response_schema() {
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "additionalProperties": false});
    let mut req = request("gemini", "gemini-2.5-flash");
    req.generation.max_output_tokens = Some(64);
    req.shape = Some(Arc::new(broca_protocol::OutputShape {
        name: "result".into(),
        final_text: Some(schema.clone()),
        strict_tool: None,
    }));
    let body = broca_provider::gemini::render::body(&req, &Aliases::default());
    let read = request_oracle("sdk_request_oracle.py", &body);
    assert_eq!(read["ok"], true, "{read}");
    let config = &read["generation_config"];
    assert_eq!(config["response_mime_type"], "application/json", "{config}");
    assert_eq!(config["response_json_schema"], schema, "{config}");
    assert_eq!(config["max_output_tokens"], 64, "{config}");
    // The oracle refuses what the API does not take.
    let mut wrong: Value = serde_json::from_slice(&body).unwrap();
    wrong["generationConfig"]["responseSchemaJson"] = json!({});
    let refused = request_oracle("sdk_request_oracle.py", wrong.to_string().as_bytes());
    assert_eq!(refused["ok"], false, "{refused}");
}

/// Runs the oracle `script` on `body`; answers what it printed.
fn request_oracle(script: &str, body: &[u8]) -> Value {
    use std::io::Write;
    let mut child = Command::new(python_sdks())
        .arg(peers_dir().join(script))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the request oracle runs");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    serde_json::from_slice(&out.stdout).expect("the oracle's answer")
}

/// A request whose prompt carries a PNG image and a PDF, their bytes carried with it.
fn with_attachments(provider: &str, model: &str) -> (Request, Vec<u8>, Vec<u8>) {
    use broca_protocol::media::{Media, MediaBytes};
    let png = b"\x89PNG\r\n\x1a\n-not-a-real-image".to_vec();
    let pdf = b"%PDF-1.7 not a real document".to_vec();
    let medium = |kind: &str, mime: &str, data: &[u8], digest: char| Media {
        kind: kind.into(),
        mime: mime.into(),
        bytes: data.len() as u64,
        sha256: digest.to_string().repeat(64),
    };
    let (image, document) = (
        medium("image", "image/png", &png, 'a'),
        medium("document", "application/pdf", &pdf, 'b'),
    );
    let mut req = request(provider, model);
    req.messages = vec![Arc::new(Message {
        role: broca_protocol::Role::User,
        content: broca_protocol::user_blocks("What is in these?", &[image, document]),
    })];
    let mut bytes = std::collections::BTreeMap::new();
    bytes.insert("a".repeat(64), Arc::<[u8]>::from(png.clone()));
    bytes.insert("b".repeat(64), Arc::<[u8]>::from(pdf.clone()));
    req.media = MediaBytes(Arc::new(bytes));
    (req, png, pdf)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// google-genai's request types read the Gemini request broca renders for a prompt with an
/// image and a PDF (llm-runner/v1 `attachments`): each inline part's type, and its bytes as
/// the SDK decodes them.
#[test]
fn google_genai_reads_a_gemini_request_with_an_image_and_a_document() {
    let (req, png, pdf) = with_attachments("gemini", "gemini-2.5-flash");
    let body = broca_provider::gemini::render::body(&req, &Aliases::default());
    let read = request_oracle("sdk_request_oracle.py", &body);
    assert_eq!(read["ok"], true, "{read}");
    assert_eq!(
        read["inline"],
        json!([{"mime_type": "image/png", "hex": hex(&png)},
            {"mime_type": "application/pdf", "hex": hex(&pdf)}]),
        "{read}"
    );
}

/// botocore's model of ConverseStream reads the Bedrock request broca renders for a prompt
/// with an image and a PDF: the shape holds, the formats are the API's, the blobs decode to
/// the bytes attached; and it refuses a format the API does not take.
#[test]
fn botocore_reads_a_converse_request_with_an_image_and_a_document() {
    let (req, png, pdf) = with_attachments("bedrock", "anthropic.claude-sonnet-4");
    let body = broca_provider::bedrock::render::body(&req, &Aliases::default());
    let read = request_oracle("converse_request_oracle.py", &body);
    assert_eq!(read["ok"], true, "{read}");
    let blobs: Vec<&str> = read["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["hex"].as_str().unwrap())
        .collect();
    assert_eq!(blobs, [hex(&png), hex(&pdf)], "{read}");
    let mut wrong: Value = serde_json::from_slice(&body).unwrap();
    wrong["messages"][0]["content"][1]["image"]["format"] = json!("tiff");
    let refused = request_oracle("converse_request_oracle.py", wrong.to_string().as_bytes());
    assert_eq!(refused["ok"], false, "{refused}");
}

#[test]
fn boto3_decodes_a_recorded_converse_stream_as_broca_does() {
    let path = fixture("bedrock_converse.eventstream");
    let (decoded, requests) = sdk("bedrock", &path);
    let (want, usage, finish, _) = sdk_parts(decoded);
    let bytes = std::fs::read(&path).unwrap();
    let (got, u, reason, _) = parts(broca_events("bedrock-converse", &bytes));
    assert_eq!(got, want);
    assert_eq!(want.len(), 5, "the fixture's parts all decoded: {want:?}");
    let count = |k: &str| usage[k].as_u64().unwrap();
    assert_eq!(
        u.input,
        Some(count("inputTokens") + count("cacheReadInputTokens") + count("cacheWriteInputTokens"))
    );
    assert_eq!(u.output, Some(count("outputTokens")));
    assert_eq!(u.cache_read, Some(count("cacheReadInputTokens")));
    assert_eq!(u.cache_write, Some(count("cacheWriteInputTokens")));
    assert_eq!(u.reasoning, None);
    assert_eq!(
        (finish.as_str(), reason),
        ("tool_use", FinishReason::ToolUse)
    );
    // The model id is one path segment, escaped as the SDK escapes it.
    let model = "anthropic.claude-sonnet-4-5-20250929-v1:0";
    let rendered = family("bedrock-converse")
        .unwrap()
        .render(&request("bedrock", model), &Aliases::default());
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["path"], rendered.path.as_str());
    // broca's SigV4 signs boto3's own request (its headers, date and body) to boto3's
    // signature.
    let r = &requests[0];
    let auth = r["headers"]["authorization"].as_str().unwrap();
    let field = |name: &str| {
        auth.split([' ', ','])
            .find_map(|p| p.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {auth}"))
    };
    let names = field("SignedHeaders=");
    let headers: Vec<(String, String)> = names
        .split(';')
        .map(|n| (n.to_string(), r["headers"][n].as_str().unwrap().to_string()))
        .collect();
    let date = r["headers"]["x-amz-date"].as_str().unwrap();
    let scope = broca_provider::sigv4::Scope {
        access_key_id: "AKIDORACLE",
        secret_access_key: "oracle-secret",
        region: "us-east-1",
        service: "bedrock",
        amz_date: date,
    };
    let body = base64_decode(r["body"].as_str().unwrap());
    let (signed, signature) =
        broca_provider::sigv4::sign(&scope, "POST", r["path"].as_str().unwrap(), &headers, &body);
    assert_eq!(signed, names);
    assert_eq!(signature, field("Signature="), "{auth}");
    assert_eq!(
        broca_provider::sigv4::authorization(&scope, &signed, &signature),
        auth
    );
    // A flipped byte anywhere in a message body is refused by both.
    let mut bad = bytes.clone();
    bad[40] ^= 0x20;
    let damaged = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(damaged.path(), &bad).unwrap();
    let out = Command::new(python_sdks())
        .arg(peers_dir().join("sdk_oracle.py"))
        .args(["bedrock".as_ref(), damaged.path().as_os_str()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "boto3 took a damaged stream");
    let mut d = broca_io::eventstream::EventStreamDecoder::default();
    assert!(
        d.push(&bad, &mut |_| {}).is_err(),
        "broca took a damaged stream"
    );
}
