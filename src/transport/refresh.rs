//! OAuth refresh of a provider's token (chatgpt, code-assist): a credential whose source
//! keeps a refresh token (a `file:` entry with `refresh_token` and `client_id`) is refreshed
//! at its token endpoint when it is about to expire, and once when the provider refuses it
//! (401 or 403); the new token is kept by its source, and the attempt goes on with it. The
//! endpoint is the entry's `token_url`, else the family's. Its answer's tokens are never
//! logged or quoted; a refusal names the endpoint's status and `error` code only.

use broca_protocol::family::Family;
use std::rc::Rc;

use broca_io::net::client::{HttpClient, Request as HttpRequest};
use broca_io::net::Url;

use broca_protocol::{ErrorClass, Request};

use broca_provider::credential::{Credential, Refresh, Refreshed};
use broca_provider::WireFamily;

/// The token endpoint of a family whose credentials are OAuth tokens.
pub fn default_token_url(family: &str) -> Option<&'static str> {
    match Family::parse(family)? {
        Family::ChatGpt => Some("https://auth.openai.com/oauth/token"),
        Family::CodeAssist => Some("https://oauth2.googleapis.com/token"),
        Family::AnthropicMessages
        | Family::OpenAiChat
        | Family::OpenAiResponses
        | Family::Gemini
        | Family::BedrockConverse
        | Family::Demo => None,
    }
}

/// Why an OAuth token was not refreshed (never quoting a token).
#[derive(Debug)]
pub enum RefreshError {
    /// The family has no default endpoint and the entry gives no `token_url`.
    NoEndpoint { family: String },
    /// The entry's `token_url` is not a URL.
    BadUrl { why: String },
    /// The endpoint could not be reached.
    Unreachable { authority: String, why: String },
    /// The endpoint answered other than 2xx (its status and `error` code).
    Refused {
        authority: String,
        status: u16,
        code: String,
    },
    /// The endpoint's answer carries no `access_token`.
    NoAccessToken,
    /// The new token could not be kept by its source, or read back.
    NotKept(broca_provider::credential::CredentialProblem),
}

impl std::fmt::Display for RefreshError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefreshError::NoEndpoint { family } => {
                write!(
                    f,
                    "the {family} family has no token endpoint: give token_url"
                )
            }
            RefreshError::BadUrl { why } => write!(f, "token_url: {why}"),
            RefreshError::Unreachable { authority, why } => {
                write!(f, "the token endpoint {authority}: {why}")
            }
            RefreshError::Refused {
                authority,
                status,
                code,
            } => write!(
                f,
                "the token endpoint {authority} refused the refresh: {status} ({code})"
            ),
            RefreshError::NoAccessToken => {
                f.write_str("the token endpoint's answer has no access_token")
            }
            RefreshError::NotKept(p) => {
                write!(f, "the refreshed token could not be kept: {}", p.message)
            }
        }
    }
}

impl std::error::Error for RefreshError {}

/// The bytes of a token endpoint's answer read at most.
const ANSWER_MAX: usize = 64 * 1024;

/// Asks the token endpoint for a new access token.
pub async fn refresh(
    client: &Rc<HttpClient>,
    family: &str,
    plan: &Refresh,
    now_ms: u64,
) -> Result<Refreshed, RefreshError> {
    let token_url = plan
        .token_url
        .as_deref()
        .or_else(|| default_token_url(family))
        .ok_or_else(|| RefreshError::NoEndpoint {
            family: family.to_string(),
        })?;
    let url = Url::parse(token_url).map_err(|e| RefreshError::BadUrl { why: e.to_string() })?;
    let mut form = vec![
        ("grant_type", "refresh_token"),
        ("refresh_token", plan.refresh_token.as_str()),
        ("client_id", plan.client_id.as_str()),
    ];
    if let Some(secret) = &plan.client_secret {
        form.push(("client_secret", secret));
    }
    let body = form_encode(&form);
    let headers = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Accept", "application/json"),
    ];
    let req = HttpRequest {
        method: "POST",
        url: &url,
        path: "",
        headers: &headers,
        body: body.as_bytes(),
    };
    let mut resp = client
        .send(&req)
        .await
        .map_err(|e| RefreshError::Unreachable {
            authority: url.authority().to_string(),
            why: e.to_string(),
        })?;
    let status = resp.status();
    let answer = resp.body(ANSWER_MAX).await.unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    if !(200..300).contains(&status) {
        let code = v
            .get("error")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("no error code");
        return Err(RefreshError::Refused {
            authority: url.authority().to_string(),
            status,
            code: code.to_string(),
        });
    }
    read_answer(&v, now_ms)
}

/// A token endpoint's JSON answer: `access_token`, and `refresh_token`, `expires_in` when
/// it gives them.
pub fn read_answer(v: &serde_json::Value, now_ms: u64) -> Result<Refreshed, RefreshError> {
    let access_token = v
        .get("access_token")
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(RefreshError::NoAccessToken)?
        .to_string();
    Ok(Refreshed {
        access_token,
        refresh_token: v
            .get("refresh_token")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .filter(|t| !t.is_empty()),
        expires_at_ms: v
            .get("expires_in")
            .and_then(serde_json::Value::as_u64)
            .map(|s| now_ms.saturating_add(s.saturating_mul(1000))),
    })
}

impl crate::HttpModelClient {
    /// Opens the answer's stream with `credential`; an OAuth token about to expire is
    /// refreshed before it is used, and one the provider refuses, once, and the attempt made
    /// again with the new one.
    pub(super) async fn open_refreshing(
        &self,
        request: &Request,
        family: &'static dyn WireFamily,
        url: &Url,
        mut credential: Credential,
    ) -> Result<crate::HttpModelStream, crate::Failure> {
        // An OAuth token about to expire is refreshed before it is used; one the provider
        // refuses, once, and the attempt made again with the new one.
        let plan = self.secrets.refresh_of(&request.credential_id);
        let mut refreshed = false;
        if let Some(p) = plan.as_ref().filter(|p| p.due) {
            match self.refresh_token(request, family, p).await {
                Ok(c) => {
                    credential = c;
                    refreshed = true;
                }
                Err(why) => tracing::warn!(credential = %request.credential_id, "{why}"),
            }
        }
        let opened = self.open_with(request, family, url, &credential).await;
        match (opened, plan) {
            (Err(f), Some(p)) if !refreshed && f.error.class == ErrorClass::AuthRequired => {
                match self.refresh_token(request, family, &p).await {
                    Ok(c) => self.open_with(request, family, url, &c).await,
                    Err(why) => {
                        tracing::warn!(credential = %request.credential_id, "{why}");
                        Err(f)
                    }
                }
            }
            (opened, _) => opened,
        }
    }

    /// Refreshes the OAuth token of the request's credential and answers the credential
    /// with it (kept by its source first).
    async fn refresh_token(
        &self,
        request: &Request,
        family: &'static dyn WireFamily,
        plan: &broca_provider::credential::Refresh,
    ) -> Result<broca_provider::credential::Credential, RefreshError> {
        let token = refresh(&self.client, family.id(), plan, crate::now_unix_ms()).await?;
        self.secrets
            .refreshed(&request.credential_id, &token)
            .map_err(RefreshError::NotKept)?;
        tracing::info!(credential = %request.credential_id, "refreshed the OAuth token");
        self.secrets
            .credential(&request.credential_id)
            .map_err(RefreshError::NotKept)
    }
}

/// `application/x-www-form-urlencoded`.
fn form_encode(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    out.push(b as char)
                }
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_and_the_answer_read_as_oauth_says() {
        assert_eq!(
            form_encode(&[
                ("grant_type", "refresh_token"),
                ("refresh_token", "a/b+c d=")
            ]),
            "grant_type=refresh_token&refresh_token=a%2Fb%2Bc+d%3D"
        );
        let got = read_answer(
            &serde_json::json!({"access_token": "at-2", "refresh_token": "rt-2", "expires_in": 3600}),
            1_000,
        )
        .unwrap();
        assert_eq!(got.access_token, "at-2");
        assert_eq!(got.refresh_token.as_deref(), Some("rt-2"));
        assert_eq!(got.expires_at_ms, Some(3_601_000));
        let bare = read_answer(&serde_json::json!({"access_token": "at-3"}), 0).unwrap();
        assert_eq!((bare.refresh_token, bare.expires_at_ms), (None, None));
        assert!(matches!(
            read_answer(&serde_json::json!({"error": "invalid_grant"}), 0),
            Err(RefreshError::NoAccessToken)
        ));
        assert_eq!(default_token_url("anthropic"), None);
        assert!(
            default_token_url("chatgpt").is_some() && default_token_url("code-assist").is_some()
        );
    }
}
