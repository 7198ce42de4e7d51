//! A server-sent events decoder, sans-IO and correct at every chunk boundary: feed it bytes as
//! they arrive, in pieces of any size, and it yields the same events. Lines end in CRLF, LF or
//! CR; `data` lines join with LF; `:` lines are comments; `id` (without NUL) and `retry`
//! (digits only) are kept; a blank line dispatches the event (none when no data was given).

use std::fmt;

/// The largest event (its data) accepted by default.
pub const EVENT_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// One dispatched event, borrowed from the decoder until the callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event` field, when given.
    pub event: Option<&'a str>,
    /// The data lines, joined with LF.
    pub data: &'a str,
    /// The last event id seen so far in the stream, when any.
    pub id: Option<&'a str>,
}

/// Why a stream cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// An event or a line grew past the limit.
    TooLarge { limit: usize },
    /// An event's data is not UTF-8.
    NotUtf8,
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::TooLarge { limit } => {
                write!(f, "server-sent event larger than {limit} bytes")
            }
            SseError::NotUtf8 => write!(f, "server-sent event data is not UTF-8"),
        }
    }
}

impl std::error::Error for SseError {}

/// The decoder's state between chunks. Its buffers are reused: after the first events, a
/// stream decodes without allocating.
#[derive(Debug)]
pub struct SseDecoder {
    /// A line that began in an earlier chunk (lines inside one chunk are never copied).
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    event: String,
    has_event: bool,
    last_id: Option<String>,
    retry_ms: Option<u64>,
    /// The previous chunk ended in CR: an LF first in the next chunk ends no new line.
    after_cr: bool,
    at_start: bool,
    limit: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::new(EVENT_BYTES_MAX_DEFAULT)
    }
}

impl SseDecoder {
    /// A decoder that refuses events (and lines) larger than `limit` bytes.
    pub fn new(limit: usize) -> SseDecoder {
        SseDecoder {
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event: String::new(),
            has_event: false,
            last_id: None,
            retry_ms: None,
            after_cr: false,
            at_start: true,
            limit,
        }
    }

    /// The last `retry` the server asked for, in milliseconds.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// The last event id seen.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Decodes `chunk`, handing each complete event to `on_event`.
    pub fn push(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) -> Result<(), SseError> {
        if self.at_start && !chunk.is_empty() {
            // A UTF-8 byte order mark may open the stream; it can be split across chunks.
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let have = self.line.len();
            let take = (BOM.len() - have).min(chunk.len());
            if BOM[..have] == self.line[..] && chunk[..take] == BOM[have..have + take] {
                if have + take == BOM.len() {
                    self.line.clear();
                    self.at_start = false;
                } else {
                    self.line.extend_from_slice(&chunk[..take]);
                }
                chunk = &chunk[take..];
            } else {
                self.at_start = false;
            }
            if self.at_start {
                return Ok(());
            }
        }
        if chunk.is_empty() {
            return Ok(()); // an empty chunk must not forget a CR that ended the last one
        }
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            if self.line.is_empty() {
                self.check_line(end)?;
                self.field(&chunk[..end], on_event)?;
            } else {
                self.extend_line(&chunk[..end])?;
                let line = std::mem::take(&mut self.line);
                let r = self.field(&line, on_event);
                self.line = line;
                self.line.clear();
                r?;
            }
            assert!(end < chunk.len(), "a line end was found inside the chunk");
            let is_cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if is_cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
        }
        self.extend_line(chunk)
    }

    fn check_line(&self, len: usize) -> Result<(), SseError> {
        if len > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
        }
        Ok(())
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        self.check_line(self.line.len() + bytes.len())?;
        self.line.extend_from_slice(bytes);
        assert!(
            self.line.len() <= self.limit,
            "a partial line stays within its limit"
        );
        Ok(())
    }

    /// Handles one complete line (without its end).
    fn field(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) -> Result<(), SseError> {
        if line.is_empty() {
            return self.dispatch(on_event);
        }
        if line[0] == b':' {
            return Ok(()); // a comment
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > self.limit {
                    return Err(SseError::TooLarge { limit: self.limit });
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                assert!(
                    self.data.len() <= self.limit,
                    "an event's data stays within its limit"
                );
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.push_str(&String::from_utf8_lossy(value));
                self.has_event = true;
            }
            b"id" if !value.contains(&0) => {
                self.last_id = Some(String::from_utf8_lossy(value).into_owned())
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                self.retry_ms = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            _ => {} // unknown fields are ignored
        }
        Ok(())
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(SseEvent<'_>)) -> Result<(), SseError> {
        let has_event = std::mem::take(&mut self.has_event);
        if !std::mem::take(&mut self.has_data) {
            return Ok(());
        }
        let data = std::str::from_utf8(&self.data).map_err(|_| SseError::NotUtf8);
        let r = data.map(|data| {
            on_event(SseEvent {
                event: has_event.then_some(self.event.as_str()),
                data,
                id: self.last_id.as_deref(),
            })
        });
        self.data.clear();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] = b"\xEF\xBB\xBF: a comment\r\n\
retry: 1500\n\
event: message_start\r\n\
data: {\"type\":\"message_start\"}\r\n\
\r\n\
data: line one\n\
data:line two\n\
data\n\
id: 7\n\
\n\
event: ping\rdata: \xC3\xA9t\xC3\xA9\r\r\
: keep-alive\n\n\
id: with\0nul\n\
data: last\n\n\
data: never dispatched without a blank line";

    type Owned = (Option<String>, String, Option<String>);

    fn decode(chunks: &[&[u8]]) -> (Vec<Owned>, Option<u64>) {
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.push(c, &mut |e| {
                out.push((
                    e.event.map(str::to_string),
                    e.data.to_string(),
                    e.id.map(str::to_string),
                ))
            })
            .unwrap();
        }
        (out, d.retry_ms())
    }

    fn expected() -> Vec<Owned> {
        let some = |s: &str| Some(s.to_string());
        vec![
            (
                some("message_start"),
                "{\"type\":\"message_start\"}".into(),
                None,
            ),
            (None, "line one\nline two\n".into(), some("7")),
            (some("ping"), "été".into(), some("7")),
            (None, "last".into(), some("7")),
        ]
    }

    #[test]
    fn the_whole_stream_decodes() {
        assert_eq!(decode(&[STREAM]), (expected(), Some(1500)));
    }

    #[test]
    fn every_split_into_two_and_three_chunks_gives_the_same_events() {
        for i in 0..=STREAM.len() {
            assert_eq!(
                decode(&[&STREAM[..i], &STREAM[i..]]).0,
                expected(),
                "split at {i}"
            );
            for j in i..=STREAM.len() {
                let parts = [&STREAM[..i], &STREAM[i..j], &STREAM[j..]];
                assert_eq!(decode(&parts).0, expected(), "split at {i} and {j}");
            }
        }
    }

    #[test]
    fn byte_by_byte_gives_the_same_events() {
        let parts: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(decode(&parts), (expected(), Some(1500)));
    }

    #[test]
    fn oversized_events_and_lines_are_refused() {
        let mut d = SseDecoder::new(16);
        let err = d
            .push(b"data: 0123456789abcdefXYZ\n\n", &mut |_| {})
            .unwrap_err();
        assert_eq!(err, SseError::TooLarge { limit: 16 });
        let mut d = SseDecoder::new(16);
        assert!(d
            .push(b"data: 0123456789\ndata: 0123456789\n\n", &mut |_| {})
            .is_err());
    }

    #[test]
    fn data_that_is_not_utf8_is_an_error() {
        let mut d = SseDecoder::default();
        assert_eq!(
            d.push(b"data: \xFF\n\n", &mut |_| {}),
            Err(SseError::NotUtf8)
        );
    }
}
