//! The claustrum credential vault, over a route the daemon opens to it: a connection of its
//! own (authenticated, no HELLO), `route.open` to claustrum's management surface with broca's
//! consumer identity (its module id and launch nonce: the vault scopes what it answers to the
//! module's grant), then `credential.get_scoped` and `credential.report_auth_failure`
//! requests. The vault's replies and errors are read with `cortexkit-claustrum-client`'s own
//! decoders (its sans-IO part), so relay refusals (the route is gone: redial) and credential
//! verdicts (absent, unauthorized, ...) are classified as the vault's contract says.
//! Blocking, with short deadlines; one connection, shared, redialled once after a transport
//! failure.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use cortexkit_claustrum_client::{
    decode_credential_reply, decode_report_auth_failure_reply, decode_wire_error,
    CredentialErrorClass, CredentialResolverError, ResolvedCredential,
};
use serde_json::{json, Value};
use subc_control::{ClientControlRequest, ClientControlResponse, ConsumerIdentity};
use subc_protocol::error_codes::is_retryable_route_open;
use subc_protocol::{BindIdentity, FrameType, RouteTarget};

use crate::frames::{self, Decoder, FrameIn};

/// The vault's module id.
pub const CLAUSTRUM: &str = "claustrum";
/// How long a vault request may take (claustrum's own client waits 3 s for a read).
pub const READ_DEADLINE: Duration = Duration::from_secs(3);
/// A refused open the daemon marks retryable is tried again this many times, backing off.
const OPEN_ATTEMPTS: u32 = 5;

/// A client of the vault for one module.
pub struct VaultClient {
    file: PathBuf,
    module_id: String,
    launch_nonce: Option<String>,
    conn: Mutex<Option<Conn>>,
}

struct Conn {
    stream: TcpStream,
    decoder: Decoder,
    channel: u16,
    epoch: u32,
    next_corr: u64,
}

fn transport(why: impl Into<String>) -> CredentialResolverError {
    CredentialResolverError::transport(why.into())
}

impl VaultClient {
    /// A client that reaches the vault through the daemon of the connection file `file`, as
    /// module `module_id` (with its launch nonce, when the daemon handed one).
    pub fn new(file: PathBuf, module_id: String, launch_nonce: Option<String>) -> VaultClient {
        VaultClient {
            file,
            module_id,
            launch_nonce,
            conn: Mutex::new(None),
        }
    }

    /// The secret the vault holds as `credential_id`, under the module's grant.
    pub fn get_scoped(
        &self,
        credential_id: &str,
    ) -> Result<ResolvedCredential, CredentialResolverError> {
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
    /// gone) redials once.
    fn call(&self, method: &str, params: Value) -> Result<Value, CredentialResolverError> {
        let body = serde_json::to_vec(&json!({ "method": method, "params": params }))
            .expect("JSON values serialize");
        let mut guard = self
            .conn
            .lock()
            .map_err(|_| transport("the vault client's lock is poisoned"))?;
        let mut last = None;
        for _ in 0..2 {
            if guard.is_none() {
                *guard = Some(self.open()?);
            }
            let conn = guard.as_mut().expect("opened above");
            match conn.request(&body) {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transport() => {
                    *guard = None;
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| transport("the vault did not answer")))
    }

    /// Connects, authenticates and opens the route to the vault; a refusal the daemon marks
    /// retryable is tried again with a doubling backoff (100 ms up to 1.6 s), any other is
    /// the vault being unavailable.
    fn open(&self) -> Result<Conn, CredentialResolverError> {
        let stream =
            crate::connect::authenticate(&self.file).map_err(|e| transport(e.to_string()))?;
        stream
            .set_read_timeout(Some(READ_DEADLINE))
            .map_err(|e| transport(e.to_string()))?;
        let mut conn = Conn {
            stream,
            decoder: Decoder::new(),
            channel: 0,
            epoch: 0,
            next_corr: 1,
        };
        let open = ClientControlRequest::RouteOpen {
            target: RouteTarget::ManagementSurface {
                module_id: CLAUSTRUM.into(),
            },
            identity: BindIdentity::new(self.module_id.clone(), "credential-consumer"),
            consumer_identity: self.launch_nonce.as_ref().map(|n| ConsumerIdentity {
                module_id: self.module_id.clone(),
                launch_nonce: n.clone(),
            }),
            consumer_capabilities: None,
            role_versions: None,
            admission_facts: None,
            scope: None,
        };
        let body = serde_json::to_vec(&open).expect("a route.open serializes");
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=OPEN_ATTEMPTS {
            let reply = conn.exchange(0, 0, &body)?;
            match reply.header.ty {
                FrameType::Response => {
                    let Ok(ClientControlResponse::RouteOpen {
                        route_channel,
                        route_epoch,
                    }) = serde_json::from_slice(&reply.body)
                    else {
                        return Err(transport("a route.open answer that does not parse"));
                    };
                    conn.channel = route_channel;
                    conn.epoch = route_epoch;
                    return Ok(conn);
                }
                FrameType::Error => {
                    let code = serde_json::from_slice::<subc_protocol::ErrorBody>(&reply.body)
                        .map(|e| e.code)
                        .unwrap_or_default();
                    if !is_retryable_route_open(&code) {
                        return Err(CredentialResolverError::new(
                            CredentialErrorClass::Unavailable,
                            format!("the daemon refused a route to the vault: {code}"),
                        ));
                    }
                    if attempt < OPEN_ATTEMPTS {
                        std::thread::sleep(delay);
                        delay *= 2;
                    }
                }
                other => return Err(transport(format!("a {other:?} frame for route.open"))),
            }
        }
        Err(transport("the vault's route stayed unavailable (retried)"))
    }
}

impl Conn {
    /// A request on (channel, epoch) and its terminal frame.
    fn exchange(
        &mut self,
        channel: u16,
        epoch: u32,
        body: &[u8],
    ) -> Result<FrameIn, CredentialResolverError> {
        let corr = self.next_corr;
        self.next_corr += 1;
        let flags = if channel == 0 {
            frames::control()
        } else {
            frames::data()
        };
        let frame = frames::encode(
            FrameType::Request,
            flags,
            channel,
            epoch,
            corr,
            body.to_vec(),
        )
        .map_err(transport)?;
        self.stream
            .write_all(&frame)
            .map_err(|e| transport(format!("writing to the daemon: {e}")))?;
        let mut buf = [0u8; 16 * 1024];
        loop {
            while let Some(f) = self.decoder.next_frame().map_err(transport)? {
                let h = f.header;
                if h.channel == channel && h.corr == corr {
                    return Ok(f);
                }
                if h.channel == 0 && h.ty == FrameType::Ping {
                    let pong = frames::encode(FrameType::Pong, h.flags, 0, 0, h.corr, Vec::new())
                        .map_err(transport)?;
                    let _ = self.stream.write_all(&pong);
                }
            }
            let n = match self.stream.read(&mut buf) {
                Ok(0) => return Err(transport("the daemon closed the vault's connection")),
                Ok(n) => n,
                Err(e) => return Err(transport(format!("waiting for the vault: {e}"))),
            };
            self.decoder.push(&buf[..n]);
        }
    }

    /// A `{method, params}` request on the vault's route: its answer, or the vault's error.
    fn request(&mut self, body: &[u8]) -> Result<Value, CredentialResolverError> {
        let reply = self.exchange(self.channel, self.epoch, body)?;
        match reply.header.ty {
            FrameType::Response => {
                let v: Value = serde_json::from_slice(&reply.body)
                    .map_err(|e| transport(format!("a vault answer that does not parse: {e}")))?;
                Ok(v)
            }
            FrameType::Error => Err(decode_wire_error(&reply.body)),
            other => Err(transport(format!("a {other:?} frame from the vault"))),
        }
    }
}
