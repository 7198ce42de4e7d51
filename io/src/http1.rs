//! An HTTP/1.1 response decoder, sans-IO: feed it the bytes a connection delivers, in pieces
//! of any size, and it yields the response head, then body bytes, then the end. Bodies framed
//! by Content-Length, by chunked transfer coding (extensions and trailers skipped), or by the
//! connection closing. Limits on the head and the body; every error says what was wrong.

use std::fmt;

/// Limits of one response.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes of status line and headers.
    pub head_bytes_max: usize,
    /// The most headers.
    pub headers_max: usize,
    /// The most body bytes.
    pub body_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_bytes_max: 64 * 1024,
            headers_max: 100,
            body_bytes_max: 64 * 1024 * 1024,
        }
    }
}

/// A response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub reason: String,
    /// Header names as sent; values as bytes (they need not be UTF-8).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// The first value of header `name` (case-insensitive), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// What the decoder produced from the bytes so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Head(Head),
    Body(Vec<u8>),
    /// The body is complete; bytes after it belong to the next response.
    End,
}

/// Why a response cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    HeadTooLarge {
        limit: usize,
    },
    BodyTooLarge {
        limit: u64,
    },
    /// The bytes are not an HTTP/1.x response head.
    BadHead(String),
    /// A chunk size line is malformed.
    BadChunk(String),
    /// The connection closed before the body's end.
    Truncated {
        missing: String,
    },
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::HeadTooLarge { limit } => write!(f, "response head over {limit} bytes"),
            HttpError::BodyTooLarge { limit } => write!(f, "response body over {limit} bytes"),
            HttpError::BadHead(why) => write!(f, "malformed response head: {why}"),
            HttpError::BadChunk(why) => write!(f, "malformed chunked body: {why}"),
            HttpError::Truncated { missing } => {
                write!(
                    f,
                    "the connection closed before the response ended ({missing})"
                )
            }
        }
    }
}

impl std::error::Error for HttpError {}

#[derive(Debug)]
enum State {
    Head,
    Length { left: u64 },
    ChunkSize,
    ChunkData { left: u64 },
    ChunkDataEnd,
    Trailers,
    UntilClose,
    Done,
}

/// Decodes one response.
#[derive(Debug)]
pub struct ResponseDecoder {
    limits: Limits,
    buf: Vec<u8>,
    state: State,
    body_bytes: u64,
    /// The request was HEAD: the response has no body whatever its headers say.
    head_request: bool,
}

impl ResponseDecoder {
    /// A decoder for the response to a request (`head_request` for a HEAD request).
    pub fn new(limits: Limits, head_request: bool) -> ResponseDecoder {
        ResponseDecoder {
            limits,
            buf: Vec::new(),
            state: State::Head,
            body_bytes: 0,
            head_request,
        }
    }

    /// Whether the response is complete.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Bytes received after the end of the response (a pipelined next response).
    pub fn leftover(&self) -> &[u8] {
        if self.is_done() {
            &self.buf
        } else {
            &[]
        }
    }

    /// Feeds bytes; appends what they complete to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Part>) -> Result<(), HttpError> {
        self.buf.extend_from_slice(bytes);
        loop {
            let progressed = match self.state {
                State::Head => self.head(out)?,
                State::Length { left } => {
                    let (n, left) = self.take_body(left, out)?;
                    self.state = if left == 0 {
                        State::Done
                    } else {
                        State::Length { left }
                    };
                    if left == 0 {
                        out.push(Part::End);
                    }
                    n > 0 || left == 0
                }
                State::ChunkSize => self.chunk_size()?,
                State::ChunkData { left } => {
                    let (n, left) = self.take_body(left, out)?;
                    self.state = if left == 0 {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData { left }
                    };
                    n > 0
                }
                State::ChunkDataEnd => match self.take_line()? {
                    Some(line) if line.is_empty() => {
                        self.state = State::ChunkSize;
                        true
                    }
                    Some(_) => return Err(HttpError::BadChunk("no CRLF after chunk data".into())),
                    None => false,
                },
                State::Trailers => match self.take_line()? {
                    Some(line) if line.is_empty() => {
                        self.state = State::Done;
                        out.push(Part::End);
                        true
                    }
                    Some(_) => true, // a trailer field: skipped
                    None => false,
                },
                State::UntilClose => {
                    let n = self.buf.len();
                    if n > 0 {
                        self.body(n, out)?;
                    }
                    false
                }
                State::Done => false,
            };
            if !progressed || self.is_done() {
                return Ok(());
            }
        }
    }

    /// The connection closed: ends a close-delimited body, or says what was cut off.
    pub fn finish(&mut self, out: &mut Vec<Part>) -> Result<(), HttpError> {
        let missing = match self.state {
            State::Done => return Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                out.push(Part::End);
                return Ok(());
            }
            State::Head => "the head".to_string(),
            State::Length { left } => format!("{left} body bytes"),
            _ => "the rest of the chunked body".to_string(),
        };
        Err(HttpError::Truncated { missing })
    }

    /// Takes up to `left` body bytes from the buffer; returns how many and how many remain.
    fn take_body(&mut self, left: u64, out: &mut Vec<Part>) -> Result<(usize, u64), HttpError> {
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        if n > 0 {
            self.body(n, out)?;
        }
        Ok((n, left - n as u64))
    }

    fn body(&mut self, n: usize, out: &mut Vec<Part>) -> Result<(), HttpError> {
        self.body_bytes += n as u64;
        if self.body_bytes > self.limits.body_bytes_max {
            return Err(HttpError::BodyTooLarge {
                limit: self.limits.body_bytes_max,
            });
        }
        out.push(Part::Body(self.buf.drain(..n).collect()));
        Ok(())
    }

    fn head(&mut self, out: &mut Vec<Part>) -> Result<bool, HttpError> {
        let mut headers = vec![httparse::EMPTY_HEADER; self.limits.headers_max];
        let mut resp = httparse::Response::new(&mut headers);
        let parsed = resp
            .parse(&self.buf)
            .map_err(|e| HttpError::BadHead(e.to_string()))?;
        let httparse::Status::Complete(len) = parsed else {
            if self.buf.len() > self.limits.head_bytes_max {
                return Err(HttpError::HeadTooLarge {
                    limit: self.limits.head_bytes_max,
                });
            }
            return Ok(false);
        };
        if len > self.limits.head_bytes_max {
            return Err(HttpError::HeadTooLarge {
                limit: self.limits.head_bytes_max,
            });
        }
        let status = resp
            .code
            .ok_or_else(|| HttpError::BadHead("no status code".into()))?;
        let head = Head {
            status,
            reason: resp.reason.unwrap_or("").to_string(),
            headers: resp
                .headers
                .iter()
                .map(|h| (h.name.to_string(), h.value.to_vec()))
                .collect(),
        };
        self.buf.drain(..len);
        if (100..200).contains(&status) {
            return Ok(true); // an interim response: the real head follows
        }
        self.state = self.body_framing(&head)?;
        out.push(Part::Head(head));
        if matches!(self.state, State::Done) {
            out.push(Part::End);
        }
        Ok(true)
    }

    fn body_framing(&self, head: &Head) -> Result<State, HttpError> {
        if self.head_request || head.status == 204 || head.status == 304 {
            return Ok(State::Done);
        }
        let chunked = head.header("transfer-encoding").is_some_and(|te| {
            te.split(',')
                .any(|c| c.trim().eq_ignore_ascii_case("chunked"))
        });
        if chunked {
            return Ok(State::ChunkSize);
        }
        match head.header("content-length") {
            Some(v) => {
                let len: u64 = v.trim().parse().map_err(|_| {
                    HttpError::BadHead(format!("Content-Length `{v}` is not a number"))
                })?;
                if len > self.limits.body_bytes_max {
                    return Err(HttpError::BodyTooLarge {
                        limit: self.limits.body_bytes_max,
                    });
                }
                Ok(if len == 0 {
                    State::Done
                } else {
                    State::Length { left: len }
                })
            }
            None => Ok(State::UntilClose),
        }
    }

    fn chunk_size(&mut self) -> Result<bool, HttpError> {
        let Some(line) = self.take_line()? else {
            return Ok(false);
        };
        let text = std::str::from_utf8(&line)
            .map_err(|_| HttpError::BadChunk("size is not text".into()))?;
        let size_text = text.split(';').next().unwrap_or("").trim();
        let size = u64::from_str_radix(size_text, 16).map_err(|_| {
            HttpError::BadChunk(format!("chunk size `{size_text}` is not hexadecimal"))
        })?;
        if self.body_bytes + size > self.limits.body_bytes_max {
            return Err(HttpError::BodyTooLarge {
                limit: self.limits.body_bytes_max,
            });
        }
        self.state = if size == 0 {
            State::Trailers
        } else {
            State::ChunkData { left: size }
        };
        Ok(true)
    }

    /// A line ending in CRLF (or LF), without its ending; `None` until one is complete.
    fn take_line(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
            if self.buf.len() > self.limits.head_bytes_max {
                return Err(HttpError::BadChunk("a line without an end".into()));
            }
            return Ok(None);
        };
        let mut line: Vec<u8> = self.buf.drain(..=end).collect();
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Ok(Some(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]], close: bool) -> Result<(Head, Vec<u8>, bool), HttpError> {
        let mut d = ResponseDecoder::new(Limits::default(), false);
        let mut parts = Vec::new();
        for c in chunks {
            d.push(c, &mut parts)?;
        }
        if close {
            d.finish(&mut parts)?;
        }
        let mut head = None;
        let mut body = Vec::new();
        let mut ended = false;
        for p in parts {
            match p {
                Part::Head(h) => head = Some(h),
                Part::Body(b) => body.extend(b),
                Part::End => ended = true,
            }
        }
        Ok((head.expect("a head"), body, ended))
    }

    const CHUNKED: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n\
HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
7\r\ndata: a\r\n\
a;ext=1\r\n\ndata: bc\n\r\n\
0\r\nX-Trailer: 1\r\n\r\n";

    #[test]
    fn a_chunked_body_decodes_at_every_split() {
        for i in 0..=CHUNKED.len() {
            let (head, body, ended) = decode(&[&CHUNKED[..i], &CHUNKED[i..]], false).unwrap();
            assert_eq!(head.status, 200, "split at {i}");
            assert_eq!(head.header("content-type"), Some("text/event-stream"));
            assert_eq!(body, b"data: a\ndata: bc\n", "split at {i}");
            assert!(ended, "split at {i}");
        }
    }

    #[test]
    fn content_length_bodies_end_exactly_and_keep_what_follows() {
        let bytes = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1";
        let mut d = ResponseDecoder::new(Limits::default(), false);
        let mut parts = Vec::new();
        for b in bytes.chunks(1) {
            d.push(b, &mut parts).unwrap();
        }
        assert!(d.is_done());
        assert_eq!(d.leftover(), b"HTTP/1.1");
        let Part::Head(head) = &parts[0] else {
            panic!()
        };
        assert_eq!((head.status, head.header("retry-after")), (429, Some("2")));
        assert_eq!(parts.last(), Some(&Part::End));
    }

    #[test]
    fn a_close_delimited_body_ends_at_close_and_a_cut_body_is_an_error() {
        let (_, body, ended) = decode(&[b"HTTP/1.0 200 OK\r\n\r\nabc", b"def"], true).unwrap();
        assert_eq!((body.as_slice(), ended), (&b"abcdef"[..], true));
        let err = decode(&[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], true).unwrap_err();
        assert_eq!(
            err,
            HttpError::Truncated {
                missing: "7 body bytes".into()
            }
        );
        let err = decode(
            &[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"],
            true,
        )
        .unwrap_err();
        assert!(matches!(err, HttpError::Truncated { .. }));
    }

    #[test]
    fn malformed_and_oversized_responses_are_clear_errors() {
        assert!(matches!(
            decode(&[b"SSH-2.0-OpenSSH\r\n\r\n"], false),
            Err(HttpError::BadHead(_))
        ));
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert!(matches!(decode(&[bad], false), Err(HttpError::BadChunk(_))));
        let limits = Limits {
            head_bytes_max: 64,
            ..Limits::default()
        };
        let mut d = ResponseDecoder::new(limits, false);
        let long = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "y".repeat(100));
        assert!(matches!(
            d.push(long.as_bytes(), &mut Vec::new()),
            Err(HttpError::HeadTooLarge { .. })
        ));
        let limits = Limits {
            body_bytes_max: 3,
            ..Limits::default()
        };
        let mut d = ResponseDecoder::new(limits, false);
        let r = d.push(
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n",
            &mut Vec::new(),
        );
        assert_eq!(r, Err(HttpError::BodyTooLarge { limit: 3 }));
    }

    #[test]
    fn no_content_and_head_responses_have_no_body() {
        let (head, body, ended) = decode(&[b"HTTP/1.1 204 No Content\r\n\r\n"], false).unwrap();
        assert_eq!((head.status, body.len(), ended), (204, 0, true));
        let mut d = ResponseDecoder::new(Limits::default(), true);
        let mut parts = Vec::new();
        d.push(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", &mut parts)
            .unwrap();
        assert!(d.is_done());
        assert_eq!(parts.last(), Some(&Part::End));
    }
}
