//! What the attachments and media cases need of the adapter: the scripted tool's answers with
//! images, as tool-result/v1 bodies (its catalog entry opts in and broca's routes declare the
//! format).

use base64::Engine;
use serde_json::{json, Value};

/// An image part of a tool-result/v1 body.
fn image(bytes: &[u8]) -> Value {
    json!({"type": "image", "mimeType": "image/png",
        "data": base64::engine::general_purpose::STANDARD.encode(bytes),
        "width": 1, "height": 1})
}

/// Text, the image, text.
pub fn attachment_tool_result(png: &[u8]) -> Value {
    json!({"content": [
        {"type": "text", "text": "before-media"},
        image(png),
        {"type": "text", "text": "after-media"},
    ]})
}

/// The image alone, or in a result with text before it. A scenario whose result must also
/// hold megabytes of text cannot be answered: broca keeps tool-provider/v1's 64 KiB
/// model-visible limit (a larger answer is discarded as `tool_result_too_large`), so no tool of
/// broca's returns one; nor a multipart result of mixed large texts (`multipart_tool_result`
/// is not offered, for the same reason).
pub fn media_tool_result(bytes: &[u8], nested: bool, scenario: &str) -> Option<Value> {
    if scenario == "media_descriptors_stable_across_pages" {
        return None;
    }
    Some(if nested {
        json!({"content": [{"type": "text", "text": "the tool's image"}, image(bytes)]})
    } else {
        json!({"content": [image(bytes)]})
    })
}
