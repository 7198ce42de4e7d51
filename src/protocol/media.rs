//! Media a user attached to a send (llm-runner/v1 `attachments`): an image or a document
//! whose bytes live in the session's content store, named by their SHA-256. A message holds
//! the reference ([`Media`]); a request carries the bytes of the media its model takes
//! ([`MediaBytes`]), loaded by the session just before the model is called. What each wire
//! family can render is this module's table: admission, `session.head.input` and the
//! renderers read the same one.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A media block: what a stored message holds of an attachment. `bytes` and `sha256` are
/// over the decoded bytes; `kind` is `image` or `document`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Media {
    pub kind: String,
    pub mime: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The two kinds of media broca carries.
pub mod kind {
    pub const IMAGE: &str = "image";
    pub const DOCUMENT: &str = "document";
}

/// The media types broca knows how to carry, with their kind and the catalog modality that
/// states a model takes them (`image`, `pdf`).
const KNOWN: &[(&str, &str, &str)] = &[
    ("image/png", kind::IMAGE, "image"),
    ("image/jpeg", kind::IMAGE, "image"),
    ("image/gif", kind::IMAGE, "image"),
    ("image/webp", kind::IMAGE, "image"),
    ("application/pdf", kind::DOCUMENT, "pdf"),
];

/// The kind of a media type broca carries (`None`: a type no family of broca's renders).
pub fn kind_of(mime: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(m, _, _)| *m == mime)
        .map(|(_, k, _)| *k)
}

/// The catalog modality (`capability.input_modalities`) that covers `mime`.
pub fn modality_of(mime: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .find(|(m, _, _)| *m == mime)
        .map(|(_, _, x)| *x)
}

/// The media types a wire family renders, in the order `session.head.input` lists them.
/// The demo model takes none.
/// A family this build does not speak takes none.
pub fn family_mimes(family: &str) -> &'static [&'static str] {
    crate::family::Family::parse(family).map_or(&[], crate::family::Family::mimes)
}

/// What a route's catalog entry and family say of the media a model takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputFacts {
    /// The catalog's `capability.input_modalities` (`None`: not stated).
    pub modalities: Option<Vec<String>>,
    /// The catalog's `capability.input_mime_types` (`None`: not stated).
    pub mime_types: Option<Vec<String>>,
}

impl InputFacts {
    /// Whether a model of `family` with these facts takes `mime`: the family must render it,
    /// and what the catalog states must not leave it out. An unknown fact is no refusal.
    pub fn takes(&self, family: &str, mime: &str) -> bool {
        family_mimes(family).contains(&mime)
            && self
                .modalities
                .as_ref()
                .is_none_or(|m| modality_of(mime).is_some_and(|x| m.iter().any(|s| s == x)))
            && self
                .mime_types
                .as_ref()
                .is_none_or(|t| t.iter().any(|s| s == mime))
    }

    /// The media types a model of `family` with these facts takes.
    pub fn mimes(&self, family: &str) -> Vec<String> {
        family_mimes(family)
            .iter()
            .filter(|m| self.takes(family, m))
            .map(|m| m.to_string())
            .collect()
    }
}

/// The bytes of the media a request's model takes, by SHA-256 (shared, never copied per
/// request). A media block whose bytes are absent is rendered as a text marker
/// (`attachments::marker`, reason `unsupported`).
#[derive(Clone, Default, PartialEq)]
pub struct MediaBytes(pub Arc<BTreeMap<String, Arc<[u8]>>>);

impl MediaBytes {
    pub fn get(&self, sha256: &str) -> Option<&[u8]> {
        self.0.get(sha256).map(|b| &b[..])
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for MediaBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, v.len())))
            .finish()
    }
}

/// The text a model that cannot take `m` is given in its place, and a default read shows:
/// llm-runner/v1's marker grammar (§9.12).
pub fn marker(m: &Media, reason: &str) -> String {
    let prefix: String = m.sha256.chars().take(12).collect();
    format!(
        "[media not shown: kind={} mime={} bytes={} sha256={prefix} reason={reason}]",
        m.kind, m.mime, m.bytes
    )
}

/// Standard base64 of `bytes` (what every family's JSON carries).
pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    debug_assert_eq!(
        out.len(),
        bytes.len().div_ceil(3) * 4,
        "four characters per three bytes"
    );
    out
}

/// What a media block counts for against a context limit, in bytes of text (four to a
/// token): an image as about 1,600 tokens, a document as an eighth of its size.
pub fn approx_bytes(m: &Media) -> usize {
    match m.kind.as_str() {
        kind::IMAGE => 6_400,
        _ => usize::try_from(m.bytes / 8).unwrap_or(usize::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn a_stated_fact_narrows_what_the_family_renders() {
        let unknown = InputFacts::default();
        assert!(unknown.takes("anthropic-messages", "image/gif"));
        assert!(!unknown.takes("gemini", "image/gif"));
        assert!(!unknown.takes("demo", "image/png"));
        assert!(!unknown.takes("anthropic-messages", "image/tiff"));
        let text_only = InputFacts {
            modalities: Some(vec!["text".into()]),
            mime_types: None,
        };
        assert!(!text_only.takes("anthropic-messages", "image/png"));
        let png_pdf = InputFacts {
            modalities: Some(vec!["text".into(), "image".into(), "pdf".into()]),
            mime_types: Some(vec!["image/png".into(), "application/pdf".into()]),
        };
        assert_eq!(
            png_pdf.mimes("anthropic-messages"),
            ["image/png", "application/pdf"]
        );
    }

    #[test]
    fn the_marker_is_the_roles_grammar() {
        let m = Media {
            kind: "image".into(),
            mime: "image/png".into(),
            bytes: 3,
            sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
        };
        assert_eq!(
            marker(&m, "not_requested"),
            "[media not shown: kind=image mime=image/png bytes=3 sha256=ba7816bf8f01 \
             reason=not_requested]"
        );
    }
}
