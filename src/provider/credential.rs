//! Credentials as the transport uses them: a credential id (frozen into the run) resolves at
//! call time to a [`Credential`], which a family turns into headers or a signature. Secrets
//! live only here and in the request being sent: `Debug` never prints them, and a
//! [`Redactor`] removes any echo of them from provider text before it is recorded.

use std::fmt;

pub use broca_protocol::model::CredentialProblem;

/// A resolved credential.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API key sent as a header.
    ApiKey(String),
    /// AWS keys for request signing.
    Aws(AwsCredential),
    /// An OAuth access token sent as a bearer (Google Code Assist), with the Google Cloud
    /// project it bills when the credential names one.
    OAuth {
        access_token: String,
        project: Option<String>,
        /// The ChatGPT account the token belongs to.
        account_id: Option<String>,
    },
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
            Credential::OAuth { project, .. } => write!(f, "OAuth(<redacted>, {project:?})"),
        }
    }
}

impl Credential {
    /// The API key, or `Err` naming what this family needs instead.
    pub fn api_key(&self, family: &str) -> Result<&str, CredentialProblem> {
        match self {
            Credential::ApiKey(k) => Ok(k),
            Credential::Aws(_) => {
                Err(format!("the {family} family takes an API key, not AWS keys").into())
            }
            Credential::OAuth { .. } => Err(format!(
                "the {family} family takes an API key, not an OAuth access token"
            )
            .into()),
        }
    }

    /// A bearer token: an OAuth access token, or a key given where a token is taken.
    pub fn bearer(&self, family: &str) -> Result<&str, CredentialProblem> {
        match self {
            Credential::ApiKey(k) => Ok(k),
            Credential::OAuth { access_token, .. } => Ok(access_token),
            Credential::Aws(_) => {
                Err(format!("the {family} family takes an OAuth access token, not AWS keys").into())
            }
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
            Credential::OAuth { access_token, .. } => vec![access_token.clone()],
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
    fn credential(&self, credential_id: &str) -> Result<Credential, CredentialProblem>;

    /// The provider refused the credential `credential_id` resolved to (`status`: 401 or
    /// 403). A source that can do something about it (a vault) hears of it.
    fn auth_failed(&self, _credential_id: &str, _status: u16) {}

    /// For a credential whose resolution waits on another process (a vault it does not
    /// keep yet), the lookup to run off the calling thread, so a shard never waits on it;
    /// `None` when [`Secrets::credential`] answers at once.
    fn lookup_off_thread(&self, _credential_id: &str) -> Option<Lookup> {
        None
    }

    /// How to refresh the OAuth credential `credential_id`, when its source keeps a refresh
    /// token for it (`None`: it cannot be refreshed here).
    fn refresh_of(&self, _credential_id: &str) -> Option<Refresh> {
        None
    }

    /// Keeps the token a refresh gave for `credential_id`, for its next use.
    fn refreshed(&self, credential_id: &str, _token: &Refreshed) -> Result<(), CredentialProblem> {
        Err(format!("credential `{credential_id}` keeps no refreshed token").into())
    }
}

/// What refreshing an OAuth credential takes (its secrets never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct Refresh {
    /// The token endpoint the credential names (else its provider family's).
    pub token_url: Option<String>,
    pub refresh_token: String,
    pub client_id: String,
    pub client_secret: Option<String>,
    /// Its access token expires within a minute (or has): refresh before using it.
    pub due: bool,
}

impl fmt::Debug for Refresh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refresh")
            .field("token_url", &self.token_url)
            .field("due", &self.due)
            .finish_non_exhaustive()
    }
}

/// A token endpoint's answer.
#[derive(Clone, PartialEq, Eq)]
pub struct Refreshed {
    pub access_token: String,
    /// A rotated refresh token, when the endpoint gave one.
    pub refresh_token: Option<String>,
    pub expires_at_ms: Option<u64>,
}

impl fmt::Debug for Refreshed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refreshed")
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// A credential lookup that may block, to run off the shard's thread ([`off_thread`]).
pub type Lookup = Box<dyn FnOnce() -> Result<Credential, CredentialProblem> + Send>;

/// Runs `lookup` on a thread of its own and answers what it found: the shard awaiting it goes
/// on with its other work, and the executor's blocking pool (which opens and replays WALs)
/// never waits on another process either.
pub async fn off_thread(lookup: Lookup) -> Result<Credential, CredentialProblem> {
    let (tx, rx) = futures_channel::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("credential-read".into())
        .spawn(move || {
            let _ = tx.send(lookup());
        });
    if let Err(e) = spawned {
        return Err(CredentialProblem::outage(format!(
            "no thread to read the credential on: {e}"
        )));
    }
    rx.await.unwrap_or_else(|_| {
        Err(CredentialProblem::outage(
            "the credential read ended without an answer",
        ))
    })
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
    fn credential(&self, credential_id: &str) -> Result<Credential, CredentialProblem> {
        env_credential(credential_id).map_err(CredentialProblem::from)
    }
}

fn env_credential(credential_id: &str) -> Result<Credential, CredentialProblem> {
    {
        let Some(var) = credential_id.strip_prefix("env:") else {
            return Err(format!(
                "credential `{credential_id}` is not an environment credential (env:NAME)"
            )
            .into());
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
        Ok(env(var)
            .map(Credential::ApiKey)
            .ok_or_else(|| missing(var))?)
    }
}

/// A secret store a daemon provides (the claustrum vault arrives with the daemon). `vault:NAME`
/// credential ids resolve through it.
pub trait Vault: Send + Sync {
    /// The credential `name` names in the vault, read under the module's grant, or through
    /// `handle` (a bearer capability handle, `ckh_...`: possession authorizes) when the
    /// credentials file gives one for `name`; `Err` says why not (and whether the vault is
    /// out rather than the credential refused), revealing nothing (the handle included).
    fn credential(&self, name: &str, handle: Option<&str>)
        -> Result<Credential, CredentialProblem>;

    /// A provider refused the credential `name` resolved to (`status`: 401 or 403).
    fn auth_failed(&self, _name: &str, _status: u16) {}

    /// Whether the credential `name` is kept in memory and still good: then
    /// [`Vault::credential`] answers without asking the vault.
    fn kept(&self, _name: &str) -> bool {
        false
    }
}

/// A shared vault is a vault (every shard's credentials resolve through the one vault).
impl<V: Vault + ?Sized> Vault for std::sync::Arc<V> {
    fn credential(
        &self,
        name: &str,
        handle: Option<&str>,
    ) -> Result<Credential, CredentialProblem> {
        (**self).credential(name, handle)
    }

    fn auth_failed(&self, name: &str, status: u16) {
        (**self).auth_failed(name, status)
    }

    fn kept(&self, name: &str) -> bool {
        (**self).kept(name)
    }
}

/// The credentials a state dir offers: `env:NAME` from the environment, `file:NAME` from the
/// owner-only `<state-dir>/credentials.json`, `vault:NAME` from the vault when one is
/// configured. The file is read at each use, so a rotated key applies to the next call.
///
/// ```json
/// {"work": {"api_key": "sk-..."},
///  "aws-prod": {"aws_access_key_id": "AKIA...", "aws_secret_access_key": "...", "region": "us-east-1"}}
/// ```
pub struct StateSecrets {
    file: std::path::PathBuf,
    vault: Option<std::sync::Arc<dyn Vault>>,
}

impl StateSecrets {
    pub fn new(state_dir: &std::path::Path) -> StateSecrets {
        StateSecrets {
            file: state_dir.join("credentials.json"),
            vault: None,
        }
    }

    /// Resolves `vault:` ids through `vault`.
    pub fn with_vault(mut self, vault: Box<dyn Vault>) -> StateSecrets {
        self.vault = Some(std::sync::Arc::from(vault));
        self
    }

    /// The vault handle the credentials file gives for `name` (`{"NAME": {"vault_handle":
    /// "ckh_..."}}`), if any.
    fn vault_handle(&self, name: &str) -> Option<String> {
        let bytes = broca_owner_only::read_private(&self.file).ok()?;
        let all: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        all.get(name)?
            .get("vault_handle")?
            .as_str()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
    }

    /// The file's entries, typed (a parse error names the file and where, never quotes it).
    fn typed_entries(
        &self,
    ) -> Result<std::collections::BTreeMap<String, Entry>, CredentialProblem> {
        let bytes = broca_owner_only::read_private(&self.file).map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| {
            format!(
                "{}: not a credentials file (line {}, column {})",
                self.file.display(),
                e.line(),
                e.column()
            )
            .into()
        })
    }

    fn file_credential(&self, name: &str) -> Result<Credential, CredentialProblem> {
        let all = self.typed_entries()?;
        let e = all
            .get(name)
            .ok_or_else(|| format!("{} has no credential `{name}`", self.file.display()))?;
        if let (Some(t), None, None) = (&e.access_token, &e.api_key, &e.aws_access_key_id) {
            if !t.trim().is_empty() {
                return Ok(Credential::OAuth {
                    access_token: t.trim().to_string(),
                    project: e.project.clone().filter(|p| !p.is_empty()),
                    account_id: e.account_id.clone().filter(|a| !a.is_empty()),
                });
            }
        }
        match (&e.api_key, &e.aws_access_key_id, &e.aws_secret_access_key) {
            (Some(k), None, None) if !k.trim().is_empty() => {
                Ok(Credential::ApiKey(k.trim().to_string()))
            }
            (None, Some(id), Some(secret)) => Ok(Credential::Aws(AwsCredential {
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
                session_token: e.aws_session_token.clone(),
                region: e.region.clone(),
            })),
            _ if e.vault_handle.is_some() => Err(format!(
                "{}: credential `{name}` is a vault handle: name it vault:{name}",
                self.file.display()
            )
            .into()),
            _ => Err(format!(
                "{}: credential `{name}` needs api_key, access_token (with project), or \
                 aws_access_key_id with aws_secret_access_key",
                self.file.display()
            )
            .into()),
        }
    }
}

/// One entry of the credentials file.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aws_access_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aws_secret_access_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aws_session_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    project: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    account_id: Option<String>,
    /// An OAuth token's refresh (read by `refresh_of`, rotated by `refreshed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    refresh_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
    /// A vault handle, used by `vault:NAME` (not `file:NAME`).
    #[serde(skip_serializing_if = "Option::is_none")]
    vault_handle: Option<String>,
}

/// The Unix time in ms.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An access token is refreshed this long before it expires.
const REFRESH_MARGIN_MS: u64 = 60_000;

impl Secrets for StateSecrets {
    fn credential(&self, credential_id: &str) -> Result<Credential, CredentialProblem> {
        match credential_id.split_once(':') {
            Some(("env", _)) => EnvSecrets.credential(credential_id).map_err(|mut p| {
                // A running daemon's environment cannot change: say how to give it a key.
                p.message = format!(
                    "{}; a running broca takes a key without a restart from {} (owner-only, \
                     read at each use: {{\"NAME\": {{\"api_key\": \"...\"}}}}) with \
                     credential_id \"file:NAME\" (docs/credentials.md)",
                    p.message,
                    self.file.display()
                );
                p
            }),
            Some(("file", name)) => Ok(self.file_credential(name)?),
            Some(("vault", name)) => match &self.vault {
                Some(v) => v.credential(name, self.vault_handle(name).as_deref()),
                None => Err(format!(
                    "credential `{credential_id}` needs a vault, and none is configured"
                )
                .into()),
            },
            _ => Err(format!(
                "credential `{credential_id}` is not env:NAME, file:NAME or vault:NAME"
            )
            .into()),
        }
    }

    /// A `file:NAME` OAuth entry with `refresh_token` and `client_id` (and `client_secret`,
    /// `token_url`, `expires_at_ms` when it has them).
    fn refresh_of(&self, credential_id: &str) -> Option<Refresh> {
        let name = credential_id.strip_prefix("file:")?;
        let entries = self.typed_entries().ok()?;
        let e = entries.get(name)?;
        let text = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        text(&e.access_token)?;
        Some(Refresh {
            token_url: text(&e.token_url),
            refresh_token: text(&e.refresh_token)?,
            client_id: text(&e.client_id)?,
            client_secret: text(&e.client_secret),
            due: e
                .expires_at_ms
                .is_some_and(|at| at <= now_ms() + REFRESH_MARGIN_MS),
        })
    }

    /// Writes the refreshed token into the entry (the file replaced whole, owner-only), so
    /// the next use, and the next process, take it.
    fn refreshed(&self, credential_id: &str, token: &Refreshed) -> Result<(), CredentialProblem> {
        let name = credential_id
            .strip_prefix("file:")
            .ok_or_else(|| format!("credential `{credential_id}` is not file:NAME"))?;
        let mut entries = self.typed_entries()?;
        let e = entries
            .get_mut(name)
            .ok_or_else(|| format!("{} has no credential `{name}`", self.file.display()))?;
        e.access_token = Some(token.access_token.clone());
        if let Some(r) = &token.refresh_token {
            e.refresh_token = Some(r.clone());
        }
        e.expires_at_ms = token.expires_at_ms;
        let bytes = serde_json::to_vec_pretty(&entries)
            .map_err(|e| format!("{}: {e}", self.file.display()))?;
        broca_owner_only::write_file(&self.file, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", self.file.display()).into())
    }

    fn auth_failed(&self, credential_id: &str, status: u16) {
        if let (Some(("vault", name)), Some(v)) = (credential_id.split_once(':'), &self.vault) {
            v.auth_failed(name, status);
        }
    }

    /// A `vault:` credential the vault does not keep: its read (up to the vault's deadline)
    /// runs off the caller's thread.
    fn lookup_off_thread(&self, credential_id: &str) -> Option<Lookup> {
        let (Some(("vault", name)), Some(v)) = (credential_id.split_once(':'), &self.vault) else {
            return None;
        };
        if v.kept(name) {
            return None;
        }
        let (vault, name) = (v.clone(), name.to_string());
        let handle = self.vault_handle(&name);
        Some(Box::new(move || vault.credential(&name, handle.as_deref())))
    }
}

pub use broca_protocol::is_credential_id;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_secrets_read_the_owner_only_file_and_never_quote_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let s = StateSecrets::new(dir.path());
        let file = dir.path().join("credentials.json");
        assert!(s
            .credential("file:work")
            .unwrap_err()
            .message
            .contains("credentials.json"));
        broca_owner_only::write_file(
            &file,
            br#"{"work": {"api_key": "sk-file-0123456789"},
                 "aws": {"aws_access_key_id": "AKIA1", "aws_secret_access_key": "shh", "region": "eu-west-1"},
                 "bad": {"api_key": "sk-x", "aws_access_key_id": "y"}}"#,
        )
        .unwrap();
        assert_eq!(
            s.credential("file:work").unwrap(),
            Credential::ApiKey("sk-file-0123456789".into())
        );
        assert!(
            matches!(s.credential("file:aws").unwrap(), Credential::Aws(a) if a.region.as_deref() == Some("eu-west-1"))
        );
        assert!(s
            .credential("file:bad")
            .unwrap_err()
            .message
            .contains("needs api_key, access_token"));
        assert!(s
            .credential("file:nope")
            .unwrap_err()
            .message
            .contains("no credential `nope`"));
        assert!(s.credential("vault:x").unwrap_err().message.contains("no"));
        assert!(s
            .credential("ldap:x")
            .unwrap_err()
            .message
            .contains("not env:NAME"));
        // Readable by others: refused, and the error shows no secret.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = s.credential("file:work").unwrap_err().message;
        assert!(
            err.contains("chmod 600") && !err.contains("sk-file"),
            "{err}"
        );
        // A file that does not parse: where, never what.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        broca_owner_only::write_file(&file, b"{\"work\": sk-secret-value}").unwrap();
        let err = s.credential("file:work").unwrap_err().message;
        assert!(
            err.contains("line 1") && !err.contains("sk-secret"),
            "{err}"
        );
    }

    #[test]
    fn credential_ids_are_checked() {
        for ok in ["env:ANTHROPIC_API_KEY", "file:work", "vault:team.key-1"] {
            assert!(is_credential_id(ok), "{ok}");
        }
        for bad in ["sk-live-123", "env:", "file:a b", "other:x", "plain"] {
            assert!(!is_credential_id(bad), "{bad}");
        }
    }

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
            .message
            .contains("API key"));
    }

    #[test]
    fn a_missing_variable_is_named() {
        let err = EnvSecrets
            .credential("env:BROCA_TEST_SURELY_UNSET_KEY")
            .unwrap_err()
            .message;
        assert!(
            err.contains("BROCA_TEST_SURELY_UNSET_KEY is not set"),
            "{err}"
        );
        assert!(EnvSecrets
            .credential("vault:x")
            .unwrap_err()
            .message
            .contains("not an environment"));
    }
}
