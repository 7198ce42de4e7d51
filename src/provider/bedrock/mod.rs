//! The Bedrock family: `POST /model/{modelId}/converse-stream`, signed with AWS Signature
//! Version 4 (service `bedrock`) over the request's exact bytes, answered in the AWS
//! event-stream framing (broca-io decodes it; each message is one event named by its
//! `:event-type`, or `:exception-type`).

pub mod normalize;
pub mod render;

use crate::credential::Credential;
use crate::{sigv4, Aliases, AuthContext, Framing, Rendered, StreamNormalizer, WireFamily};
use broca_protocol::model::CredentialProblem;
use broca_protocol::{ErrorClass, Request};

/// The family.
pub struct Family;

/// The region of a credential, else of a `bedrock-runtime.REGION.amazonaws.com` base URL.
fn region(a: &crate::credential::AwsCredential, host: &str) -> Result<String, CredentialProblem> {
    if let Some(r) = a.region.as_deref().filter(|r| !r.is_empty()) {
        return Ok(r.to_string());
    }
    let mut parts = host.split('.');
    match (parts.next(), parts.next()) {
        (Some(s), Some(r)) if s.starts_with("bedrock-runtime") && !r.is_empty() => Ok(r.into()),
        _ => Err(
            "the bedrock family needs a region: set AWS_REGION (or `region` in \
             credentials.json), or use a bedrock-runtime.REGION.amazonaws.com base URL"
                .into(),
        ),
    }
}

fn aws(credential: &Credential) -> Result<&crate::credential::AwsCredential, CredentialProblem> {
    match credential {
        Credential::Aws(a) => Ok(a),
        _ => Err(
            "the bedrock family takes AWS keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)".into(),
        ),
    }
}

impl WireFamily for Family {
    fn id(&self) -> &'static str {
        broca_protocol::family::Family::BedrockConverse.id()
    }

    fn render(&self, req: &Request, aliases: &Aliases) -> Rendered {
        Rendered {
            path: format!(
                "/model/{}/converse-stream",
                crate::gemini::path_segment(&req.model)
            ),
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("accept".into(), "application/vnd.amazon.eventstream".into()),
            ],
            body: render::body(req, aliases),
        }
    }

    fn takes(&self, credential: &Credential) -> Result<(), CredentialProblem> {
        aws(credential).map(|_| ())
    }

    fn authorize(
        &self,
        rendered: &mut Rendered,
        auth: &AuthContext<'_>,
    ) -> Result<(), CredentialProblem> {
        let a = aws(auth.credential)?;
        let region = region(a, &auth.url.host)?;
        let amz_date = sigv4::amz_date(auth.now_unix_secs);
        let mut signed = vec![
            ("host".to_string(), auth.url.authority()),
            ("x-amz-date".to_string(), amz_date.clone()),
        ];
        if let Some(t) = &a.session_token {
            signed.push(("x-amz-security-token".to_string(), t.clone()));
        }
        let scope = sigv4::Scope {
            access_key_id: &a.access_key_id,
            secret_access_key: &a.secret_access_key,
            region: &region,
            service: "bedrock",
            amz_date: &amz_date,
        };
        let path = format!("{}{}", auth.url.prefix, rendered.path);
        let (names, signature) = sigv4::sign(&scope, "POST", &path, &signed, &rendered.body);
        for (n, v) in signed.into_iter().filter(|(n, _)| n != "host") {
            rendered.headers.push((n, v));
        }
        rendered.headers.push((
            "authorization".into(),
            sigv4::authorization(&scope, &names, &signature),
        ));
        Ok(())
    }

    fn framing(&self, _scheme: broca_io::net::Scheme) -> Framing {
        Framing::AwsEventStream
    }

    fn normalizer(&self, aliases: Aliases) -> Box<dyn StreamNormalizer> {
        Box::new(normalize::Normalizer::new(aliases))
    }

    fn classify_body(&self, _status: u16, body: &[u8]) -> Option<(ErrorClass, String)> {
        // Bedrock says `{"message"}` (the kind is in a header); a gateway in front of it may
        // say `{"error": {"message"}}`.
        #[derive(serde::Deserialize)]
        struct Body {
            #[serde(default, alias = "Message")]
            message: Option<String>,
            #[serde(default)]
            error: Option<Inner>,
        }
        #[derive(serde::Deserialize)]
        struct Inner {
            message: String,
        }
        let b: Body = serde_json::from_slice(body).ok()?;
        let message = b.message.or(b.error.map(|e| e.message))?;
        let class = normalize::classify("validationException", &message);
        Some((class, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::AwsCredential;

    #[test]
    fn a_request_is_signed_over_its_bytes_with_the_region_and_the_session_token() {
        let req = crate::sample_request();
        let mut r = Family.render(&req, &Aliases::default());
        assert_eq!(r.path, "/model/m-1/converse-stream");
        let cred = Credential::Aws(AwsCredential {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: Some("token-1".into()),
            region: None,
        });
        let url =
            broca_io::net::Url::parse("https://bedrock-runtime.eu-west-1.amazonaws.com").unwrap();
        Family
            .authorize(
                &mut r,
                &AuthContext {
                    credential: &cred,
                    url: &url,
                    now_unix_secs: 1_440_938_160,
                },
            )
            .unwrap();
        let h = |n: &str| {
            r.headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(h("x-amz-date").as_deref(), Some("20150830T123600Z"));
        assert_eq!(h("x-amz-security-token").as_deref(), Some("token-1"));
        let auth = h("authorization").unwrap();
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/eu-west-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date;x-amz-security-token, Signature="
        ), "{auth}");
        // The signature covers the body: another body, another signature.
        let mut other = Family.render(&req, &Aliases::default());
        other.body.push(b' ');
        Family
            .authorize(
                &mut other,
                &AuthContext {
                    credential: &cred,
                    url: &url,
                    now_unix_secs: 1_440_938_160,
                },
            )
            .unwrap();
        assert_ne!(other.headers.last(), r.headers.last());
        assert!(Family.takes(&Credential::ApiKey("k".into())).is_err());
    }
}
