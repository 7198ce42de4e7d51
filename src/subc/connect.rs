//! Connecting to the daemon, before the shards start: the owner-only connection file, a
//! loopback TCP connection, the handshake (the daemon proves it holds the file's key before
//! broca proves it does), HELLO and the daemon's HELLO_ACK. Blocking, with a deadline on
//! every step: a daemon that cannot be reached or refuses is an error within seconds, and
//! broca never goes on without it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use subc_protocol::{ErrorBody, FrameType, ModuleHelloAckBody, ModuleHelloBody};
use subc_transport::auth::{
    compute_proof, ClientAuth, ClientHello, ServerProof, CLIENT_AUTH_DOMAIN, DEFAULT_CLIENT_ROLE,
    MAX_AUTH_MESSAGE_LEN, NONCE_LEN, SERVER_PROOF_DOMAIN,
};
use subc_transport::connection_file::{read_for_client, ConnectionInfo};

use crate::frames::{self, Decoder};

/// The deadline of each step (the daemon's own handshake deadline is 2 s).
pub const STEP_DEADLINE: Duration = Duration::from_secs(2);

/// A registered connection: the socket, what the daemon answered, and any bytes read past
/// its HELLO_ACK (the decoder holds them).
#[derive(Debug)]
pub struct Registered {
    pub stream: TcpStream,
    pub ack: ModuleHelloAckBody,
    pub decoder: Decoder,
}

/// Why broca could not register with the daemon; one line each, naming what failed and
/// where, never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// The connection file is missing, unreadable, others can read it, or it is not one.
    ConnectionFile(String),
    /// No daemon answers at the file's endpoint.
    Unreachable(String),
    /// The handshake failed: the daemon's proof is wrong, or it closed the connection.
    Handshake(String),
    /// The daemon refused the HELLO (its error code and message).
    Refused(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::ConnectionFile(e) => write!(f, "the daemon's connection file: {e}"),
            ConnectError::Unreachable(e) => write!(f, "the daemon cannot be reached: {e}"),
            ConnectError::Handshake(e) => write!(f, "the handshake with the daemon failed: {e}"),
            ConnectError::Refused(e) => write!(f, "the daemon refused broca's HELLO: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// This process's launch nonce, when the daemon handed one: read once through subc-os (the
/// pipe `SUBC_LAUNCH_NONCE_FD` names, read to its end and closed; else `SUBC_LAUNCH_NONCE`),
/// then both variables are removed so no process broca starts inherits them. Call it before
/// anything is spawned or any thread started. A named descriptor that does not hold the
/// nonce is an error (never a fall back to the environment); the error never holds the nonce.
pub fn launch_nonce() -> Result<Option<String>, ConnectError> {
    let read = subc_os::launch_nonce::launch_nonce().map_err(|e| {
        ConnectError::Handshake(format!("the daemon's launch nonce cannot be read: {e}"))
    })?;
    for var in [
        subc_os::launch_nonce::LAUNCH_NONCE_FD_ENV,
        subc_os::launch_nonce::LAUNCH_NONCE_ENV,
    ] {
        // SAFETY (of the std call): no thread has been started yet (see above).
        std::env::remove_var(var);
    }
    Ok(read
        .map(|n| n.value().to_string())
        .filter(|n| !n.is_empty()))
}

/// Connects with the connection file at `file` and authenticates: a connection a consumer
/// opens routes on (it sends no HELLO). The socket keeps the step deadline as its timeouts.
pub fn authenticate(file: &Path) -> Result<TcpStream, ConnectError> {
    let info = read_for_client(file)
        .map_err(|e| ConnectError::ConnectionFile(format!("{}: {e}", file.display())))?;
    let mut stream = dial(&info)?;
    handshake(&mut stream, &info)?;
    Ok(stream)
}

/// Connects with the connection file at `file`, authenticates and registers with `hello`.
pub fn connect(file: &Path, hello: &ModuleHelloBody) -> Result<Registered, ConnectError> {
    let mut stream = authenticate(file)?;
    let body = serde_json::to_vec(hello).expect("a HELLO serializes");
    let frame = frames::encode(FrameType::Hello, frames::control(), 0, 0, 1, body)
        .map_err(|e| ConnectError::Refused(e.to_string()))?;
    stream
        .write_all(&frame)
        .map_err(|e| ConnectError::Handshake(format!("sending HELLO: {e}")))?;
    let mut decoder = Decoder::new();
    let reply = read_frame(&mut stream, &mut decoder, "HELLO_ACK")?;
    let ack = match reply.header.ty {
        FrameType::HelloAck => serde_json::from_slice::<ModuleHelloAckBody>(&reply.body)
            .map_err(|e| ConnectError::Refused(format!("a HELLO_ACK that does not parse: {e}")))?,
        FrameType::Error => {
            let why = serde_json::from_slice::<ErrorBody>(&reply.body)
                .map(|e| format!("{}: {}", e.code, e.message))
                .unwrap_or_else(|_| String::from_utf8_lossy(&reply.body).into_owned());
            return Err(ConnectError::Refused(why));
        }
        other => {
            return Err(ConnectError::Refused(format!(
                "a {other:?} frame where HELLO_ACK was due"
            )))
        }
    };
    // broca speaks one version of the wire: a daemon that settles on another is refused here,
    // before any frame of it is read as this one's.
    if ack.negotiated_ver != hello.protocol_ver {
        return Err(ConnectError::Refused(format!(
            "the daemon negotiated wire protocol version {}; broca speaks version {}",
            ack.negotiated_ver, hello.protocol_ver
        )));
    }
    match ack.machine_id.as_deref() {
        Some(id) => tracing::info!(machine = id, "registered with the daemon"),
        None => tracing::info!("registered with the daemon (it names no machine)"),
    }
    if ack.storage.is_some() {
        tracing::info!("the daemon offers managed storage; broca keeps its own state dir");
    }
    let clear = |e: std::io::Error| ConnectError::Handshake(e.to_string());
    stream.set_read_timeout(None).map_err(clear)?;
    stream.set_write_timeout(None).map_err(clear)?;
    Ok(Registered {
        stream,
        ack,
        decoder,
    })
}

fn dial(info: &ConnectionInfo) -> Result<TcpStream, ConnectError> {
    let ep = info
        .endpoints
        .first()
        .ok_or_else(|| ConnectError::ConnectionFile("it names no endpoint".into()))?;
    let host = ep.host.trim_start_matches('[').trim_end_matches(']');
    let shown = format!("{}:{}", ep.host, ep.port);
    let addr = (host, ep.port)
        .to_socket_addrs()
        .map_err(|e| ConnectError::Unreachable(format!("{shown}: {e}")))?
        .next()
        .ok_or_else(|| ConnectError::Unreachable(format!("{shown}: no address")))?;
    if !addr.ip().is_loopback() {
        return Err(ConnectError::ConnectionFile(format!(
            "its endpoint {shown} is not a loopback address"
        )));
    }
    let stream = TcpStream::connect_timeout(&addr, STEP_DEADLINE)
        .map_err(|e| ConnectError::Unreachable(format!("{shown}: {e}")))?;
    let set = |e: std::io::Error| ConnectError::Unreachable(format!("{shown}: {e}"));
    stream.set_nodelay(true).map_err(set)?;
    stream.set_read_timeout(Some(STEP_DEADLINE)).map_err(set)?;
    stream.set_write_timeout(Some(STEP_DEADLINE)).map_err(set)?;
    Ok(stream)
}

/// The handshake: ClientHello, the daemon's ServerProof (checked against the file's key and
/// daemon id before anything of broca's is proven), ClientAuth.
fn handshake(stream: &mut TcpStream, info: &ConnectionInfo) -> Result<(), ConnectError> {
    let mut client_nonce = [0u8; NONCE_LEN];
    random(&mut client_nonce)?;
    write_message(
        stream,
        &ClientHello {
            client_nonce,
            role: DEFAULT_CLIENT_ROLE.to_string(),
        },
    )?;
    let proof: ServerProof = read_message(stream)?;
    let expected = compute_proof(
        &info.key,
        SERVER_PROOF_DOMAIN,
        &client_nonce,
        &proof.server_nonce,
        &proof.daemon_id,
    );
    if !same(&expected, &proof.server_proof) {
        return Err(ConnectError::Handshake(
            "the daemon's proof does not match the connection file's key (a stale file, or \
             not the daemon that wrote it)"
                .into(),
        ));
    }
    if proof.daemon_id != info.daemon_id {
        return Err(ConnectError::Handshake(
            "the daemon's id is not the connection file's".into(),
        ));
    }
    let client_auth = compute_proof(
        &info.key,
        CLIENT_AUTH_DOMAIN,
        &client_nonce,
        &proof.server_nonce,
        &proof.daemon_id,
    );
    write_message(stream, &ClientAuth { client_auth })
}

/// Compares two proofs in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random(buf: &mut [u8]) -> Result<(), ConnectError> {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: writes at most `buf.len() - filled` bytes into the rest of `buf`.
        let n =
            unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), buf.len() - filled, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ConnectError::Handshake(format!("no random nonce: {e}")));
        }
        filled += n as usize;
    }
    Ok(())
}

/// A handshake message: a 4-byte little-endian length, then JSON.
fn write_message(
    stream: &mut TcpStream,
    message: &impl serde::Serialize,
) -> Result<(), ConnectError> {
    let body = serde_json::to_vec(message).expect("handshake messages serialize");
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    stream
        .write_all(&out)
        .map_err(|e| ConnectError::Handshake(format!("writing to the daemon: {e}")))
}

fn read_message<T: serde::de::DeserializeOwned>(stream: &mut TcpStream) -> Result<T, ConnectError> {
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
            ConnectError::Handshake("the daemon closed the connection: it refused broca".into())
        }
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => ConnectError::Handshake(
            format!("the daemon did not answer within {STEP_DEADLINE:?}"),
        ),
        _ => ConnectError::Handshake(format!("reading from the daemon: {e}")),
    };
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(closed)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_AUTH_MESSAGE_LEN {
        return Err(ConnectError::Handshake(format!(
            "a handshake message of {len} bytes (at most {MAX_AUTH_MESSAGE_LEN})"
        )));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).map_err(closed)?;
    serde_json::from_slice(&body).map_err(|e| {
        ConnectError::Handshake(format!("a handshake message that does not parse: {e}"))
    })
}

/// Reads until the decoder holds a frame.
pub(crate) fn read_frame(
    stream: &mut TcpStream,
    decoder: &mut Decoder,
    what: &str,
) -> Result<frames::FrameIn, ConnectError> {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(f) = decoder
            .next_frame()
            .map_err(|e| ConnectError::Refused(e.to_string()))?
        {
            return Ok(f);
        }
        let n = match stream.read(&mut buf) {
            Ok(0) => {
                return Err(ConnectError::Refused(format!(
                    "the daemon closed the connection before {what} (it refused broca's proof: \
                     is the connection file the daemon's?)"
                )))
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ConnectError::Refused(format!(
                    "no {what} within {STEP_DEADLINE:?}"
                )))
            }
            Err(e) => return Err(ConnectError::Refused(format!("waiting for {what}: {e}"))),
        };
        decoder.push(&buf[..n]);
    }
}
