//! Turns an MCP `tools/call` result into the text a tool result carries, within a size limit.

use serde_json::Value;

/// A tool's answer as the transcript records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolText {
    pub content: String,
    pub is_error: bool,
    /// The answer in parts, when it holds images broca keeps (a PNG, JPEG, GIF or WebP whose
    /// data decodes, within [`IMAGE_BYTES_MAX`] together) and its text fits the limit.
    pub parts: Option<Vec<crate::ToolPart>>,
}

/// The most image bytes a result keeps (decoded, all its images together); past it, its
/// images are notes in its text as before.
pub const IMAGE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// An image block's bytes when broca keeps it: a type every family of broca's that takes
/// images renders, and data that decodes.
fn image_of(block: &Value) -> Option<(String, Vec<u8>)> {
    use base64::Engine;
    let mime = block.get("mimeType").and_then(Value::as_str)?;
    if !matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    ) {
        return None;
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(block.get("data").and_then(Value::as_str)?)
        .ok()?;
    Some((mime.to_string(), data))
}

/// The text of a `tools/call` result: text blocks in order (an embedded text resource as its
/// text; images, audio, links and binary resources as a bracketed note, their bytes left out);
/// `structuredContent` as JSON when no block carries text; `isError` kept. Cut to `max` bytes
/// with a marker that says how much was left out.
pub fn from_call_result(result: &Value, max: usize) -> ToolText {
    let mut parts: Vec<String> = Vec::new();
    let mut has_text = false;
    let mut kept: Vec<crate::ToolPart> = Vec::new();
    let mut image_bytes = 0usize;
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        // An image broca renders is kept in parts, within their bound.
        let image = block.get("type").and_then(Value::as_str) == Some("image");
        if let Some((mime, data)) = image
            .then(|| image_of(block))
            .flatten()
            .filter(|(_, d)| image_bytes + d.len() <= IMAGE_BYTES_MAX)
        {
            image_bytes += data.len();
            parts.push(format!("[image {mime}, {} bytes]", data.len()));
            kept.push(crate::ToolPart::Image { mime, data });
            continue;
        }
        let (text, is_text) = block_text(block);
        has_text |= is_text;
        kept.push(crate::ToolPart::Text(text.clone()));
        parts.push(text);
    }
    debug_assert!(
        image_bytes <= IMAGE_BYTES_MAX,
        "images kept within their bound"
    );
    if !has_text {
        if let Some(structured) = result.get("structuredContent") {
            parts.push(structured.to_string());
        }
    }
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let text = parts.join("\n");
    // In parts only when it kept an image and its text needs no cut.
    let in_parts = image_bytes > 0 && text.len() <= max;
    if in_parts && !has_text {
        if let Some(structured) = result.get("structuredContent") {
            kept.push(crate::ToolPart::Text(structured.to_string()));
        }
    }
    debug_assert!(
        !in_parts
            || kept
                .iter()
                .any(|p| matches!(p, crate::ToolPart::Image { .. })),
        "an answer is kept in parts only for the images it holds"
    );
    ToolText {
        content: truncate(text, max),
        is_error,
        parts: in_parts.then_some(kept),
    }
}

/// A content block as text, and whether it carried text of its own (a text block, an
/// embedded text resource); images, audio, links and binary resources are a bracketed note,
/// their bytes left out.
fn block_text(block: &Value) -> (String, bool) {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let text = match kind {
        "text" => {
            let text = block.get("text").and_then(Value::as_str).unwrap_or("");
            return (text.to_string(), true);
        }
        "image" | "audio" => {
            let mime = block
                .get("mimeType")
                .and_then(Value::as_str)
                .unwrap_or("unknown type");
            let bytes = block
                .get("data")
                .and_then(Value::as_str)
                .map_or(0, |d| d.len() / 4 * 3);
            format!("[{kind} {mime}, about {bytes} bytes, not included]")
        }
        "resource_link" => {
            let uri = block.get("uri").and_then(Value::as_str).unwrap_or("");
            format!("[resource link: {uri}]")
        }
        "resource" => {
            let res = block.get("resource").unwrap_or(&Value::Null);
            let uri = res.get("uri").and_then(Value::as_str).unwrap_or("");
            match res.get("text").and_then(Value::as_str) {
                Some(t) => return (format!("[resource {uri}]\n{t}"), true),
                None => format!("[resource {uri}: binary, not included]"),
            }
        }
        other => format!("[{other} content, not included]"),
    };
    (text, false)
}

/// Cuts `text` to at most `max` bytes (at a character boundary), ending with a marker that
/// names how many bytes were left out.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    // The marker names two numbers no longer than `total`: reserve room for both.
    let digits = total.to_string().len();
    let reserve = MARKER_FIXED_BYTES + 2 * digits;
    let mut end = max.saturating_sub(reserve);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    assert!(end < total, "a result is cut only when over its limit");
    text.push_str(&format!(
        "\n[broca: result truncated: {} of {total} bytes left out]",
        total - end
    ));
    assert!(
        max < reserve || text.len() <= max,
        "a cut result fits its limit"
    );
    text
}

/// The marker's bytes besides its two numbers.
const MARKER_FIXED_BYTES: usize = "\n[broca: result truncated:  of  bytes left out]".len();

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_become_text_in_order() {
        let r = json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "mimeType": "image/tiff", "data": "AAAA"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}},
            {"type": "resource_link", "uri": "file:///b"}
        ]});
        let t = from_call_result(&r, 1000);
        assert_eq!(
            t.content,
            "one\n[image image/tiff, about 3 bytes, not included]\n[resource file:///a]\nbody\n[resource link: file:///b]"
        );
        assert!(!t.is_error);
        assert_eq!(t.parts, None, "no image broca keeps");
    }

    #[test]
    fn an_image_broca_renders_is_kept_in_parts_in_order() {
        let r = json!({"content": [
            {"type": "text", "text": "before"},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw=="},
            {"type": "text", "text": "after"}
        ]});
        let t = from_call_result(&r, 1000);
        assert_eq!(
            t.parts,
            Some(vec![
                crate::ToolPart::Text("before".into()),
                crate::ToolPart::Image {
                    mime: "image/png".into(),
                    data: b"\x89PNG".to_vec()
                },
                crate::ToolPart::Text("after".into()),
            ])
        );
        // Data that does not decode is a note, as before.
        let bad = json!({"content": [{"type": "image", "mimeType": "image/png", "data": "%%"}]});
        assert_eq!(from_call_result(&bad, 1000).parts, None);
        // A text over the limit is cut, and the images are notes in it.
        assert_eq!(from_call_result(&r, 8).parts, None);
    }

    #[test]
    fn structured_content_is_used_when_no_block_has_text() {
        let r = json!({"content": [], "structuredContent": {"temperature": 33}});
        assert_eq!(from_call_result(&r, 1000).content, r#"{"temperature":33}"#);
        let r =
            json!({"content": [{"type": "text", "text": "33C"}], "structuredContent": {"t": 33}});
        assert_eq!(from_call_result(&r, 1000).content, "33C");
    }

    #[test]
    fn an_error_result_keeps_its_flag() {
        let r = json!({"content": [{"type": "text", "text": "no such file"}], "isError": true});
        let t = from_call_result(&r, 1000);
        assert!(t.is_error);
        assert_eq!(t.content, "no such file");
    }

    #[test]
    fn long_results_are_cut_with_a_marker_within_the_limit() {
        let long = "é".repeat(1000); // 2,000 bytes
        let t = truncate(long, 200);
        assert!(t.len() <= 200, "{}", t.len());
        assert!(t.ends_with("bytes left out]"), "{t}");
        assert!(t.contains("of 2000 bytes"), "{t}");
        assert_eq!(truncate("short".into(), 200), "short");
    }
}
