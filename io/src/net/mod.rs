//! The network client: TCP on glommio sockets, TLS with rustls driven sans-IO over them, an
//! HTTP/1.1 client with a keep-alive pool per origin, CONNECT proxies, and a WebSocket client
//! (tungstenite over the same connection). Everything runs on the calling shard's executor.

pub mod client;
pub mod conn;
pub mod proxy;
pub mod tls;
pub mod ws;

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

pub use client::{ClientConfig, ClientStats, HttpClient, Request, Response};
pub use conn::Conn;
pub use rustls;

/// A URL scheme the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
    Ws,
    Wss,
}

impl Scheme {
    /// Whether the scheme runs over TLS.
    pub fn is_tls(self) -> bool {
        matches!(self, Scheme::Https | Scheme::Wss)
    }

    fn default_port(self) -> u16 {
        if self.is_tls() {
            443
        } else {
            80
        }
    }

    /// The scheme's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Ws => "ws",
            Scheme::Wss => "wss",
        }
    }
}

/// A parsed `scheme://host[:port][/prefix]` URL (no query, no fragment, no user info).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Url {
    pub scheme: Scheme,
    /// The host as written (an IPv6 address without its brackets).
    pub host: String,
    pub port: u16,
    /// The path prefix, without a trailing `/` (empty for none).
    pub prefix: String,
}

/// A base URL that does not parse: the URL as written and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError {
    pub url: String,
    pub problem: String,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "URL `{}`: {}", self.url, self.problem)
    }
}

impl std::error::Error for UrlError {}

impl From<UrlError> for String {
    fn from(e: UrlError) -> String {
        e.to_string()
    }
}

impl Url {
    /// Parses a base URL. `Err` says what is wrong with it.
    pub fn parse(text: &str) -> Result<Url, UrlError> {
        let bad = |why: &str| UrlError {
            url: text.to_string(),
            problem: why.to_string(),
        };
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("it has no scheme (expected https://...)"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "ws" => Scheme::Ws,
            "wss" => Scheme::Wss,
            other => {
                return Err(bad(&format!(
                    "scheme `{other}` is not http, https, ws or wss"
                )))
            }
        };
        if rest.contains(['?', '#']) {
            return Err(bad("a base URL takes no query or fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("credentials do not belong in a base URL"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 host lacks its `]`"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("junk after the IPv6 host"))?,
                ),
            };
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("it has no host"));
        }
        let port = match port {
            None => scheme.default_port(),
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(&format!("port `{p}` is not a number from 1 to 65535")))?,
        };
        Ok(Url {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// Whether the host is a loopback name or address.
    pub fn is_loopback(&self) -> bool {
        host_is_loopback(&self.host)
    }

    /// `host:port` as a `Host` header or CONNECT target says it.
    pub fn authority(&self) -> String {
        let default = self.port == self.scheme.default_port();
        match (self.host.contains(':'), default) {
            (true, true) => format!("[{}]", self.host),
            (true, false) => format!("[{}]:{}", self.host, self.port),
            (false, true) => self.host.clone(),
            (false, false) => format!("{}:{}", self.host, self.port),
        }
    }

    /// The key connections are pooled under.
    pub fn origin(&self) -> String {
        format!("{}://{}:{}", self.scheme.as_str(), self.host, self.port)
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.prefix
        )
    }
}

/// Whether `host` names this machine's loopback interface.
pub fn host_is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// Connection timeouts.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Resolving and connecting (and the TLS handshake).
    pub connect: Duration,
    /// From the request written to the response head.
    pub first_byte: Duration,
    /// The longest silence inside a response body.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(300),
            idle: Duration::from_secs(120),
        }
    }
}

/// Why a network operation failed. Every variant names where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetError {
    /// The URL or its use is wrong (never retried).
    Url(String),
    /// The host name did not resolve.
    Resolve { host: String, why: String },
    /// The TCP connection was refused or failed.
    Connect { target: String, why: String },
    /// The TLS handshake or a TLS record failed.
    Tls { host: String, why: String },
    /// A timeout passed.
    Timeout {
        what: &'static str,
        target: String,
        after: Duration,
    },
    /// The connection broke (reset, closed early) while in use.
    Io { target: String, why: String },
    /// The response is not valid HTTP/1.1 or is over a limit.
    Http { target: String, why: String },
    /// The proxy refused or failed the tunnel.
    Proxy { proxy: String, why: String },
    /// The WebSocket handshake or a frame failed.
    WebSocket { target: String, why: String },
}

impl NetError {
    /// Whether the failure may pass if tried again (transient network trouble).
    pub fn is_transient(&self) -> bool {
        !matches!(self, NetError::Url(_) | NetError::Tls { .. })
    }
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::Url(why) => write!(f, "{why}"),
            NetError::Resolve { host, why } => write!(f, "cannot resolve {host}: {why}"),
            NetError::Connect { target, why } => write!(f, "cannot connect to {target}: {why}"),
            NetError::Tls { host, why } => write!(f, "TLS with {host} failed: {why}"),
            NetError::Timeout {
                what,
                target,
                after,
            } => {
                write!(f, "{target}: no {what} within {} ms", after.as_millis())
            }
            NetError::Io { target, why } => write!(f, "connection to {target} broke: {why}"),
            NetError::Http { target, why } => write!(f, "bad HTTP response from {target}: {why}"),
            NetError::Proxy { proxy, why } => write!(f, "proxy {proxy}: {why}"),
            NetError::WebSocket { target, why } => write!(f, "WebSocket {target}: {why}"),
        }
    }
}

impl std::error::Error for NetError {}

/// Standard base64 with padding (proxy credentials, WebSocket keys).
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Waits `after` on this executor's timer.
pub async fn sleep(after: Duration) {
    glommio::timer::sleep(after).await;
}

/// Runs `fut` with a deadline; `Err(())` when it passed.
pub async fn with_timeout<T>(
    after: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, ()> {
    futures_lite::future::or(async { Ok(fut.await) }, async {
        glommio::timer::sleep(after).await;
        Err(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_parse_with_their_defaults() {
        let u = Url::parse("https://api.anthropic.com").unwrap();
        assert_eq!(
            (u.scheme, u.host.as_str(), u.port, u.prefix.as_str()),
            (Scheme::Https, "api.anthropic.com", 443, "")
        );
        let u = Url::parse("http://127.0.0.1:8080/proxy/v2/").unwrap();
        assert_eq!((u.port, u.prefix.as_str()), (8080, "/proxy/v2"));
        assert!(u.is_loopback());
        let u = Url::parse("ws://[::1]:9/").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 9, "[::1]:9".to_string())
        );
        assert!(u.is_loopback());
        assert_eq!(Url::parse("https://h:443").unwrap().authority(), "h");
    }

    #[test]
    fn bad_base_urls_say_what_is_wrong() {
        for (text, says) in [
            ("api.openai.com", "no scheme"),
            ("ftp://x", "scheme `ftp`"),
            ("https://:80", "no host"),
            ("https://h:0", "port `0`"),
            ("https://h:99999", "port `99999`"),
            ("https://user:pw@h", "credentials"),
            ("https://h/x?y=1", "no query"),
            ("https://[::1", "`]`"),
        ] {
            let err = Url::parse(text).unwrap_err();
            assert_eq!(err.url, text);
            assert!(err.problem.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), enc);
        }
    }
}
