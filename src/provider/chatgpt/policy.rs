//! The ChatGPT backend's policy (the cortexkit-chatgpt-policy role):
//!
//! - **Headers sent**: `Authorization: Bearer <access token>`, `chatgpt-account-id: <account>`
//!   (the account the token belongs to: `account_id` beside `access_token` in
//!   credentials.json, else `CHATGPT_ACCOUNT_ID`), `OpenAI-Beta: responses=experimental`,
//!   `originator: broca`. Nothing else of the caller's goes.
//! - **Usage limits**: an answer whose error is `usage_limit_reached` is transient, its wait
//!   the `resets_in_seconds` it gives (else `resets_at`); `usage_not_included` (the plan does
//!   not include this use) needs other credentials. Other errors are classified as the
//!   Responses family's.
//! - **Refusals**: `response.refusal.delta` text is kept as the answer's text, and a turn that
//!   refused ends with the finish reason `refusal` rather than `end_turn`.
//! - **Quota**: the `x-codex-{primary,secondary}-{used-percent,window-minutes,
//!   reset-after-seconds}` headers of a 2xx answer (over a WebSocket, of the upgrade's 101
//!   reply) become the step's quota (recorded with the step in the WAL; `run.status` and
//!   `run.result` show the latest as `quota`).

use broca_protocol::model::CredentialProblem;
use serde::Deserialize;

use crate::credential::Credential;
use crate::{FormatError, Normalized, StreamNormalizer};
use broca_protocol::{ClassifiedError, ErrorClass, FinishReason, Quota, QuotaWindow, StreamEvent};

/// The bearer token and the account id a credential gives, or what is missing.
pub fn account<'a>(
    credential: &'a Credential,
    family: &str,
) -> Result<(&'a str, String), CredentialProblem> {
    let token = credential.bearer(family)?;
    let from_credential = match credential {
        Credential::OAuth { account_id, .. } => account_id.clone(),
        _ => None,
    };
    let account = from_credential
        .or_else(|| std::env::var("CHATGPT_ACCOUNT_ID").ok())
        .filter(|a| !a.trim().is_empty())
        .ok_or_else(|| {
            "the chatgpt family needs the account id of the token: give the credential an \
             `account_id` (credentials.json) or set CHATGPT_ACCOUNT_ID"
                .to_string()
        })?;
    Ok((token, account))
}

/// The headers a request carries.
pub fn headers(token: &str, account: &str) -> Vec<(String, String)> {
    vec![
        ("authorization".into(), format!("Bearer {token}")),
        ("chatgpt-account-id".into(), account.to_string()),
        ("openai-beta".into(), "responses=experimental".into()),
        ("originator".into(), "broca".into()),
    ]
}

#[derive(Deserialize)]
struct Outer {
    #[serde(default)]
    error: Option<Inner>,
}

#[derive(Deserialize)]
struct Inner {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    resets_in_seconds: Option<u64>,
    #[serde(default)]
    resets_at: Option<u64>,
    #[serde(default)]
    plan_type: Option<String>,
}

fn inner(body: &[u8]) -> Option<Inner> {
    serde_json::from_slice::<Outer>(body).ok()?.error
}

/// The class of an error answer.
pub fn classify_body(status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
    let e = inner(body)?;
    let kind = e.kind.clone().or(e.code.clone()).unwrap_or_default();
    let plan = e
        .plan_type
        .as_deref()
        .map(|p| format!(" (plan {p})"))
        .unwrap_or_default();
    let message = e.message.clone().unwrap_or_default();
    match kind.as_str() {
        "usage_limit_reached" => Some((
            ErrorClass::Transient,
            format!("usage_limit_reached{plan}: {message}"),
        )),
        "usage_not_included" => Some((
            ErrorClass::AuthRequired,
            format!("usage_not_included{plan}: {message}"),
        )),
        _ => {
            let _ = status;
            crate::openai_chat::classify_openai_body(body)
        }
    }
}

/// How long a usage limit lasts, in milliseconds.
pub fn usage_limit_reset_ms(body: &[u8]) -> Option<u64> {
    let e = inner(body)?;
    if e.kind.as_deref().or(e.code.as_deref()) != Some("usage_limit_reached") {
        return None;
    }
    let secs = e.resets_in_seconds.or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs();
        e.resets_at.map(|at| at.saturating_sub(now))
    })?;
    Some(secs.saturating_mul(1000))
}

/// The quota the answer's headers report.
pub fn quota(header: &dyn Fn(&str) -> Option<String>) -> Option<Quota> {
    let mut windows = Vec::new();
    for name in ["primary", "secondary"] {
        let get = |what: &str| header(&format!("x-codex-{name}-{what}"));
        let used = get("used-percent")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|p| p.is_finite() && *p >= 0.0)
            .map(|p| (p * 100.0).round().min(u32::MAX as f64) as u32);
        let window = get("window-minutes").and_then(|v| v.trim().parse().ok());
        let resets = get("reset-after-seconds").and_then(|v| v.trim().parse().ok());
        if used.is_some() || window.is_some() || resets.is_some() {
            windows.push(QuotaWindow {
                name: name.into(),
                used_basis_points: used,
                window_minutes: window,
                resets_in_seconds: resets,
            });
        }
    }
    (!windows.is_empty()).then_some(Quota { windows })
}

/// The Responses normalizer, with refusals kept as text and the turn ending `refusal`.
pub struct Refusals {
    inner: Box<dyn StreamNormalizer>,
    refused: bool,
}

impl Refusals {
    pub fn new(inner: Box<dyn StreamNormalizer>) -> Refusals {
        Refusals {
            inner,
            refused: false,
        }
    }
}

impl StreamNormalizer for Refusals {
    fn push(&mut self, event: Option<&str>, data: &str) -> Result<Normalized, FormatError> {
        #[derive(Deserialize)]
        struct Refusal {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            delta: String,
        }
        // The event's type when it comes first (as the backend writes it): most events are
        // neither of the two this policy reads, and pass through on that alone.
        let first = first_type(data);
        let may_be = |kind: &str| match first {
            Some(t) => t == kind,
            None => appears(data, kind),
        };
        // A usage limit in the stream (how the backend answers over a WebSocket): classified
        // as the same answer over HTTP is.
        if event == Some("error") || may_be("error") {
            let limit = inner(data.as_bytes()).and_then(|e| e.kind.or(e.code));
            if let Some("usage_limit_reached" | "usage_not_included") = limit.as_deref() {
                if let Some((class, message)) = classify_body(0, data.as_bytes()) {
                    return Ok(Normalized::Error(ClassifiedError {
                        class,
                        message,
                        retry_after_ms: usage_limit_reset_ms(data.as_bytes()),
                    }));
                }
            }
        }
        if event == Some("response.refusal.delta") || may_be("response.refusal.delta") {
            if let Ok(r) = serde_json::from_str::<Refusal>(data) {
                if r.kind == "response.refusal.delta" {
                    self.refused = true;
                    let events = if r.delta.is_empty() {
                        Vec::new()
                    } else {
                        vec![StreamEvent::TextDelta(r.delta)]
                    };
                    return Ok(Normalized::Events(events));
                }
            }
        }
        let mut got = self.inner.push(event, data)?;
        if let (true, Normalized::Events(events)) = (self.refused, &mut got) {
            for e in events.iter_mut() {
                if let StreamEvent::Finish { reason, .. } = e {
                    if *reason == FinishReason::EndTurn {
                        *reason = FinishReason::Other("refusal".into());
                    }
                }
            }
        }
        Ok(got)
    }
}

/// The `type` of an event whose first member it is.
fn first_type(data: &str) -> Option<&str> {
    let mut c = crate::scan::Cursor::new(data);
    c.object()?;
    (c.key()? == Some("type")).then_some(())?;
    c.value()?.plain()
}

/// Whether `kind` appears in `data` as a whole JSON string.
fn appears(data: &str, kind: &str) -> bool {
    let b = data.as_bytes();
    memchr::memmem::find_iter(b, kind.as_bytes())
        .any(|at| at > 0 && b[at - 1] == b'"' && b.get(at + kind.len()) == Some(&b'"'))
}

/// Whether `data` may be an event of type `kind`.
#[cfg(test)]
fn may_be(data: &str, kind: &str) -> bool {
    match first_type(data) {
        Some(t) => t == kind,
        None => appears(data, kind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_limit_in_the_stream_is_transient_with_its_reset() {
        use crate::WireFamily;
        let mut n = Refusals::new(crate::openai_responses::Family.normalizer(Default::default()));
        let got = n
            .push(
                None,
                r#"{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_in_seconds":7}}"#,
            )
            .unwrap();
        let Normalized::Error(e) = got else {
            panic!("{got:?}")
        };
        assert_eq!(e.class, ErrorClass::Transient);
        assert_eq!(e.retry_after_ms, Some(7000));
        assert!(
            e.message.starts_with("usage_limit_reached (plan plus)"),
            "{}",
            e.message
        );
        // Another error event is the Responses family's to classify.
        let got = n
            .push(
                None,
                r#"{"type":"error","code":"rate_limit_exceeded","message":"slow"}"#,
            )
            .unwrap();
        assert!(
            matches!(
                got,
                Normalized::Error(ClassifiedError {
                    class: ErrorClass::Transient,
                    retry_after_ms: None,
                    ..
                })
            ),
            "{got:?}"
        );
    }

    #[test]
    fn a_refusal_is_known_by_its_type_wherever_the_type_stands() {
        for (data, refusal) in [
            (r#"{"type":"response.refusal.delta","delta":"no"}"#, true),
            (r#"{"delta":"no","type":"response.refusal.delta"}"#, true),
            (r#"{ "type" : "response.refusal.delta" }"#, true),
            (
                r#"{"type":"response.output_text.delta","delta":"\"response.refusal.delta\""}"#,
                false,
            ),
            (
                r#"{"type":"response.output_text.delta","delta":"x"}"#,
                false,
            ),
        ] {
            assert_eq!(may_be(data, "response.refusal.delta"), refusal, "{data}");
        }
    }

    #[test]
    fn a_refusal_stream_normalizes_the_same_at_every_split() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
            "event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"I can\\u2019t \"}\n\n",
            "event: response.refusal.delta\ndata: {\"type\":\"response.refusal.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"help.\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_9\",\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n",
        );
        let events = crate::normalize_chunks(
            &super::super::Family,
            &crate::Aliases::default(),
            &[stream.as_bytes()],
        );
        assert_eq!(events[0], StreamEvent::TextDelta("I can\u{2019}t ".into()));
        assert_eq!(events[1], StreamEvent::TextDelta("help.".into()));
        assert!(
            matches!(events.last(), Some(StreamEvent::Finish { reason: FinishReason::Other(r), .. }) if r == "refusal"),
            "{events:?}"
        );
        crate::assert_every_split(
            &super::super::Family,
            &crate::Aliases::default(),
            stream.as_bytes(),
            &events,
        );
    }

    #[test]
    fn quota_headers_become_windows_and_absent_ones_stay_absent() {
        let h = |name: &str| match name {
            "x-codex-primary-used-percent" => Some("42.5".to_string()),
            "x-codex-primary-window-minutes" => Some("300".to_string()),
            "x-codex-primary-reset-after-seconds" => Some("1200".to_string()),
            "x-codex-secondary-used-percent" => Some("7".to_string()),
            _ => None,
        };
        assert_eq!(
            quota(&h),
            Some(Quota {
                windows: vec![
                    QuotaWindow {
                        name: "primary".into(),
                        used_basis_points: Some(4250),
                        window_minutes: Some(300),
                        resets_in_seconds: Some(1200),
                    },
                    QuotaWindow {
                        name: "secondary".into(),
                        used_basis_points: Some(700),
                        window_minutes: None,
                        resets_in_seconds: None,
                    },
                ]
            })
        );
        assert_eq!(quota(&|_| None), None);
    }

    #[test]
    fn a_usage_limit_is_transient_until_it_resets_and_an_excluded_plan_needs_credentials() {
        let limit = br#"{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_in_seconds":1800}}"#;
        let (class, said) = classify_body(429, limit).unwrap();
        assert_eq!(class, ErrorClass::Transient);
        assert!(said.contains("usage_limit_reached (plan plus)"), "{said}");
        assert_eq!(usage_limit_reset_ms(limit), Some(1_800_000));
        let excluded = br#"{"error":{"type":"usage_not_included","message":"Upgrade"}}"#;
        assert_eq!(
            classify_body(403, excluded).unwrap().0,
            ErrorClass::AuthRequired
        );
        assert_eq!(usage_limit_reset_ms(excluded), None);
    }

    #[test]
    fn the_headers_name_the_account_and_a_missing_one_is_refused() {
        let cred = Credential::OAuth {
            access_token: "tok".into(),
            project: None,
            account_id: Some("acct-1".into()),
        };
        let (token, account) = account(&cred, "chatgpt").unwrap();
        let h = headers(token, &account);
        assert!(h.contains(&("chatgpt-account-id".into(), "acct-1".into())));
        assert!(h.contains(&("authorization".into(), "Bearer tok".into())));
    }
}
