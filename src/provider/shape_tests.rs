//! Each family's rendering of an enforced output shape: a final text constrained to a schema,
//! and one tool rendered strict (llm-runner/v1 `structured_output`), byte for byte.

use std::sync::Arc;

use broca_protocol::OutputShape;

use crate::alias::Aliases;
use crate::sample_request;

fn schema() -> serde_json::Value {
    serde_json::json!({"additionalProperties": false, "properties": {"answer": {"type": "string"}},
        "required": ["answer"], "type": "object"})
}

const SCHEMA: &str = r#"{"additionalProperties":false,"properties":{"answer":{"type":"string"}},"required":["answer"],"type":"object"}"#;

fn final_text() -> broca_protocol::Request {
    let mut req = sample_request();
    req.shape = Some(Arc::new(OutputShape {
        name: "conformance_result".into(),
        final_text: Some(schema()),
        strict_tool: None,
    }));
    req
}

fn strict_clock() -> broca_protocol::Request {
    let mut req = sample_request();
    req.shape = Some(Arc::new(OutputShape {
        name: "r".into(),
        final_text: None,
        strict_tool: Some("clock".into()),
    }));
    req
}

fn text(body: Vec<u8>) -> String {
    String::from_utf8(body).unwrap()
}

#[test]
fn anthropic_takes_output_config_and_strict_tools() {
    let req = final_text();
    let body = text(crate::anthropic::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    let want =
        format!(r#""output_config":{{"format":{{"type":"json_schema","schema":{SCHEMA}}}}},"#);
    assert!(body.contains(&want), "{body}");
    let req = strict_clock();
    let body = text(crate::anthropic::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(
        body.contains(r#"{"name":"clock","input_schema":{"type":"object"},"strict":true,"#),
        "{body}"
    );
    assert_eq!(
        body.matches("strict").count(),
        1,
        "only the named tool is strict"
    );
}

#[test]
fn openai_chat_takes_response_format_and_strict_functions() {
    let req = final_text();
    let body = text(crate::openai_chat::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    let want = format!(
        r#""response_format":{{"type":"json_schema","json_schema":{{"name":"conformance_result","schema":{SCHEMA},"strict":true}}}}"#
    );
    assert!(body.contains(&want), "{body}");
    let req = strict_clock();
    let body = text(crate::openai_chat::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(
        body.contains(r#""name":"clock","parameters":{"type":"object"},"strict":true}"#),
        "{body}"
    );
}

#[test]
fn openai_responses_takes_text_format_and_strict_functions() {
    let req = final_text();
    let body =
        text(crate::openai_responses::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    let want = format!(
        r#""text":{{"format":{{"type":"json_schema","name":"conformance_result","schema":{SCHEMA},"strict":true}}}}"#
    );
    assert!(body.contains(&want), "{body}");
    let req = strict_clock();
    let body =
        text(crate::openai_responses::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(
        body.contains(r#""name":"clock","parameters":{"type":"object"},"strict":true}"#),
        "{body}"
    );
    assert!(
        body.contains(r#""strict":false"#),
        "the other tool stays non-strict: {body}"
    );
}

#[test]
fn gemini_takes_a_json_response_schema() {
    let req = final_text();
    let body = text(crate::gemini::render::body(
        &req,
        &Aliases::for_tools(&req.tools),
    ));
    let want = format!(
        r#""generationConfig":{{"maxOutputTokens":256,"temperature":0.5,"responseMimeType":"application/json","responseJsonSchema":{SCHEMA}}}"#
    );
    assert!(body.contains(&want), "{body}");
}
