//! HTTPS proxies: `HTTPS_PROXY` (or `https_proxy`) names an HTTP proxy that TLS connections
//! tunnel through with CONNECT; `NO_PROXY` (or `no_proxy`) lists hosts reached directly.
//! Loopback hosts are never proxied, and plain-http targets (loopback only) neither.

use std::fmt;
use std::time::Duration;

use super::conn::Conn;
use super::{base64, with_timeout, NetError, Scheme, Url};

const CONNECT_HEAD_MAX: usize = 16 * 1024;

/// Where TLS connections go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    proxy: Option<Url>,
    /// The `Proxy-Authorization` value, from the proxy URL's user info (never logged).
    auth: Option<String>,
    /// Host suffixes (or `*`) reached directly.
    no_proxy: Vec<String>,
}

impl std::fmt::Display for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.proxy {
            Some(p) => write!(f, "{p}"),
            None => write!(f, "none"),
        }
    }
}

/// A proxy setting that cannot be used: the variable it came from (when read from the
/// environment) and what is wrong, never the proxy's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyError {
    pub variable: Option<&'static str>,
    pub problem: String,
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.variable {
            Some(v) => write!(f, "{v}: {}", self.problem),
            None => f.write_str(&self.problem),
        }
    }
}

impl std::error::Error for ProxyError {}

impl From<ProxyError> for String {
    fn from(e: ProxyError) -> String {
        e.to_string()
    }
}

impl ProxyConfig {
    /// From the environment. `Err` names the variable and what is wrong.
    pub fn from_env() -> Result<ProxyConfig, ProxyError> {
        let var = |names: [&str; 2]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        ProxyConfig::parse(
            var(["HTTPS_PROXY", "https_proxy"]).as_deref(),
            var(["NO_PROXY", "no_proxy"]).as_deref(),
        )
        .map_err(|e| ProxyError {
            variable: Some("HTTPS_PROXY"),
            ..e
        })
    }

    /// From the values of HTTPS_PROXY and NO_PROXY.
    pub fn parse(
        https_proxy: Option<&str>,
        no_proxy: Option<&str>,
    ) -> Result<ProxyConfig, ProxyError> {
        let no_proxy = no_proxy
            .unwrap_or("")
            .split(',')
            .map(|h| h.trim().trim_start_matches('.').to_ascii_lowercase())
            .map(|h| match h.rsplit_once(':') {
                Some((host, port)) if port.parse::<u16>().is_ok() && !host.contains(':') => {
                    host.to_string()
                }
                _ => h,
            })
            .filter(|h| !h.is_empty())
            .collect();
        let Some(text) = https_proxy.map(str::trim) else {
            return Ok(ProxyConfig {
                no_proxy,
                ..ProxyConfig::default()
            });
        };
        let with_scheme = if text.contains("://") {
            text.to_string()
        } else {
            format!("http://{text}")
        };
        let (scheme, rest) = with_scheme.split_once("://").expect("has a scheme");
        let (auth, hostpart) = match rest.rsplit_once('@') {
            Some((user, host)) => (Some(format!("Basic {}", base64(user.as_bytes()))), host),
            None => (None, rest),
        };
        // The proxy's address is not repeated: it may carry credentials.
        let url = Url::parse(&format!("{scheme}://{hostpart}")).map_err(|e| ProxyError {
            variable: None,
            problem: e.to_string().replace(hostpart, "<proxy>"),
        })?;
        if url.scheme != Scheme::Http {
            return Err(ProxyError {
                variable: None,
                problem: format!(
                    "proxy scheme `{}` is not supported (use an http:// proxy; TLS runs inside \
                     its tunnel)",
                    url.scheme.as_str()
                ),
            });
        }
        Ok(ProxyConfig {
            proxy: Some(url),
            auth,
            no_proxy,
        })
    }

    /// The proxy to tunnel through for `target`, if any.
    pub fn for_target(&self, target: &Url) -> Option<&Url> {
        let proxy = self.proxy.as_ref()?;
        if !target.scheme.is_tls() || target.is_loopback() {
            return None;
        }
        let host = target.host.as_str();
        let direct = self.no_proxy.iter().any(|np| {
            np == "*"
                || host == np
                || (host.len() > np.len()
                    && host.ends_with(np.as_str())
                    && host.as_bytes()[host.len() - np.len() - 1] == b'.')
        });
        (!direct).then_some(proxy)
    }

    /// Opens a connection to `target` through the proxy: CONNECT, then the caller runs TLS.
    pub async fn tunnel(
        &self,
        proxy: &Url,
        target: &Url,
        timeout: Duration,
    ) -> Result<Conn, NetError> {
        let proxy_err = |why: String| NetError::Proxy {
            proxy: proxy.authority(),
            why,
        };
        let mut conn = Conn::connect(&proxy.host, proxy.port, timeout).await?;
        let authority = format!("{}:{}", bracket(&target.host), target.port);
        let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
        if let Some(auth) = &self.auth {
            head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
        }
        head.push_str("\r\n");
        let exchange = async {
            conn.write_all(head.as_bytes())
                .await
                .map_err(|e| proxy_err(format!("writing CONNECT: {e}")))?;
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            loop {
                // Read a byte at a time past the head's start so no tunnel byte is consumed.
                let want = if got.len() < 4 { buf.len().min(12) } else { 1 };
                let n = conn
                    .read(&mut buf[..want])
                    .await
                    .map_err(|e| proxy_err(format!("reading the CONNECT reply: {e}")))?;
                if n == 0 {
                    return Err(proxy_err("closed the connection during CONNECT".into()));
                }
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(b"\r\n\r\n") {
                    break;
                }
                if got.len() > CONNECT_HEAD_MAX {
                    return Err(proxy_err("CONNECT reply head too large".into()));
                }
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            resp.parse(&got)
                .map_err(|e| proxy_err(format!("malformed CONNECT reply: {e}")))?;
            match resp.code {
                Some(code) if (200..300).contains(&code) => Ok(()),
                Some(407) => Err(proxy_err("proxy authentication required (407)".into())),
                Some(code) => Err(proxy_err(format!("refused the tunnel with status {code}"))),
                None => Err(proxy_err("CONNECT reply has no status".into())),
            }
        };
        match with_timeout(timeout, exchange).await {
            Ok(r) => r.map(|()| conn),
            Err(()) => Err(NetError::Timeout {
                what: "CONNECT reply",
                target: proxy.authority(),
                after: timeout,
            }),
        }
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn no_proxy_matches_hosts_and_domain_suffixes() {
        let p = ProxyConfig::parse(
            Some("proxy.corp:3128"),
            Some("internal.corp, .example.com,10.0.0.1:443"),
        )
        .unwrap();
        let via = |u: &str| p.for_target(&url(u)).map(|p| p.authority());
        assert_eq!(
            via("https://api.openai.com"),
            Some("proxy.corp:3128".into())
        );
        assert_eq!(via("https://internal.corp"), None);
        assert_eq!(via("https://a.internal.corp"), None);
        assert_eq!(
            via("https://notinternal.corp"),
            Some("proxy.corp:3128".into())
        );
        assert_eq!(via("https://api.example.com"), None);
        assert_eq!(via("https://10.0.0.1"), None);
        assert_eq!(
            via("http://127.0.0.1:9"),
            None,
            "plain http is never proxied"
        );
        assert_eq!(
            via("https://localhost:9"),
            None,
            "loopback is never proxied"
        );
        let all = ProxyConfig::parse(Some("http://p:1"), Some("*")).unwrap();
        assert!(all.for_target(&url("https://api.openai.com")).is_none());
    }

    #[test]
    fn proxy_credentials_become_basic_auth_and_stay_out_of_errors() {
        let p = ProxyConfig::parse(Some("http://alice:s3cret@p:8080"), None).unwrap();
        assert_eq!(p.auth.as_deref(), Some("Basic YWxpY2U6czNjcmV0"));
        assert_eq!(p.to_string(), "http://p:8080");
        let err = ProxyConfig::parse(Some("http://alice:s3cret@p:notaport"), None).unwrap_err();
        assert!(!err.problem.contains("s3cret"), "{err}");
        let err = ProxyConfig::parse(Some("https://p:1"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not supported"), "{err}");
    }
}
