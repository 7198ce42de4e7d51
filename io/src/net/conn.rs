//! One client connection: a glommio TCP stream, optionally wrapped in TLS. rustls runs sans-IO:
//! ciphertext moves between its buffers and the socket here, on the shard's own executor.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::pki_types::ServerName;

use super::{with_timeout, NetError};

const TLS_READ_CHUNK: usize = 16 * 1024 + 512;

/// A connected stream.
pub struct Conn {
    tcp: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
    /// Ciphertext read from the socket and not yet handed to rustls.
    tls_in: Vec<u8>,
    tls_in_pos: usize,
    tls_out: Vec<u8>,
    tcp_eof: bool,
    /// `host:port` for error messages.
    target: String,
}

impl Conn {
    /// Resolves `host` and connects to its first address that answers within `timeout`.
    pub async fn connect(host: &str, port: u16, timeout: Duration) -> Result<Conn, NetError> {
        let target = format!("{host}:{port}");
        let addrs = resolve(host, port).await?;
        let mut last = String::from("no address");
        for addr in addrs {
            match with_timeout(timeout, TcpStream::connect(addr)).await {
                Ok(Ok(tcp)) => {
                    let _ = tcp.set_nodelay(true);
                    return Ok(Conn {
                        tcp,
                        tls: None,
                        tls_in: Vec::new(),
                        tls_in_pos: 0,
                        tls_out: Vec::new(),
                        tcp_eof: false,
                        target,
                    });
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(()) => {
                    return Err(NetError::Timeout {
                        what: "connection",
                        target,
                        after: timeout,
                    })
                }
            }
        }
        Err(NetError::Connect { target, why: last })
    }

    /// Runs the TLS handshake for `host` over this connection (SNI from `host`).
    pub async fn start_tls(
        mut self,
        config: Arc<rustls::ClientConfig>,
        host: &str,
        timeout: Duration,
    ) -> Result<Conn, NetError> {
        let tls_err = |why: String| NetError::Tls {
            host: host.to_string(),
            why,
        };
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| tls_err(format!("not a valid server name: {e}")))?;
        let tls =
            rustls::ClientConnection::new(config, name).map_err(|e| tls_err(e.to_string()))?;
        self.tls = Some(Box::new(tls));
        self.tls_in = vec![0; TLS_READ_CHUNK];
        self.tls_in_pos = TLS_READ_CHUNK;
        let handshake = async {
            loop {
                self.flush_tls().await?;
                let tls = self.tls.as_ref().expect("tls set");
                if !tls.is_handshaking() {
                    return Ok(());
                }
                if tls.wants_read() {
                    if self.tcp_eof {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the server closed the connection during the handshake",
                        ));
                    }
                    self.feed_tls().await?;
                }
            }
        };
        match with_timeout(timeout, handshake).await {
            Ok(Ok(())) => Ok(self),
            Ok(Err(e)) => Err(tls_err(e.to_string())),
            Err(()) => Err(NetError::Timeout {
                what: "TLS handshake",
                target: self.target.clone(),
                after: timeout,
            }),
        }
    }

    /// The negotiated ALPN protocol, when TLS is on.
    pub fn alpn(&self) -> Option<&[u8]> {
        self.tls.as_ref().and_then(|t| t.alpn_protocol())
    }

    /// `host:port` of the peer, as connected.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Writes all of `bytes`.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.tls {
            None => {
                self.tcp.write_all(bytes).await?;
                self.tcp.flush().await
            }
            Some(tls) => {
                tls.writer().write_all(bytes)?;
                self.flush_tls().await
            }
        }
    }

    /// Reads some bytes into `buf`; `Ok(0)` at the end of the stream. A TLS stream cut without
    /// its close_notify is an `UnexpectedEof` error: a truncation, never a clean end.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.tls.is_none() {
            return self.tcp.read(buf).await;
        }
        loop {
            let tls = self.tls.as_mut().expect("tls set");
            match tls.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.feed_tls().await?;
            self.flush_tls().await?; // alerts, key updates
        }
    }

    /// Hands rustls the next ciphertext: what is buffered, else a read from the socket (or
    /// the end of the stream).
    async fn feed_tls(&mut self) -> io::Result<()> {
        if self.tls_in_pos == self.tls_in.len() && !self.tcp_eof {
            self.tls_in.resize(TLS_READ_CHUNK, 0);
            let n = self.tcp.read(&mut self.tls_in).await?;
            self.tls_in.truncate(n);
            self.tls_in_pos = 0;
            self.tcp_eof = n == 0;
        }
        let tls = self.tls.as_mut().expect("tls set");
        let mut pending = &self.tls_in[self.tls_in_pos..];
        let before = pending.len();
        tls.read_tls(&mut pending)?;
        self.tls_in_pos += before - pending.len();
        tls.process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(())
    }

    async fn flush_tls(&mut self) -> io::Result<()> {
        let Some(tls) = self.tls.as_mut() else {
            return Ok(());
        };
        while tls.wants_write() {
            self.tls_out.clear();
            tls.write_tls(&mut self.tls_out)?;
            self.tcp.write_all(&self.tls_out).await?;
        }
        self.tcp.flush().await
    }
}

/// Resolves a host: an IP address directly, a name on the blocking pool (never on the
/// executor).
async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, NetError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let name = host.to_string();
    let found = crate::blocking::run(crate::blocking::Kind::Dns, move || {
        (name.as_str(), port)
            .to_socket_addrs()
            .map(|a| a.collect::<Vec<_>>())
    })
    .await;
    match found {
        Ok(addrs) if !addrs.is_empty() => Ok(addrs),
        Ok(_) => Err(NetError::Resolve {
            host: host.to_string(),
            why: "no address".into(),
        }),
        Err(e) => Err(NetError::Resolve {
            host: host.to_string(),
            why: e.to_string(),
        }),
    }
}
