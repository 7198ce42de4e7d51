//! The Google Code Assist family (`code-assist/MODEL`): `POST
//! /v1internal:streamGenerateContent?alt=sse` with an OAuth bearer, the Gemini request inside
//! the envelope `{model, project, user_prompt_id, request}`, each answer event
//! `{"response": <GenerateContentResponse>, ...}`. The request and the events inside the
//! envelope are Gemini's: rendered and normalized by the Gemini family's code.
//!
//! The project is the credential's (`project` beside `access_token` in credentials.json),
//! else `GOOGLE_CLOUD_PROJECT`; it is put into the envelope when the request is authorized,
//! so the rendered bytes stay the same for any credential.

use broca_protocol::model::CredentialProblem;
use serde::Deserialize;

use crate::gemini::{google_error, normalize::Normalizer as GeminiNormalizer, render};
use crate::json::JsonWriter;
use crate::{
    size_hint, Aliases, AuthContext, FormatError, Normalized, Rendered, StreamNormalizer,
    WireFamily,
};
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

/// The project a credential bills, or why there is none.
fn project(credential: &crate::credential::Credential) -> Result<String, CredentialProblem> {
    if let crate::credential::Credential::OAuth {
        project: Some(p), ..
    } = credential
    {
        return Ok(p.clone());
    }
    std::env::var("GOOGLE_CLOUD_PROJECT")
        .ok()
        .filter(|p| !p.trim().is_empty())
        .ok_or_else(|| {
            "the code-assist family needs a Google Cloud project: give the credential a \
             `project` (credentials.json) or set GOOGLE_CLOUD_PROJECT"
                .into()
        })
}

/// The id of the user prompt a request serves: the same for every request of one prompt's
/// tool loop (and for its retries), from the prompt's place in the transcript and its text.
fn prompt_id(req: &Request) -> String {
    use broca_protocol::{Block, Role};
    let mut h = blake3::Hasher::new();
    let prompt = req.messages.iter().enumerate().rev().find(|(_, m)| {
        m.role == Role::User && m.content.iter().any(|b| matches!(b, Block::Text { .. }))
    });
    if let Some((i, m)) = prompt {
        h.update(&(i as u64).to_le_bytes());
        h.update(m.text().as_bytes());
    }
    format!("broca-{}", &h.finalize().to_hex()[..16])
}

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::CodeAssist.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        // The Gemini request is written in place.
        let mut w = JsonWriter::with_capacity(size_hint(req) + 128);
        w.object()
            .field_str("model", &req.model)
            .field_str("user_prompt_id", &prompt_id(req))
            .key("request")
            .object();
        render::write_request(&mut w, req, aliases);
        w.end_object().end_object();
        Rendered {
            path: "/v1internal:streamGenerateContent?alt=sse".into(),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("accept".into(), "text/event-stream".into()),
            ],
            body: w.finish(),
        }
    }

    fn takes(&self, credential: &crate::credential::Credential) -> Result<(), CredentialProblem> {
        credential.bearer(self.id())?;
        project(credential).map(|_| ())
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        let token = auth.credential.bearer(self.id())?;
        let project = project(auth.credential)?;
        crate::openai_chat::bearer(rendered, token);
        // `{"model":...` becomes `{"project":"P","model":...`.
        let mut field = JsonWriter::with_capacity(project.len() + 16);
        field.object().field_str("project", &project).end_object();
        let field = field.finish();
        let mut body = Vec::with_capacity(rendered.body.len() + field.len());
        body.extend_from_slice(&field[..field.len() - 1]);
        body.push(b',');
        body.extend_from_slice(&rendered.body[1..]);
        rendered.body = body;
        Ok(())
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(Unwrap(GeminiNormalizer::new(aliases)))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        Some(google_error(body)?.classify())
    }

    fn retry_after_body(&self, body: &[u8]) -> Option<u64> {
        google_error(body)?.retry_delay_ms()
    }
}

/// Takes the Gemini response out of each event's envelope.
struct Unwrap(GeminiNormalizer);

impl StreamNormalizer for Unwrap {
    fn push(&mut self, event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        #[derive(Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow, default)]
            response: Option<&'a serde_json::value::RawValue>,
            #[serde(borrow, default)]
            error: Option<&'a serde_json::value::RawValue>,
        }
        if let Some(inner) = response_of(data) {
            if let Ok(got) = self.0.push(event, inner) {
                return Ok(got);
            }
        }
        let e: Envelope = serde_json::from_str(data)
            .map_err(|e| FormatError(format!("not a Code Assist event: {e}")))?;
        match (e.response, e.error) {
            (Some(r), _) => self.0.push(event, r.get()),
            // An error in the stream, in Google's shape: the Gemini normalizer reads it.
            (None, Some(_)) => self.0.push(event, data),
            (None, None) => Err(FormatError("a Code Assist event without `response`".into())),
        }
    }
}

/// The `response` of the envelope as Code Assist writes it, `{"response": {...},"traceId":
/// "..."}`, cut out by its first and last bytes without a parse of its own; `None` for any
/// other shape. The cut is only a guess until the Gemini normalizer has read it whole: when it
/// refuses the cut, the event is read by the full parse.
fn response_of(data: &str) -> Option<&str> {
    let rest = data
        .strip_prefix(r#"{"response": "#)
        .or_else(|| data.strip_prefix(r#"{"response":"#))?;
    let body = rest.trim_end().strip_suffix("\"}")?;
    let quote = body.rfind('"')?;
    if body[quote + 1..].contains('\\') {
        return None;
    }
    let inner = body[..quote]
        .strip_suffix(r#","traceId": "#)
        .or_else(|| body[..quote].strip_suffix(r#","traceId":"#))?;
    inner.starts_with('{').then_some(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::Credential;
    use broca_protocol::StreamEvent;

    #[test]
    fn the_common_envelope_is_unwrapped_without_a_parse_and_any_other_by_the_full_one() {
        let inner = r#"{"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]}"#;
        for (data, want) in [
            (
                format!(r#"{{"response": {inner},"traceId": "t-1"}}"#),
                Some(inner),
            ),
            (
                format!(r#"{{"response":{inner},"traceId":"t-1"}}"#),
                Some(inner),
            ),
            (format!(r#"{{"traceId": "t", "response": {inner}}}"#), None),
            (
                format!(r#"{{"response": {inner},"traceId": "t\"x"}}"#),
                None,
            ),
            (format!(r#"{{"response": {inner}}}"#), None),
            (r#"{"error": {"code": 429}}"#.to_string(), None),
            (r#"{"response": [1],"traceId": "t"}"#.to_string(), None),
        ] {
            assert_eq!(response_of(&data), want, "{data}");
        }
        // Every shape through the normalizer reads as the full parse reads it: the same
        // events, or the same refusal.
        let text = || Normalized::Events(vec![StreamEvent::TextDelta("Hi".into())]);
        for (data, ok) in [
            (format!(r#"{{"response": {inner},"traceId": "t-1"}}"#), true),
            (format!(r#"{{"traceId": "t", "response": {inner}}}"#), true),
            (
                format!(r#"{{"response": {inner},"metadata": {{}},"traceId": "t"}}"#),
                true,
            ),
            (
                format!(r#"{{"response": {inner},"x": 1,"traceId": "t"}}"#),
                true,
            ),
            (
                format!(r#"{{"response": {inner},"x": ,"traceId": "t"}}"#),
                false,
            ),
            (r#"{"traceId": "t"}"#.to_string(), false),
        ] {
            let mut n = Family.normalizer(Aliases::default());
            match n.push(None, &data) {
                Ok(got) => assert!(ok && got == text(), "{data}: {got:?}"),
                Err(e) => assert!(!ok, "{data}: {e:?}"),
            }
        }
    }

    #[test]
    fn the_envelope_wraps_the_gemini_request_and_the_project_is_added_at_authorization() {
        let req = crate::sample_request();
        let aliases = Aliases::for_tools(&req.tools);
        let mut r = Family.render(&req, &aliases);
        assert_eq!(Family.render(&req, &aliases), r, "deterministic");
        assert_eq!(r.path, "/v1internal:streamGenerateContent?alt=sse");
        let cred = Credential::OAuth {
            access_token: "ya29.token".into(),
            project: Some("proj-1".into()),
            account_id: None,
        };
        let url = broca_io::net::Url::parse("https://cloudcode-pa.googleapis.com").unwrap();
        Family
            .authorize(
                &mut r,
                &AuthContext {
                    credential: &cred,
                    url: &url,
                    now_unix_secs: 0,
                },
            )
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["project"], "proj-1");
        assert_eq!(body["model"], "m-1");
        assert!(body["user_prompt_id"]
            .as_str()
            .unwrap()
            .starts_with("broca-"));
        let inner: serde_json::Value =
            serde_json::from_slice(&render::body(&req, &aliases)).unwrap();
        assert_eq!(body["request"], inner);
        assert!(r
            .headers
            .iter()
            .any(|(n, v)| n == "authorization" && v == "Bearer ya29.token"));
        assert!(Family.takes(&cred).is_ok());
        let aws = Credential::Aws(crate::credential::AwsCredential {
            access_key_id: "AKIA".into(),
            secret_access_key: "s".into(),
            session_token: None,
            region: None,
        });
        assert!(Family.takes(&aws).unwrap_err().message.contains("OAuth"));
    }

    #[test]
    fn a_recorded_stream_in_its_envelope_normalizes_as_gemini_at_every_split() {
        let wrapped: String = crate::gemini::tests::STREAM
            .split("\r\n\r\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let data = e.strip_prefix("data: ").unwrap();
                format!("data: {{\"response\": {data}, \"traceId\": \"t-1\"}}\r\n\r\n")
            })
            .collect();
        crate::assert_every_split(
            &Family,
            &Aliases::default(),
            wrapped.as_bytes(),
            &crate::gemini::tests::stream_events(),
        );
    }

    #[test]
    fn events_are_unwrapped_from_their_envelope() {
        let mut n = Family.normalizer(Aliases::default());
        let got = n
            .push(
                None,
                r#"{"response":{"candidates":[{"content":{"parts":[{"text":"Hi"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1}},"traceId":"t"}"#,
            )
            .unwrap();
        match got {
            Normalized::Events(e) => assert_eq!(e[0], StreamEvent::TextDelta("Hi".into())),
            other => panic!("{other:?}"),
        }
        assert!(n.push(None, r#"{"traceId":"t"}"#).is_err());
    }
}
