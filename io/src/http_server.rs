//! The server side of HTTP/1.1, sans-IO: a request decoder (head via httparse, a body framed
//! by Content-Length, limits on head and body, pipelined requests kept in order) and the
//! response head writer. Chunked request bodies are refused with 411: clients of the
//! management surface send a length.

use std::fmt;

/// Limits of one request.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub head_bytes_max: usize,
    pub headers_max: usize,
    pub body_bytes_max: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            head_bytes_max: 16 * 1024,
            headers_max: 64,
            body_bytes_max: 8 * 1024 * 1024,
        }
    }
}

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The request target (path and query).
    pub target: String,
    pub headers: Vec<(String, Vec<u8>)>,
    /// HTTP/1.1 without `Connection: close` (or 1.0 with keep-alive).
    pub keep_alive: bool,
}

impl RequestHead {
    /// The first value of header `name` (case-insensitive), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The query's value for `key` (percent-decoded), if present.
    pub fn query(&self, key: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k)? == key)
                .then(|| percent_decode(v))
                .flatten()
        })
    }
}

/// Decodes `%XX` and `+` in a query component; `None` when it is not valid UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Why a request cannot be served; each maps to a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    HeadTooLarge { limit: usize },
    BodyTooLarge { limit: usize, length: usize },
    LengthRequired,
    Malformed(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::HeadTooLarge { limit } => write!(f, "request head over {limit} bytes"),
            RequestError::BodyTooLarge { limit, length } => {
                write!(
                    f,
                    "request body of {length} bytes is over the {limit}-byte limit"
                )
            }
            RequestError::LengthRequired => {
                write!(
                    f,
                    "a request body needs Content-Length (chunked bodies are not taken)"
                )
            }
            RequestError::Malformed(why) => write!(f, "malformed request: {why}"),
        }
    }
}

/// Decodes the requests of one connection.
#[derive(Debug)]
pub struct RequestDecoder {
    buf: Vec<u8>,
    limits: ServerLimits,
    /// The head of the request whose body is awaited, and the body's length.
    head: Option<(RequestHead, usize)>,
}

impl RequestDecoder {
    pub fn new(limits: ServerLimits) -> RequestDecoder {
        RequestDecoder {
            buf: Vec::new(),
            limits,
            head: None,
        }
    }

    /// Adds bytes read from the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Whether no part of a request is buffered (a close here loses nothing).
    pub fn is_idle(&self) -> bool {
        self.buf.is_empty() && self.head.is_none()
    }

    /// The request head at the start of the buffer, with its body's length and the bytes it
    /// takes; `None` while it is incomplete.
    fn parse_head(&self) -> Result<Option<(RequestHead, usize, usize)>, RequestError> {
        let too_large = RequestError::HeadTooLarge {
            limit: self.limits.head_bytes_max,
        };
        let mut headers = vec![httparse::EMPTY_HEADER; self.limits.headers_max];
        let mut req = httparse::Request::new(&mut headers);
        let used = match req.parse(&self.buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if self.buf.len() > self.limits.head_bytes_max => {
                return Err(too_large)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(too_large),
            Err(e) => return Err(RequestError::Malformed(e.to_string())),
        };
        if used > self.limits.head_bytes_max {
            return Err(too_large);
        }
        let version = req.version.unwrap_or(1);
        let headers: Vec<(String, Vec<u8>)> = req
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect();
        let find = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| String::from_utf8_lossy(v).trim().to_ascii_lowercase())
        };
        if find("transfer-encoding").is_some() {
            return Err(RequestError::LengthRequired);
        }
        let length = content_length(&headers)?;
        if length > self.limits.body_bytes_max {
            return Err(RequestError::BodyTooLarge {
                limit: self.limits.body_bytes_max,
                length,
            });
        }
        let connection = find("connection");
        let keep_alive = match version {
            0 => connection.as_deref() == Some("keep-alive"),
            _ => connection.as_deref() != Some("close"),
        };
        let head = RequestHead {
            method: req.method.unwrap_or("").to_string(),
            target: req.path.unwrap_or("").to_string(),
            headers,
            keep_alive,
        };
        Ok(Some((head, length, used)))
    }

    /// The next complete request, if the bytes so far hold one.
    pub fn next(&mut self) -> Result<Option<(RequestHead, Vec<u8>)>, RequestError> {
        if self.head.is_none() {
            let Some((head, length, used)) = self.parse_head()? else {
                return Ok(None);
            };
            assert!(used <= self.buf.len(), "a parsed head lies in the buffer");
            self.buf.drain(..used);
            self.head = Some((head, length));
        }
        let length = self.head.as_ref().map_or(0, |(_, l)| *l);
        assert!(
            length <= self.limits.body_bytes_max,
            "the body's length was checked"
        );
        if self.buf.len() < length {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf.drain(..length).collect();
        assert_eq!(body.len(), length);
        let (head, _) = self.head.take().expect("a head was parsed");
        Ok(Some((head, body)))
    }
}

/// The body length the Content-Length headers give: every one of them must be plain digits
/// and all must agree; anything else is ambiguous framing (a request smuggled after the
/// body), refused.
fn content_length(headers: &[(String, Vec<u8>)]) -> Result<usize, RequestError> {
    let mut length = None;
    for (_, v) in headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        let text = String::from_utf8_lossy(v);
        let digits = text.trim_matches(|c| c == ' ' || c == '\t');
        let parsed = (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| digits.parse::<usize>().ok())
            .flatten()
            .ok_or_else(|| {
                RequestError::Malformed(format!(
                    "Content-Length `{}` is not a decimal length",
                    text.escape_debug()
                ))
            })?;
        match length {
            Some(l) if l != parsed => {
                return Err(RequestError::Malformed(format!(
                    "two Content-Length headers disagree ({l} and {parsed})"
                )))
            }
            _ => length = Some(parsed),
        }
    }
    Ok(length.unwrap_or(0))
}

/// The reason phrase of the statuses the server sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        403 => "Forbidden",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        431 => "Request Header Fields Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        s if (400..500).contains(&s) => "Client Error",
        s if (500..600).contains(&s) => "Server Error",
        _ => "Unknown",
    }
}

/// A complete response with a Content-Length body.
pub fn response(status: u16, content_type: &str, body: &[u8], keep_alive: bool) -> Vec<u8> {
    response_with(status, content_type, body, keep_alive, &[])
}

/// [`response`] with `extra` header lines (name, value) after the content headers.
pub fn response_with(
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n",
        reason(status),
        body.len(),
    );
    for (name, value) in extra {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    if !keep_alive {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelined_requests_decode_in_order_at_every_split() {
        let bytes = b"POST /v1/rpc HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /healthz?x=a%20b&y=1+2 HTTP/1.1\r\nConnection: close\r\n\r\n";
        for i in 0..=bytes.len() {
            let mut d = RequestDecoder::new(ServerLimits::default());
            let mut got = Vec::new();
            for part in [&bytes[..i], &bytes[i..]] {
                d.push(part);
                while let Some(r) = d.next().unwrap() {
                    got.push(r);
                }
            }
            assert_eq!(got.len(), 2, "split at {i}");
            assert_eq!(
                (
                    got[0].0.method.as_str(),
                    got[0].0.path(),
                    got[0].1.as_slice()
                ),
                ("POST", "/v1/rpc", &b"hello"[..])
            );
            assert!(got[0].0.keep_alive && !got[1].0.keep_alive);
            assert_eq!(got[1].0.query("x").as_deref(), Some("a b"));
            assert_eq!(got[1].0.query("y").as_deref(), Some("1 2"));
            assert!(d.is_idle());
        }
    }

    #[test]
    fn agreeing_duplicate_lengths_frame_one_body() {
        let mut d = RequestDecoder::new(ServerLimits::default());
        d.push(b"POST / HTTP/1.1\r\nContent-Length: 5\r\ncontent-length:  5 \r\n\r\nhello");
        let (_, body) = d.next().unwrap().unwrap();
        assert_eq!(body, b"hello");
        assert!(d.is_idle());
    }

    #[test]
    fn every_status_sent_has_its_own_reason() {
        for status in [
            101, 200, 400, 401, 403, 404, 405, 408, 409, 411, 413, 422, 429, 431, 500, 502, 503,
            504,
        ] {
            let r = reason(status);
            assert!(
                !["Client Error", "Server Error", "Unknown"].contains(&r),
                "{status}"
            );
        }
        assert_eq!(reason(408), "Request Timeout");
    }

    #[test]
    fn limits_and_bad_requests_map_to_statuses() {
        let small = ServerLimits {
            head_bytes_max: 64,
            headers_max: 4,
            body_bytes_max: 10,
        };
        for (bytes, status) in [
            (&b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n"[..], 413),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                411,
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: -0\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", 400),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 5\r\n\r\nhello",
                400,
            ),
            (b"\x00\x01garbage\r\n\r\n", 400),
            (
                b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\ne: 5\r\n\r\n",
                431,
            ),
            (&[b'a'; 100][..], 431),
        ] {
            let mut d = RequestDecoder::new(small);
            d.push(bytes);
            let err = d.next().unwrap_err();
            // The statuses serve answers these with (broca-wire's code table).
            let answered = match err {
                RequestError::HeadTooLarge { .. } => 431,
                RequestError::BodyTooLarge { .. } => 413,
                RequestError::LengthRequired => 411,
                RequestError::Malformed(_) => 400,
            };
            assert_eq!(answered, status, "{err}");
        }
    }
}
