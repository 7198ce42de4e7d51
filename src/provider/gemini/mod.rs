//! The Gemini family: `POST /v1beta/models/{model}:streamGenerateContent?alt=sse` with the
//! key in `x-goog-api-key`, answered as server-sent events of whole JSON objects. The renderer
//! and normalizer are shared with Code Assist, which wraps the same request in its envelope.

pub mod normalize;
pub mod render;

use broca_protocol::model::CredentialProblem;
use serde::Deserialize;

use crate::{Aliases, AuthContext, Rendered, StreamNormalizer, WireFamily};
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::Gemini.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        Rendered {
            path: format!(
                "/v1beta/models/{}:streamGenerateContent?alt=sse",
                path_segment(&req.model)
            ),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("accept".into(), "text/event-stream".into()),
            ],
            body: render::body(req, aliases),
        }
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        let key = auth.credential.api_key(self.id())?;
        rendered.headers.push(("x-goog-api-key".into(), key.into()));
        Ok(())
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(normalize::Normalizer::new(aliases))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        Some(google_error(body)?.classify())
    }

    fn retry_after_body(&self, body: &[u8]) -> Option<u64> {
        google_error(body)?.retry_delay_ms()
    }
}

/// A model name as one path segment (anything but unreserved characters escaped).
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Google API error: `{"error": {"code", "message", "status", "details"}}`.
#[derive(Debug, Deserialize)]
pub(crate) struct GoogleError {
    /// A number from Google; other APIs behind the same route say a string.
    #[serde(default)]
    code: Option<serde_json::Value>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    details: Vec<serde_json::Value>,
}

pub(crate) fn google_error(body: &[u8]) -> Option<GoogleError> {
    #[derive(Deserialize)]
    struct Outer {
        error: GoogleError,
    }
    // Code Assist and some proxies answer an array of one error (serde would read a struct
    // from an array too, by position: look first).
    if body.trim_ascii_start().first() != Some(&b'[') {
        return serde_json::from_slice::<Outer>(body).ok().map(|o| o.error);
    }
    serde_json::from_slice::<Vec<Outer>>(body)
        .ok()?
        .into_iter()
        .next()
        .map(|o| o.error)
}

impl GoogleError {
    /// The class and what to say: RESOURCE_EXHAUSTED and UNAVAILABLE are transient, an input
    /// too long overflows the context, a key that is not valid (or permission denied) needs
    /// credentials; other client errors are permanent.
    pub(crate) fn classify(&self) -> (ErrorClass, String) {
        let status = self.status.as_deref().unwrap_or("");
        let m = self.message.to_ascii_lowercase();
        let reason = |r: &str| {
            self.details
                .iter()
                .any(|d| d.get("reason").and_then(|v| v.as_str()) == Some(r))
        };
        let class = match status {
            "RESOURCE_EXHAUSTED" | "UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED" | "ABORTED" => {
                ErrorClass::Transient
            }
            "UNAUTHENTICATED" | "PERMISSION_DENIED" => ErrorClass::AuthRequired,
            _ if reason("API_KEY_INVALID") || m.contains("api key not valid") => {
                ErrorClass::AuthRequired
            }
            _ if m.contains("input token count")
                || m.contains("exceeds the maximum number of tokens")
                || m.contains("too many tokens") =>
            {
                ErrorClass::ContextOverflow
            }
            _ => match self.code.as_ref().and_then(serde_json::Value::as_u64) {
                Some(429 | 500..=599) => ErrorClass::Transient,
                Some(401 | 403) => ErrorClass::AuthRequired,
                _ => ErrorClass::Permanent,
            },
        };
        let label = if status.is_empty() { "error" } else { status };
        (class, format!("{label}: {}", self.message))
    }

    /// The delay a `google.rpc.RetryInfo` detail asks for (`"12s"`, `"0.5s"`).
    pub(crate) fn retry_delay_ms(&self) -> Option<u64> {
        self.details.iter().find_map(|d| {
            let t = d.get("@type")?.as_str()?;
            if !t.ends_with("google.rpc.RetryInfo") {
                return None;
            }
            let s = d.get("retryDelay")?.as_str()?.strip_suffix('s')?;
            let secs: f64 = s.trim().parse().ok()?;
            (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).ceil() as u64)
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_status_reason_and_message() {
        let cases = [
            (
                r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"31s"}]}}"#,
                ErrorClass::Transient,
                Some(31_000),
            ),
            (
                r#"{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
                ErrorClass::ContextOverflow,
                None,
            ),
            (
                r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID"}]}}"#,
                ErrorClass::AuthRequired,
                None,
            ),
            (
                r#"[{"error":{"code":403,"message":"denied","status":"PERMISSION_DENIED"}}]"#,
                ErrorClass::AuthRequired,
                None,
            ),
            (
                r#"{"error":{"code":400,"message":"Invalid JSON payload","status":"INVALID_ARGUMENT"}}"#,
                ErrorClass::Permanent,
                None,
            ),
        ];
        for (body, class, delay) in cases {
            let e = google_error(body.as_bytes()).unwrap();
            assert_eq!(e.classify().0, class, "{body}");
            assert_eq!(e.retry_delay_ms(), delay, "{body}");
        }
        assert!(google_error(b"<html>").is_none());
    }

    /// A recorded-shape stream (CRLF-framed, as the API sends it): a thought with its
    /// signature, text, a call with a signature and no id; the same events at every split.
    pub(crate) const STREAM: &str = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Planning\",\"thought\": true,\"thoughtSignature\": \"c2lnLTE=\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 30,\"totalTokenCount\": 30},\"modelVersion\": \"gemini-2.5-flash\",\"responseId\": \"r-1\"}\r\n\r\ndata: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Caf\\u00e9 \u{1F600}\"}],\"role\": \"model\"},\"index\": 0}],\"responseId\": \"r-1\"}\r\n\r\ndata: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"ls\",\"args\": {\"path\": \"/tmp\"}},\"thoughtSignature\": \"c2lnLTI=\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 30,\"candidatesTokenCount\": 9,\"totalTokenCount\": 51,\"thoughtsTokenCount\": 12},\"responseId\": \"r-1\"}\r\n\r\n";

    pub(crate) fn stream_events() -> Vec<broca_protocol::StreamEvent> {
        use broca_protocol::{FinishReason, StreamEvent, Usage};
        vec![
            StreamEvent::ThinkingDelta("Planning".into()),
            StreamEvent::ThinkingSignature("c2lnLTE=".into()),
            StreamEvent::TextDelta("Caf\u{e9} \u{1F600}".into()),
            StreamEvent::PartSignature("c2lnLTI=".into()),
            StreamEvent::ToolCallStart {
                index: 0,
                id: "gemini-call-2-0".into(),
                name: "ls".into(),
            },
            StreamEvent::ToolCallArgsDelta {
                index: 0,
                json: r#"{"path": "/tmp"}"#.into(),
            },
            StreamEvent::ToolCallEnd { index: 0 },
            StreamEvent::Usage(Usage {
                input: Some(30),
                output: Some(21),
                cache_read: None,
                cache_write: None,
                reasoning: Some(12),
            }),
            StreamEvent::Finish {
                reason: FinishReason::ToolUse,
                request_id: Some("r-1".into()),
            },
        ]
    }

    #[test]
    fn a_recorded_stream_normalizes_the_same_at_every_split() {
        crate::assert_every_split(
            &Family,
            &Aliases::default(),
            STREAM.as_bytes(),
            &stream_events(),
        );
    }

    #[test]
    fn the_path_names_the_model_as_one_segment() {
        let mut req = crate::sample_request();
        req.model = "gemini-2.5-pro".into();
        let r = Family.render(&req, &Aliases::default());
        assert_eq!(
            r.path,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}
