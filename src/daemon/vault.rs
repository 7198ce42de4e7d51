//! Module mode's `vault:` credentials: `vault:NAME` resolves to the secret the claustrum vault
//! holds as NAME under broca's grant (broca_subc::vault), or, when the credentials file gives
//! NAME a `vault_handle` (a developer's bearer handle), to the secret that handle stands for;
//! kept for a while in memory (never on disk, never logged), and asked again once it is about
//! to expire.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use broca_provider::credential::{Credential, CredentialProblem, Vault};
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
        let secret = secret.trim().to_string();
        if secret.is_empty() {
            return Err(format!("the vault's credential `{name}` is empty").into());
        }
        let keep = match resolved.expires_at_ms {
            Some(at) => {
                let now = broca_session::now_unix_ms() as i64;
                Duration::from_millis(at.saturating_sub(now).saturating_sub(MARGIN_MS).max(0) as u64)
                    .min(KEEP)
            }
            None => KEEP,
        };
        let c = Credential::ApiKey(secret);
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
