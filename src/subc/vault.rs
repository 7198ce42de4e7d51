//! The claustrum credential vault, over a route the daemon opens to it: a connection of its
//! own (authenticated, no HELLO), `route.open` to claustrum's management surface with broca's
//! consumer identity (its module id and launch nonce: the vault scopes what it answers to the
//! module's grant), then `credential.get_scoped` and `credential.report_auth_failure`
//! requests. The vault's replies and errors are read with `cortexkit-claustrum-client`'s own
//! decoders (its sans-IO part), so relay refusals (the route is gone: redial) and credential
//! verdicts (absent, unauthorized, ...) are classified as the vault's contract says.
//! Blocking, with short deadlines; one connection, shared, redialled once after a transport
//! failure.

use std::path::PathBuf;
use std::time::Duration;

use cortexkit_claustrum_client::{
    decode_credential_reply, decode_report_auth_failure_reply, decode_wire_error,
    CredentialErrorClass, CredentialResolverError, ResolvedCredential,
};
use serde_json::{json, Value};

use crate::surface::{SurfaceClient, SurfaceError};

/// The vault's module id.
pub const CLAUSTRUM: &str = "claustrum";
/// How long a vault request may take (claustrum's own client waits 3 s for a read).
pub const READ_DEADLINE: Duration = Duration::from_secs(3);

/// A client of the vault for one module.
pub struct VaultClient {
    surface: SurfaceClient,
    /// Whether broca has the launch nonce that makes its route the module's grant.
    has_nonce: bool,
}

fn transport(why: impl Into<String>) -> CredentialResolverError {
    CredentialResolverError::transport(why.into())
}

impl VaultClient {
    /// A client that reaches the vault through the daemon of the connection file `file`, as
    /// module `module_id` (with its launch nonce, when the daemon handed one).
    pub fn new(file: PathBuf, module_id: String, launch_nonce: Option<String>) -> VaultClient {
        let has_nonce = launch_nonce
            .as_deref()
            .is_some_and(|n| !n.trim().is_empty());
        VaultClient {
            has_nonce,
            surface: SurfaceClient::new(
                file,
                CLAUSTRUM,
                "credential-consumer",
                module_id,
                launch_nonce,
                READ_DEADLINE,
            ),
        }
    }

    /// The secret the vault holds as `credential_id`, under the module's grant. Without a
    /// launch nonce it is refused before anything is sent, as claustrum's own client refuses:
    /// the route would open unscoped, and the vault would answer an ambiguous `not_found`.
    pub fn get_scoped(
        &self,
        credential_id: &str,
    ) -> Result<ResolvedCredential, CredentialResolverError> {
        if !self.has_nonce {
            return Err(CredentialResolverError::new(
                CredentialErrorClass::AuthRequired,
                "reading the vault under the module's grant needs the launch nonce of a \
                 supervised launch, and broca has none (a bearer handle reads without one)",
            ));
        }
        let params = json!({ "credential_id": credential_id });
        decode_credential_reply(self.call("credential.get_scoped", params)?)
    }

    /// The secret a bearer capability handle (`ckh_...`) stands for: possession authorizes,
    /// so a developer's tool needs no grant (`credential.get {handle}`). The handle is never
    /// put in an error or a log.
    pub fn get_by_handle(
        &self,
        handle: &str,
    ) -> Result<ResolvedCredential, CredentialResolverError> {
        let params = json!({ "handle": handle });
        decode_credential_reply(self.call("credential.get", params)?)
    }

    /// Tells the vault the provider refused the credential (`status`: 401 or 403); answers
    /// whether it took the report.
    pub fn report_auth_failure(
        &self,
        credential_id: &str,
        status: u16,
        record_version: u64,
    ) -> Result<bool, CredentialResolverError> {
        let params = json!({
            "credential_id": credential_id,
            "provider_status": status,
            "record_version": record_version,
        });
        decode_report_auth_failure_reply(self.call("credential.report_auth_failure", params)?)
    }

    /// One request on the vault's route; a transport failure (the connection or the route
    /// gone, also as the relay's refusal) redials once.
    fn call(&self, method: &str, params: Value) -> Result<Value, CredentialResolverError> {
        let mut last = None;
        for _ in 0..2 {
            let e = match self.surface.call(method, params.clone()) {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(body)) => decode_wire_error(&body),
                Err(SurfaceError::Refused(code)) => {
                    return Err(CredentialResolverError::new(
                        CredentialErrorClass::Unavailable,
                        format!("the daemon refused a route to the vault: {code}"),
                    ))
                }
                Err(SurfaceError::Transport(why)) => return Err(transport(why)),
            };
            if !e.is_transport() {
                return Err(e);
            }
            self.surface.reset();
            last = Some(e);
        }
        Err(last.unwrap_or_else(|| transport("the vault did not answer")))
    }
}
