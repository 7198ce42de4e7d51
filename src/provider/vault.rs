//! `vault:` credentials through the claustrum vault (broca_subc::vault). In module mode
//! `vault:NAME` resolves to the secret the vault holds as NAME under broca's grant (the launch
//! nonce makes broca's route the grant's), or, when the credentials file gives NAME a
//! `vault_handle` (a developer's bearer handle), to the secret that handle stands for. `broca
//! run` and `broca serve` read bearer handles only ([`HandleVault`]: the daemon found by its
//! connection file, as a direct client), since a grant needs the launch nonce only a
//! supervised broca has.
//!
//! A secret is typed by its payload: a JSON object with `access_key_id` and
//! `secret_access_key` (and `session_token`, `region`) is an AWS key pair; one with
//! `access_token` (and `project`, `account_id`; a `refresh_token` is the vault's to use) an
//! OAuth token; one with `api_key`, or any other text, an API key ([`typed`]). It is kept
//! for a while in memory (never on disk, never logged), and asked again once it is about to
//! expire (an OAuth token's `expires_at_ms`, as the vault says it) or the provider refused it
//! (reported to the vault, which refreshes what it can).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::credential::{AwsCredential, Credential, CredentialProblem, Vault};
use broca_subc::claustrum::CredentialErrorClass;
use broca_subc::vault::VaultClient;

/// How long a secret with no expiry is used before the vault is asked again.
const KEEP: Duration = Duration::from_secs(300);
/// A secret is asked again this long before the vault says it expires.
const MARGIN_MS: i64 = 60_000;

/// The vault, shared by every shard (as an `Arc`).
pub struct ClaustrumVault {
    client: std::sync::Arc<VaultClient>,
    /// Each secret, until when it is used, and the vault's record version of it.
    kept: Mutex<HashMap<String, (Credential, Instant, String)>>,
}

impl ClaustrumVault {
    pub fn new(client: VaultClient) -> ClaustrumVault {
        ClaustrumVault {
            client: std::sync::Arc::new(client),
            kept: Mutex::new(HashMap::new()),
        }
    }
}

impl Vault for ClaustrumVault {
    fn credential(
        &self,
        name: &str,
        handle: Option<&str>,
    ) -> Result<Credential, CredentialProblem> {
        let v = self;
        if let Some((c, until, _)) = v.kept.lock().ok().and_then(|k| k.get(name).cloned()) {
            if Instant::now() < until {
                return Ok(c);
            }
        }
        let read = match handle {
            Some(h) => v.client.get_by_handle(h),
            None => v.client.get_scoped(name),
        };
        let resolved = read.map_err(|e| {
            // The vault's safe message and class only: never a secret. A vault that is out
            // (unreachable, relaying a refusal, or saying "later") is not a verdict on the
            // credential.
            let out = e.retryable() || e.class == CredentialErrorClass::Unavailable;
            let message = if out {
                format!("the vault is unavailable for `{name}`: {} ({e})", e.code())
            } else {
                format!(
                    "the vault has no usable credential `{name}`: {} ({e})",
                    e.code()
                )
            };
            CredentialProblem {
                message,
                outage: out,
            }
        })?;
        let secret = String::from_utf8(resolved.expose().to_vec())
            .map_err(|_| format!("the vault's credential `{name}` is not text"))?;
        let c = typed(name, secret.trim())?;
        let keep = match resolved.expires_at_ms {
            Some(at) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                Duration::from_millis(at.saturating_sub(now).saturating_sub(MARGIN_MS).max(0) as u64)
                    .min(KEEP)
            }
            None => KEEP,
        };
        if let Ok(mut k) = v.kept.lock() {
            k.insert(
                name.to_string(),
                (
                    c.clone(),
                    Instant::now() + keep,
                    resolved.record_version.clone(),
                ),
            );
        }
        Ok(c)
    }

    fn kept(&self, name: &str) -> bool {
        self.kept
            .lock()
            .ok()
            .and_then(|k| k.get(name).map(|(_, until, _)| Instant::now() < *until))
            .unwrap_or(false)
    }

    /// Forgets the secret (the next use asks the vault again) and reports the refusal, with
    /// the record version the secret came with (`credential.report_auth_failure`).
    fn auth_failed(&self, name: &str, status: u16) {
        let kept = self.kept.lock().ok().and_then(|mut k| k.remove(name));
        let Some(version) = kept.and_then(|(_, _, v)| v.parse::<u64>().ok()) else {
            return;
        };
        // Reported from a thread of its own: the provider's refusal is answered on a shard,
        // which never waits on the vault.
        let (client, credential) = (self.client.clone(), name.to_string());
        let reported = std::thread::Builder::new()
            .name("vault-report".into())
            .spawn(
                move || match client.report_auth_failure(&credential, status, version) {
                    Ok(accepted) => tracing::info!(
                        credential = credential,
                        status,
                        accepted,
                        "reported to the vault"
                    ),
                    Err(e) => tracing::warn!(
                        credential = credential,
                        status,
                        "the vault took no report: {}",
                        e.code()
                    ),
                },
            );
        if let Err(e) = reported {
            tracing::warn!(
                credential = name,
                "the vault took no report: no thread for it: {e}"
            );
        }
    }
}

/// The credential a vault payload is (see the module's words); `Err` names what is wrong,
/// never quoting the payload.
pub fn typed(name: &str, payload: &str) -> Result<Credential, CredentialProblem> {
    if payload.is_empty() {
        return Err(format!("the vault's credential `{name}` is empty").into());
    }
    if !payload.starts_with('{') {
        return Ok(Credential::ApiKey(payload.to_string()));
    }
    let Ok(serde_json::Value::Object(o)) = serde_json::from_str::<serde_json::Value>(payload)
    else {
        return Err(format!("the vault's credential `{name}` is not a JSON object").into());
    };
    let text = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| o.get(*k).and_then(serde_json::Value::as_str))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let Some(id) = text(&["access_key_id", "aws_access_key_id"]) {
        let secret = text(&["secret_access_key", "aws_secret_access_key"]).ok_or_else(|| {
            format!("the vault's credential `{name}` has an access key id and no secret_access_key")
        })?;
        return Ok(Credential::Aws(AwsCredential {
            access_key_id: id,
            secret_access_key: secret,
            session_token: text(&["session_token", "aws_session_token"]),
            region: text(&["region", "aws_region"]),
        }));
    }
    if let Some(token) = text(&["access_token"]) {
        return Ok(Credential::OAuth {
            access_token: token,
            project: text(&["project", "project_id"]),
            account_id: text(&["account_id"]),
        });
    }
    if let Some(key) = text(&["api_key", "key"]) {
        return Ok(Credential::ApiKey(key));
    }
    Err(format!(
        "the vault's credential `{name}` is a JSON object with none of api_key, access_token, \
         or access_key_id with secret_access_key"
    )
    .into())
}

/// `broca run`'s and `broca serve`'s vault: bearer handles only, read through the daemon its
/// connection file names (`SUBC_CONNECTION_FILE`, else the daemon's usual places), found at
/// the first `vault:` credential used.
pub struct HandleVault {
    found: std::sync::OnceLock<Result<ClaustrumVault, CredentialProblem>>,
}

impl HandleVault {
    pub fn new() -> HandleVault {
        HandleVault {
            found: std::sync::OnceLock::new(),
        }
    }

    fn vault(&self) -> Result<&ClaustrumVault, CredentialProblem> {
        let found = self.found.get_or_init(|| {
            let d = broca_subc::transport::connection_file::discover(None).map_err(|e| {
                CredentialProblem::outage(format!(
                    "no daemon to read the vault handle through: {e}"
                ))
            })?;
            // A direct client: no module id of a supervised launch, no nonce.
            Ok(ClaustrumVault::new(VaultClient::new(
                d.path,
                "broca".into(),
                None,
            )))
        });
        found.as_ref().map_err(CredentialProblem::clone)
    }
}

impl Default for HandleVault {
    fn default() -> Self {
        HandleVault::new()
    }
}

impl Vault for HandleVault {
    fn credential(
        &self,
        name: &str,
        handle: Option<&str>,
    ) -> Result<Credential, CredentialProblem> {
        if handle.is_none() {
            return Err(format!(
                "credential `vault:{name}` reads the vault under broca's grant, which needs the \
                 launch nonce of a supervised broca (broca module); here, give `{name}` a \
                 vault_handle in credentials.json"
            )
            .into());
        }
        self.vault()?.credential(name, handle)
    }

    fn auth_failed(&self, name: &str, status: u16) {
        if let Some(Ok(v)) = self.found.get() {
            v.auth_failed(name, status)
        }
    }

    fn kept(&self, name: &str) -> bool {
        matches!(self.found.get(), Some(Ok(v)) if v.kept(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vault_payload_is_typed_by_its_shape_and_never_quoted() {
        assert_eq!(
            typed("k", "sk-plain-key").unwrap(),
            Credential::ApiKey("sk-plain-key".into())
        );
        let aws = typed(
            "aws",
            r#"{"access_key_id": "AKID", "secret_access_key": "s3cret", "session_token": "tok", "region": "eu-west-1"}"#,
        )
        .unwrap();
        assert_eq!(
            aws,
            Credential::Aws(AwsCredential {
                access_key_id: "AKID".into(),
                secret_access_key: "s3cret".into(),
                session_token: Some("tok".into()),
                region: Some("eu-west-1".into()),
            })
        );
        let oauth = typed(
            "o",
            r#"{"access_token": "ya29.x", "refresh_token": "r", "project": "p"}"#,
        )
        .unwrap();
        assert_eq!(
            oauth,
            Credential::OAuth {
                access_token: "ya29.x".into(),
                project: Some("p".into()),
                account_id: None
            }
        );
        assert_eq!(
            typed("j", r#"{"api_key": "sk-json"}"#).unwrap(),
            Credential::ApiKey("sk-json".into())
        );
        for (payload, want) in [
            ("", "is empty"),
            ("{not json", "not a JSON object"),
            (
                r#"{"access_key_id": "AKID-SECRET-ID"}"#,
                "no secret_access_key",
            ),
            (r#"{"password": "hunter2-secret"}"#, "none of api_key"),
        ] {
            let e = typed("n", payload).unwrap_err().message;
            assert!(e.contains(want), "{payload}: {e}");
            assert!(!e.contains("SECRET") && !e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn outside_module_mode_only_a_handle_reads_the_vault() {
        let v = HandleVault::new();
        let e = v.credential("team", None).unwrap_err();
        assert!(e.message.contains("vault_handle"), "{}", e.message);
        assert!(!v.kept("team"));
    }
}
