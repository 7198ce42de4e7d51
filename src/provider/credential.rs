//! Credentials as the transport uses them: a credential id (frozen into the run) resolves at
//! call time to a [`Credential`], which a family turns into headers or a signature. Secrets
//! live only here and in the request being sent: `Debug` never prints them, and a
//! [`Redactor`] removes any echo of them from provider text before it is recorded.

use std::fmt;

/// A resolved credential.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API key sent as a header.
    ApiKey(String),
    /// AWS keys for request signing.
    Aws(AwsCredential),
}

/// AWS keys (from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION).
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredential {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    pub region: Option<String>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::ApiKey(_) => write!(f, "ApiKey(<redacted>)"),
            Credential::Aws(a) => write!(f, "Aws({}, <redacted>)", a.access_key_id),
        }
    }
}

impl Credential {
    /// The API key, or `Err` naming what this family needs instead.
    pub fn api_key(&self, family: &str) -> Result<&str, String> {
        match self {
            Credential::ApiKey(k) => Ok(k),
            Credential::Aws(_) => Err(format!(
                "the {family} family takes an API key, not AWS keys"
            )),
        }
    }

    /// A redactor for this credential's secrets.
    pub fn redactor(&self) -> Redactor {
        let secrets = match self {
            Credential::ApiKey(k) => vec![k.clone()],
            Credential::Aws(a) => {
                let mut v = vec![a.secret_access_key.clone()];
                v.extend(a.session_token.clone());
                v
            }
        };
        Redactor { secrets }
    }
}

/// Removes secrets from text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// `text` with every secret (of 8 bytes or more) replaced by `<redacted>`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.secrets.iter().filter(|s| s.len() >= 8) {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "<redacted>");
            }
        }
        out
    }
}

/// Resolves credential ids.
pub trait Secrets {
    /// The credential for `credential_id`; `Err` says what is missing, revealing nothing.
    fn credential(&self, credential_id: &str) -> Result<Credential, String>;
}

/// Credentials from the conventional environment variables: `env:NAME` is the API key in
/// NAME; `env:AWS_ACCESS_KEY_ID` is the AWS key set.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvSecrets;

fn env(var: &str) -> Option<String> {
    std::env::var(var)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl Secrets for EnvSecrets {
    fn credential(&self, credential_id: &str) -> Result<Credential, String> {
        let Some(var) = credential_id.strip_prefix("env:") else {
            return Err(format!(
                "credential `{credential_id}` is not an environment credential (env:NAME)"
            ));
        };
        let missing = |v: &str| format!("{v} is not set: export it with the provider's key");
        if var == "AWS_ACCESS_KEY_ID" {
            return Ok(Credential::Aws(AwsCredential {
                access_key_id: env(var).ok_or_else(|| missing(var))?,
                secret_access_key: env("AWS_SECRET_ACCESS_KEY")
                    .ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY"))?,
                session_token: env("AWS_SESSION_TOKEN"),
                region: env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")),
            }));
        }
        env(var).map(Credential::ApiKey).ok_or_else(|| missing(var))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print_and_echoes_are_redacted() {
        let k = Credential::ApiKey("sk-live-123456789".into());
        assert_eq!(format!("{k:?}"), "ApiKey(<redacted>)");
        assert_eq!(
            k.redactor()
                .scrub("Incorrect API key provided: sk-live-123456789."),
            "Incorrect API key provided: <redacted>."
        );
        let a = Credential::Aws(AwsCredential {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG".into(),
            session_token: Some("token-0123456789".into()),
            region: None,
        });
        assert!(!format!("{a:?}").contains("wJalr"));
        assert_eq!(
            a.redactor()
                .scrub("x wJalrXUtnFEMI/K7MDENG token-0123456789"),
            "x <redacted> <redacted>"
        );
        assert!(a
            .api_key("anthropic-messages")
            .unwrap_err()
            .contains("API key"));
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = EnvSecrets
            .credential("env:BROCA_TEST_SURELY_UNSET_KEY")
            .unwrap_err();
        assert!(
            err.contains("BROCA_TEST_SURELY_UNSET_KEY is not set"),
            "{err}"
        );
        assert!(EnvSecrets
            .credential("vault:x")
            .unwrap_err()
            .contains("not an environment"));
    }
}
