//! Each family's rendering of attachments (llm-runner/v1 `attachments`), byte for byte: a
//! user message with its text, a PNG image and a PDF document; a tool's image following the
//! step's results; and a medium whose bytes the request does not carry (its model does not
//! take it) as the role's marker text.

use std::collections::BTreeMap;
use std::sync::Arc;

use broca_protocol::media::{Media, MediaBytes};
use broca_protocol::{Block, Message, Request, Role};

use crate::alias::Aliases;
use crate::sample_request;

const PNG: &[u8] = b"\x89PNG";
const PDF: &[u8] = b"%PDF-1";

/// A medium named by `digest` (a renderer takes the bytes the request carries under it).
fn media(kind: &str, mime: &str, data: &[u8], digest: char) -> Media {
    Media {
        kind: kind.into(),
        mime: mime.into(),
        bytes: data.len() as u64,
        sha256: digest.to_string().repeat(64),
    }
}

fn image() -> Media {
    media("image", "image/png", PNG, 'a')
}

fn pdf() -> Media {
    media("document", "application/pdf", PDF, 'b')
}

/// The sample with attachments: the prompt carries an image and a PDF, the tool's result an
/// image after it.
fn with_media(carried: bool) -> Request {
    let mut req = sample_request();
    req.system = None;
    req.prompt_cache = false;
    req.messages[0] = Arc::new(Message {
        role: Role::User,
        content: broca_protocol::user_blocks("What is this?", &[image(), pdf()]),
    });
    Arc::make_mut(&mut req.messages[2])
        .content
        .push(Block::Media(image()));
    if carried {
        let mut bytes = BTreeMap::new();
        bytes.insert(image().sha256, Arc::<[u8]>::from(PNG));
        bytes.insert(pdf().sha256, Arc::<[u8]>::from(PDF));
        req.media = MediaBytes(Arc::new(bytes));
    }
    req
}

fn text(body: Vec<u8>) -> String {
    String::from_utf8(body).unwrap()
}

/// `iVBORw==` and `JVBERi0x` are the base64 of the PNG's and the PDF's bytes.
const PNG64: &str = "iVBORw==";
const PDF64: &str = "JVBERi0x";

fn pdf_name() -> String {
    format!("{}.pdf", &pdf().sha256[..12])
}

#[test]
fn anthropic_takes_image_and_document_blocks() {
    let req = with_media(true);
    let body = text(crate::anthropic::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(body.contains(&format!(
        concat!(
            r#"{{"role":"user","content":[{{"type":"text","text":"What is this?"}},"#,
            r#"{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{png}"}}}},"#,
            r#"{{"type":"document","source":{{"type":"base64","media_type":"application/pdf","data":"{pdf}"}}}}]}}"#
        ),
        png = PNG64,
        pdf = PDF64
    )), "{body}");
    assert!(body.contains(&format!(
        r#"{{"type":"tool_result","tool_use_id":"call_1","content":"18C"}},{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{PNG64}"}}}}]}}"#
    )), "{body}");
}

#[test]
fn openai_chat_takes_image_urls_and_files_in_a_user_message() {
    let req = with_media(true);
    let body = text(crate::openai_chat::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(body.contains(&format!(
        concat!(
            r#"{{"role":"user","content":[{{"type":"text","text":"What is this?"}},"#,
            r#"{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{png}"}}}},"#,
            r#"{{"type":"file","file":{{"filename":"{name}","file_data":"data:application/pdf;base64,{pdf}"}}}}]}}"#
        ),
        png = PNG64,
        pdf = PDF64,
        name = pdf_name()
    )), "{body}");
    // The tool message, then the tool's image in a user message of its own.
    assert!(body.contains(&format!(
        r#"{{"role":"tool","tool_call_id":"call_1","content":"18C"}},{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{PNG64}"}}}}]}}"#
    )), "{body}");
}

#[test]
fn openai_responses_takes_input_image_and_input_file() {
    let req = with_media(true);
    let body =
        text(crate::openai_responses::render::render(&req, &Aliases::for_tools(&req.tools)).body);
    assert!(body.contains(&format!(
        concat!(
            r#"{{"type":"message","role":"user","content":[{{"type":"input_text","text":"What is this?"}},"#,
            r#"{{"type":"input_image","image_url":"data:image/png;base64,{png}"}},"#,
            r#"{{"type":"input_file","filename":"{name}","file_data":"data:application/pdf;base64,{pdf}"}}]}}"#
        ),
        png = PNG64,
        pdf = PDF64,
        name = pdf_name()
    )), "{body}");
    assert!(body.contains(&format!(
        r#"{{"type":"function_call_output","call_id":"call_1","output":"18C"}},{{"type":"message","role":"user","content":[{{"type":"input_image","image_url":"data:image/png;base64,{PNG64}"}}]}}"#
    )), "{body}");
}

#[test]
fn gemini_takes_inline_data() {
    let req = with_media(true);
    let body = text(crate::gemini::render::body(
        &req,
        &Aliases::for_tools(&req.tools),
    ));
    assert!(
        body.contains(&format!(
            concat!(
                r#"{{"role":"user","parts":[{{"text":"What is this?"}},"#,
                r#"{{"inlineData":{{"mimeType":"image/png","data":"{png}"}}}},"#,
                r#"{{"inlineData":{{"mimeType":"application/pdf","data":"{pdf}"}}}}]}}"#
            ),
            png = PNG64,
            pdf = PDF64
        )),
        "{body}"
    );
}

#[test]
fn bedrock_takes_image_and_document_blocks() {
    let req = with_media(true);
    let body = text(crate::bedrock::render::body(
        &req,
        &Aliases::for_tools(&req.tools),
    ));
    assert!(body.contains(&format!(
        concat!(
            r#"{{"role":"user","content":[{{"text":"What is this?"}},"#,
            r#"{{"image":{{"format":"png","source":{{"bytes":"{png}"}}}}}},"#,
            r#"{{"document":{{"format":"pdf","name":"document-{head}","source":{{"bytes":"{pdf}"}}}}}}]}}"#
        ),
        png = PNG64,
        pdf = PDF64,
        head = &pdf().sha256[..12]
    )), "{body}");
}

#[test]
fn media_a_request_does_not_carry_is_the_roles_marker() {
    let req = with_media(false);
    let marker = broca_protocol::media::marker(&image(), "unsupported");
    for body in [
        text(crate::anthropic::render::render(&req, &Aliases::for_tools(&req.tools)).body),
        text(crate::openai_chat::render::render(&req, &Aliases::for_tools(&req.tools)).body),
        text(crate::gemini::render::body(
            &req,
            &Aliases::for_tools(&req.tools),
        )),
        text(crate::bedrock::render::body(
            &req,
            &Aliases::for_tools(&req.tools),
        )),
    ] {
        assert!(body.contains(&marker), "{body}");
        assert!(!body.contains(PNG64), "{body}");
    }
}
