//! Media in reads (llm-runner/v1 §4.2 and §9.12): a stored message served in the read's
//! `media` mode. Inline (the default) turns each media block into the role's text marker, so
//! a reader sees only the shapes it knew; `blocks` serves the message as stored; descriptors
//! replace media, and any payload over the role's inline threshold, by their references.
//! Blocks and descriptors carry the stored message's digest and one digest per stored part
//! (its key its index), computed before any rendering.

use broca_protocol::media::Media;
use cortexkit_role_llm_runner::content_digest::content_digest;
use cortexkit_role_llm_runner::read::descriptors::{
    describe, PartDigest, Payload, Reference, DESCRIPTOR_MESSAGE_MAX,
};
use cortexkit_role_llm_runner::read::MediaMode;
use serde_json::{json, Value};

/// The `media_ref` of a media block (`part`: its key when it stands for a stored part).
pub fn media_ref(m: &Media, part: Option<String>) -> Reference {
    let mut v = json!({"type": "media_ref", "kind": m.kind, "mime": m.mime,
        "byte_size": m.bytes, "sha256": m.sha256});
    if let Some(part) = part {
        v["part"] = part.into();
    }
    serde_json::from_value(v).unwrap_or_else(|_| {
        // A stored digest that is not lowercase hex (a damaged record): described by what
        // its text hashes to, never a panic.
        Reference::text(None, &m.sha256)
    })
}

/// The stored message's parts: its `content` array's blocks, keyed by index; a message
/// whose content is not an array (a tool result) is one part, key `0`.
fn parts(message: &Value) -> Vec<(String, &Value)> {
    match message.get("content").and_then(Value::as_array) {
        Some(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(i, b)| (i.to_string(), b))
            .collect(),
        None => vec![("0".to_string(), message)],
    }
}

/// A stored message's part keys, in order.
pub fn part_keys(message: &Value) -> Vec<String> {
    parts(message).into_iter().map(|(key, _)| key).collect()
}

/// A stored message's digest and its parts' digests.
pub fn digests(message: &Value) -> (String, Vec<PartDigest>) {
    let rows = parts(message)
        .into_iter()
        .map(|(key, part)| PartDigest::new(key, part))
        .collect();
    (content_digest(message), rows)
}

/// The media block a stored block is (`{"media": {...}}`).
fn media_of(block: &Value) -> Option<Media> {
    serde_json::from_value(block.get("media")?.clone()).ok()
}

/// The medium a part of a stored tool result in parts is (`{"type": "media", ...}`).
fn result_media_of(part: &Value) -> Option<Media> {
    if part.get("type").and_then(Value::as_str) != Some("media") {
        return None;
    }
    serde_json::from_value(part.clone()).ok()
}

/// Whether `message` is a stored tool result in parts.
fn result_in_parts(message: &Value) -> bool {
    message.get("role").and_then(Value::as_str) == Some("tool")
        && message.get("content").is_some_and(Value::is_array)
}

/// `message` (as stored) with each media block turned into its marker (`reason`); a tool
/// result in parts becomes the text it always had: its parts in order, each medium as its
/// marker, joined by newlines.
pub fn with_markers(mut message: Value, reason: &str) -> Value {
    if result_in_parts(&message) {
        let parts = message["content"].as_array().cloned().unwrap_or_default();
        let texts: Vec<String> = parts
            .iter()
            .map(|p| match result_media_of(p) {
                Some(m) => broca_protocol::media::marker(&m, reason),
                None => p
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            })
            .collect();
        message["content"] =
            cortexkit_role_llm_runner::attachments::join_tool_result(&texts).into();
        return message;
    }
    if let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) {
        for b in blocks.iter_mut() {
            if let Some(m) = media_of(b) {
                *b = json!({"text": {"text": broca_protocol::media::marker(&m, reason)}});
            }
        }
    }
    message
}

/// The payloads of a stored message a descriptors read may replace by reference: media
/// always, large text, arguments, reasoning and results past the role's threshold (or, when
/// the message would not fit its budget, the largest first).
fn payloads(message: &Value) -> Vec<Payload> {
    let mut out = Vec::new();
    if result_in_parts(message) {
        // A tool result's media are nested in it: described without a part key of their own.
        for (i, p) in message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(m) = result_media_of(p) {
                out.push(Payload {
                    pointer: format!("/content/{i}"),
                    reference: media_ref(&m, None),
                    required: true,
                });
            } else if let Some(text) = p.get("text").and_then(Value::as_str) {
                out.push(Payload {
                    pointer: format!("/content/{i}/text"),
                    reference: Reference::text(None, text),
                    required: false,
                });
            }
        }
        return out;
    }
    let Some(blocks) = message.get("content").and_then(Value::as_array) else {
        if let Some(text) = message.get("content").and_then(Value::as_str) {
            out.push(Payload {
                pointer: "/content".into(),
                reference: Reference::text(None, text),
                required: false,
            });
        }
        return out;
    };
    for (i, b) in blocks.iter().enumerate() {
        let key = i.to_string();
        if let Some(m) = media_of(b) {
            out.push(Payload {
                pointer: format!("/content/{i}"),
                reference: media_ref(&m, Some(key)),
                required: true,
            });
        } else if let Some(text) = b.pointer("/text/text").and_then(Value::as_str) {
            out.push(Payload {
                pointer: format!("/content/{i}/text/text"),
                reference: Reference::text(None, text),
                required: false,
            });
        } else if let Some(text) = b.pointer("/thinking/text").and_then(Value::as_str) {
            out.push(Payload {
                pointer: format!("/content/{i}/thinking/text"),
                reference: Reference::reasoning(None, text.as_bytes()),
                required: false,
            });
        } else if let Some(input) = b.pointer("/tool_use/input") {
            let name = b.pointer("/tool_use/name").and_then(Value::as_str);
            let bytes = serde_json::to_vec(input).unwrap_or_default();
            out.push(Payload {
                pointer: format!("/content/{i}/tool_use/input"),
                reference: Reference::arguments(None, name.unwrap_or(""), &bytes),
                required: false,
            });
        } else if let Some(text) = b.pointer("/tool_result/content").and_then(Value::as_str) {
            out.push(Payload {
                pointer: format!("/content/{i}/tool_result/content"),
                reference: Reference::text(None, text),
                required: false,
            });
        }
    }
    out
}

/// A descriptors read that cannot describe a message within the role's budget (the role's
/// reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget(pub String);

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OverBudget {}

/// A message as a read serves it, and the digests it carries (the message's, then its parts').
pub type Rendered = (Value, Option<(String, Vec<PartDigest>)>);

/// A read entry's message in `mode`, and the digests it carries (blocks and descriptors);
/// `envelope` is the size of the entry around it. `Err` names why a descriptors read cannot
/// describe it within the role's budget.
pub fn render(stored: Value, mode: MediaMode, envelope: usize) -> Result<Rendered, OverBudget> {
    match mode {
        MediaMode::Blocks => {
            let d = digests(&stored);
            Ok((stored, Some(d)))
        }
        MediaMode::Descriptors => {
            let d = digests(&stored);
            let budget = DESCRIPTOR_MESSAGE_MAX.saturating_sub(envelope);
            let described = describe(&stored, &payloads(&stored), budget).map_err(OverBudget)?;
            Ok((described, Some(d)))
        }
        _ => Ok((with_markers(stored, "not_requested"), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> Media {
        Media {
            kind: "image".into(),
            mime: "image/png".into(),
            bytes: 68,
            sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
        }
    }

    fn stored() -> Value {
        let m = broca_protocol::Message {
            role: broca_protocol::Role::User,
            content: broca_protocol::user_blocks("look", &[image()]),
        };
        serde_json::to_value(&m).unwrap()
    }

    #[test]
    fn each_mode_renders_media_its_way_and_digests_the_stored_message() {
        let (inline, none) = render(stored(), MediaMode::Inline, 100).unwrap();
        assert!(none.is_none());
        assert_eq!(
            inline["content"][1]["text"]["text"],
            "[media not shown: kind=image mime=image/png bytes=68 sha256=ba7816bf8f01 \
             reason=not_requested]"
        );
        assert!(!inline.to_string().contains(&image().sha256));
        let (blocks, d) = render(stored(), MediaMode::Blocks, 100).unwrap();
        assert_eq!(blocks, stored());
        let (digest, rows) = d.unwrap();
        assert_eq!(digest, content_digest(&stored()));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].part, "1");
        let (described, d2) = render(stored(), MediaMode::Descriptors, 100).unwrap();
        assert_eq!(described["content"][1]["type"], "media_ref");
        assert_eq!(described["content"][1]["part"], "1");
        assert_eq!(described["content"][1]["sha256"], image().sha256.as_str());
        assert_eq!(described["content"][0], stored()["content"][0]);
        assert_eq!(d2.unwrap().0, digest);
    }

    #[test]
    fn a_tool_result_in_parts_reads_as_the_roles_vector_says() {
        let v: Value = serde_json::from_str(
            cortexkit_role_llm_runner::vectors::file("attachments.json").unwrap(),
        )
        .unwrap();
        let case = &v["multipart_tool_result"];
        // The vector's stored result, as broca stores one (its `role` for the entry).
        let mut stored = case["stored"].clone();
        stored["role"] = "tool".into();
        let parts: Vec<broca_wal::runrec::ResultPart> =
            serde_json::from_value(stored["content"].clone()).unwrap();
        assert_eq!(serde_json::to_value(&parts).unwrap(), stored["content"]);
        let (inline, _) = render(stored.clone(), MediaMode::Inline, 100).unwrap();
        assert_eq!(inline["content"], case["inline"]["content"]);
        let (described, _) = render(stored, MediaMode::Descriptors, 100).unwrap();
        assert_eq!(described["content"][1]["type"], "media_ref");
        assert!(
            described["content"][1].get("part").is_none(),
            "nested: no key"
        );
    }

    #[test]
    fn a_large_text_is_described_by_reference() {
        let m = broca_protocol::Message::user_text("x".repeat(300_000));
        let (described, _) = render(
            serde_json::to_value(&m).unwrap(),
            MediaMode::Descriptors,
            100,
        )
        .unwrap();
        assert_eq!(described["content"][0]["text"]["text"]["type"], "text_ref");
        assert_eq!(
            described["content"][0]["text"]["text"]["byte_size"],
            300_000
        );
    }
}
