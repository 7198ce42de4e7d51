//! The AWS event-stream framing (Bedrock's streamed answers), sans-IO and correct at every
//! chunk boundary. A message is: total length (u32 BE), headers length (u32 BE), a CRC32 of
//! those eight bytes, the headers, the payload, and a CRC32 of everything before it. Each
//! header is a name (u8 length), a type byte and a value. Both checksums are verified; a
//! message over the limit is refused before it is buffered.

use std::fmt;

/// The largest message accepted by default.
pub const MESSAGE_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

const PRELUDE: usize = 12;
const TRAILER: usize = 4;

/// A header value, borrowed from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderValue<'a> {
    Bool(bool),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Bytes(&'a [u8]),
    String(&'a str),
    Timestamp(i64),
    Uuid([u8; 16]),
}

/// One decoded message, borrowed from the bytes it was decoded from (nothing is copied or
/// allocated for it). Its headers were checked whole when it was decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    headers: &'a [u8],
    pub payload: &'a [u8],
    /// `:event-type` and `:message-type`, which every reader asks for, found when decoded.
    event_type: Option<&'a [u8]>,
    message_type: Option<&'a [u8]>,
}

impl<'a> Message<'a> {
    /// The headers, in order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, HeaderValue<'a>)> {
        let mut b = self.headers;
        // Checked when decoded: a header that does not read is not there.
        std::iter::from_fn(move || next_header(&mut b).ok().flatten())
    }

    /// A string header's value (`:event-type`, `:message-type`, `:exception-type`).
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        let known = match name {
            ":event-type" => Some(self.event_type),
            ":message-type" => Some(self.message_type),
            _ => None,
        };
        if let Some(value) = known {
            return std::str::from_utf8(value?).ok();
        }
        let mut b = self.headers;
        while let Ok(Some(h)) = next_raw(&mut b) {
            if h.kind == 7 && h.name == name.as_bytes() {
                return std::str::from_utf8(h.value).ok();
            }
        }
        None
    }
}

/// Why a stream cannot be decoded (each names the message's offset in the stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventStreamError {
    TooLarge {
        offset: u64,
        len: usize,
        limit: usize,
    },
    PreludeCrc {
        offset: u64,
    },
    MessageCrc {
        offset: u64,
    },
    Malformed {
        offset: u64,
        why: String,
    },
}

impl fmt::Display for EventStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventStreamError::TooLarge { offset, len, limit } => write!(
                f,
                "event-stream message at byte {offset} is {len} bytes (limit {limit})"
            ),
            EventStreamError::PreludeCrc { offset } => {
                write!(
                    f,
                    "event-stream message at byte {offset}: prelude checksum mismatch"
                )
            }
            EventStreamError::MessageCrc { offset } => {
                write!(
                    f,
                    "event-stream message at byte {offset}: message checksum mismatch"
                )
            }
            EventStreamError::Malformed { offset, why } => {
                write!(f, "event-stream message at byte {offset}: {why}")
            }
        }
    }
}

impl std::error::Error for EventStreamError {}

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The decoder's state between chunks.
#[derive(Debug)]
pub struct EventStreamDecoder {
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    offset: u64,
    limit: usize,
}

impl Default for EventStreamDecoder {
    fn default() -> Self {
        EventStreamDecoder::new(MESSAGE_BYTES_MAX_DEFAULT)
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl EventStreamDecoder {
    /// A decoder refusing messages over `limit` bytes.
    pub fn new(limit: usize) -> EventStreamDecoder {
        EventStreamDecoder {
            buf: Vec::new(),
            offset: 0,
            limit,
        }
    }

    /// Whether a message is partly buffered (a stream ending here was cut).
    pub fn is_mid_message(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Decodes `chunk`, handing each complete message to `on_message`. Whole messages are
    /// decoded where they lie in `chunk`; only a message cut by the chunk's end is buffered,
    /// and completed from the next chunks.
    pub fn push(
        &mut self,
        mut chunk: &[u8],
        on_message: &mut impl FnMut(Message<'_>),
    ) -> Result<(), EventStreamError> {
        if !self.buf.is_empty() {
            // Complete the buffered message: its prelude first, then the rest it names.
            loop {
                let want = match self.total()? {
                    None => PRELUDE,
                    Some(total) => total,
                };
                let take = (want - self.buf.len()).min(chunk.len());
                self.buf.extend_from_slice(&chunk[..take]);
                chunk = &chunk[take..];
                if self.buf.len() < want {
                    return Ok(());
                }
                // (A whole message is longer than its prelude.)
                if want > PRELUDE {
                    break;
                }
            }
            let total = self.buf.len();
            on_message(decode(&self.buf, self.offset)?);
            self.buf.clear();
            self.offset += total as u64;
        }
        while chunk.len() >= PRELUDE {
            let total = prelude(chunk, self.offset, self.limit)?;
            if chunk.len() < total {
                break;
            }
            on_message(decode(&chunk[..total], self.offset)?);
            chunk = &chunk[total..];
            self.offset += total as u64;
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    /// The buffered message's length, once its prelude is in.
    fn total(&self) -> Result<Option<usize>, EventStreamError> {
        if self.buf.len() < PRELUDE {
            return Ok(None);
        }
        prelude(&self.buf, self.offset, self.limit).map(Some)
    }
}

/// The length of the message whose prelude opens `b` (at least `PRELUDE` bytes), checked.
fn prelude(b: &[u8], offset: u64, limit: usize) -> Result<usize, EventStreamError> {
    let total = be32(b) as usize;
    let headers_len = be32(&b[4..]) as usize;
    if crc32(&b[..8]) != be32(&b[8..]) {
        return Err(EventStreamError::PreludeCrc { offset });
    }
    if total > limit {
        return Err(EventStreamError::TooLarge {
            offset,
            len: total,
            limit,
        });
    }
    if total < PRELUDE + TRAILER || headers_len > total - PRELUDE - TRAILER {
        return Err(EventStreamError::Malformed {
            offset,
            why: format!("lengths do not fit (total {total}, headers {headers_len})"),
        });
    }
    Ok(total)
}

/// The message that is exactly `b` (its prelude already checked).
#[inline]
fn decode(b: &[u8], offset: u64) -> Result<Message<'_>, EventStreamError> {
    let total = b.len();
    let headers_len = be32(&b[4..]) as usize;
    // The message's checksum goes on from the prelude's (checked to be the first 8 bytes').
    let mut crc = crc32fast::Hasher::new_with_initial(be32(&b[8..]));
    crc.update(&b[8..total - TRAILER]);
    if crc.finalize() != be32(&b[total - TRAILER..]) {
        return Err(EventStreamError::MessageCrc { offset });
    }
    let headers = &b[PRELUDE..PRELUDE + headers_len];
    let malformed = |fault: HeaderFault| EventStreamError::Malformed {
        offset,
        why: fault.to_string(),
    };
    let mut h = headers;
    // Names and string values are UTF-8 when the whole block is ASCII (as it nearly always
    // is): then only the layout is checked header by header.
    let ascii = headers.is_ascii();
    let (mut event_type, mut message_type) = (None, None);
    while let Some(raw) = next_raw(&mut h).map_err(malformed)? {
        if !ascii {
            raw.read().map_err(malformed)?;
        }
        if raw.kind == 7 {
            match raw.name {
                b":event-type" if event_type.is_none() => event_type = Some(raw.value),
                b":message-type" if message_type.is_none() => message_type = Some(raw.value),
                _ => {}
            }
        }
    }
    Ok(Message {
        headers,
        payload: &b[PRELUDE + headers_len..total - TRAILER],
        event_type,
        message_type,
    })
}

/// What is wrong with a message's header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HeaderFault {
    RunsPast,
    NameNotUtf8,
    ValueNotUtf8(String),
    ShortUuid,
    UnknownType { name: String, kind: u8 },
}

impl fmt::Display for HeaderFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderFault::RunsPast => f.write_str("a header runs past the headers"),
            HeaderFault::NameNotUtf8 => f.write_str("a header name is not UTF-8"),
            HeaderFault::ValueNotUtf8(name) => write!(f, "header `{name}` is not UTF-8"),
            HeaderFault::ShortUuid => f.write_str("a short uuid header"),
            HeaderFault::UnknownType { name, kind } => {
                write!(f, "header `{name}` has unknown type {kind}")
            }
        }
    }
}

/// One header as it lies in the message: its name, type byte and value bytes.
struct RawHeader<'a> {
    name: &'a [u8],
    kind: u8,
    value: &'a [u8],
}

impl<'a> RawHeader<'a> {
    /// The header read: `Err` names what is wrong with it.
    fn read(&self) -> Result<(&'a str, HeaderValue<'a>), HeaderFault> {
        let name = std::str::from_utf8(self.name).map_err(|_| HeaderFault::NameNotUtf8)?;
        let v = self.value;
        let fixed = || v.iter().fold(0i64, |a, &x| (a << 8) | x as i64);
        let value = match self.kind {
            0 => HeaderValue::Bool(true),
            1 => HeaderValue::Bool(false),
            2 => HeaderValue::Byte(fixed() as i8),
            3 => HeaderValue::Short(fixed() as i16),
            4 => HeaderValue::Int(fixed() as i32),
            5 => HeaderValue::Long(fixed()),
            6 => HeaderValue::Bytes(v),
            7 => HeaderValue::String(
                std::str::from_utf8(v).map_err(|_| HeaderFault::ValueNotUtf8(name.into()))?,
            ),
            8 => HeaderValue::Timestamp(fixed()),
            _ => HeaderValue::Uuid(v.try_into().map_err(|_| HeaderFault::ShortUuid)?),
        };
        Ok((name, value))
    }
}

/// Takes the header at the front of `b` as it lies; `None` at the end.
#[inline]
fn next_raw<'a>(b: &mut &'a [u8]) -> Result<Option<RawHeader<'a>>, HeaderFault> {
    let Some(&name_len) = b.first() else {
        return Ok(None);
    };
    let name_len = name_len as usize;
    let bad = || HeaderFault::RunsPast;
    let name = b.get(1..1 + name_len).ok_or_else(bad)?;
    let kind = *b.get(1 + name_len).ok_or_else(bad)?;
    let mut at = 2 + name_len;
    let len = match kind {
        0 | 1 => 0,
        2 => 1,
        3 => 2,
        4 => 4,
        5 | 8 => 8,
        6 | 7 => {
            let l = b.get(at..at + 2).ok_or_else(bad)?;
            at += 2;
            u16::from_be_bytes([l[0], l[1]]) as usize
        }
        9 => 16,
        other => {
            return Err(HeaderFault::UnknownType {
                name: String::from_utf8_lossy(name).into_owned(),
                kind: other,
            })
        }
    };
    let value = b.get(at..at + len).ok_or_else(bad)?;
    *b = &b[at + len..];
    Ok(Some(RawHeader { name, kind, value }))
}

/// Reads the header at the front of `b`; `None` at the end.
fn next_header<'a>(b: &mut &'a [u8]) -> Result<Option<(&'a str, HeaderValue<'a>)>, HeaderFault> {
    match next_raw(b)? {
        Some(h) => h.read().map(Some),
        None => Ok(None),
    }
}

/// Encodes a message with string headers (tests and test peers).
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (name, value) in headers {
        h.push(name.len() as u8);
        h.extend_from_slice(name.as_bytes());
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value.as_bytes());
    }
    let total = PRELUDE + h.len() + payload.len() + TRAILER;
    let mut m = Vec::with_capacity(total);
    m.extend_from_slice(&(total as u32).to_be_bytes());
    m.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32(&m);
    m.extend_from_slice(&prelude_crc.to_be_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(payload);
    let crc = crc32(&m);
    m.extend_from_slice(&crc.to_be_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message as owned parts, to compare.
    type Owned = (Vec<(String, String)>, Vec<u8>);

    fn owned(m: Message<'_>) -> Owned {
        let headers = m
            .headers()
            .map(|(n, v)| (n.to_string(), format!("{v:?}")))
            .collect();
        (headers, m.payload.to_vec())
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The CRC-32/ISO-HDLC check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // Every length agrees with the bit-at-a-time definition.
        let data: Vec<u8> = (0..200u32).map(|i| (i * 131 % 251) as u8).collect();
        for n in 0..data.len() {
            let mut c = !0u32;
            for &b in &data[..n] {
                c ^= b as u32;
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        0xEDB8_8320 ^ (c >> 1)
                    } else {
                        c >> 1
                    };
                }
            }
            assert_eq!(crc32(&data[..n]), !c, "length {n}");
        }
    }

    #[test]
    fn a_known_frame_decodes() {
        // A message with no headers and payload "{'foo':'bar'}", framed by hand: total 29,
        // headers 0, prelude crc 0xfd528c5a, message crc 0xc3653936 (computed with Python's zlib.crc32).
        let mut frame = vec![0, 0, 0, 29, 0, 0, 0, 0, 0xfd, 0x52, 0x8c, 0x5a];
        frame.extend_from_slice(b"{'foo':'bar'}");
        frame.extend_from_slice(&[0xc3, 0x65, 0x39, 0x36]);
        let mut d = EventStreamDecoder::default();
        let mut got = Vec::new();
        d.push(&frame, &mut |m| got.push(owned(m))).unwrap();
        assert_eq!(got, vec![(vec![], b"{'foo':'bar'}".to_vec())]);
        assert_eq!(encode(&[], b"{'foo':'bar'}"), frame);
    }

    fn stream() -> (Vec<u8>, Vec<Owned>) {
        let parts = [
            (
                vec![(":message-type", "event"), (":event-type", "messageStart")],
                &b"{\"role\":\"assistant\"}"[..],
            ),
            (
                vec![
                    (":message-type", "event"),
                    (":event-type", "contentBlockDelta"),
                ],
                b"{\"delta\":{\"text\":\"Hi\"}}",
            ),
            (
                vec![
                    (":message-type", "exception"),
                    (":exception-type", "throttlingException"),
                ],
                b"{\"message\":\"slow\"}",
            ),
        ];
        let mut bytes = Vec::new();
        let mut msgs = Vec::new();
        for (h, p) in parts {
            bytes.extend(encode(&h, p));
            msgs.push((
                h.iter()
                    .map(|(n, v)| (n.to_string(), format!("{:?}", HeaderValue::String(v))))
                    .collect(),
                p.to_vec(),
            ));
        }
        (bytes, msgs)
    }

    #[test]
    fn every_split_gives_the_same_messages() {
        let (bytes, want) = stream();
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let mut d = EventStreamDecoder::default();
                let mut got = Vec::new();
                for part in [&bytes[..i], &bytes[i..j], &bytes[j..]] {
                    d.push(part, &mut |m| got.push(owned(m))).unwrap();
                }
                assert_eq!(got, want, "split at {i} and {j}");
                assert!(!d.is_mid_message());
            }
        }
        // Byte by byte.
        let mut d = EventStreamDecoder::default();
        let mut kinds = Vec::new();
        for b in bytes.chunks(1) {
            d.push(b, &mut |m| {
                kinds.push(m.header_str(":event-type").map(str::to_string))
            })
            .unwrap();
        }
        assert_eq!(
            kinds,
            [
                Some("messageStart".into()),
                Some("contentBlockDelta".into()),
                None
            ]
        );
    }

    /// A message whose headers are `h` (already encoded), framed.
    fn framed(h: &[u8], payload: &[u8]) -> Vec<u8> {
        let total = PRELUDE + h.len() + payload.len() + TRAILER;
        let mut m = (total as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&(h.len() as u32).to_be_bytes());
        m.extend_from_slice(&crc32(&m).to_be_bytes());
        m.extend_from_slice(h);
        m.extend_from_slice(payload);
        m.extend_from_slice(&crc32(&m).to_be_bytes());
        m
    }

    #[test]
    fn every_header_type_reads_and_an_unknown_one_is_refused() {
        let mut h = Vec::new();
        let mut add = |name: &str, kind: u8, value: &[u8]| {
            h.push(name.len() as u8);
            h.extend_from_slice(name.as_bytes());
            h.push(kind);
            h.extend_from_slice(value);
        };
        add("t", 0, &[]);
        add("f", 1, &[]);
        add("b", 2, &[0xff]);
        add("s", 3, &[0x01, 0x02]);
        add("i", 4, &[0, 0, 1, 0]);
        add("l", 5, &[0, 0, 0, 0, 0, 0, 0, 7]);
        add("y", 6, &[0, 2, 0xde, 0xad]);
        add(":event-type", 7, b"\x00\x03abc");
        add("ts", 8, &[0, 0, 0, 0, 0, 0, 1, 0]);
        add("u", 9, &[9; 16]);
        let frame = framed(&h, b"{}");
        let mut got = Vec::new();
        EventStreamDecoder::default()
            .push(&frame, &mut |m| {
                assert_eq!(m.header_str(":event-type"), Some("abc"));
                assert_eq!(m.header_str("y"), None, "a bytes header is not a string");
                got.extend(m.headers().map(|(n, v)| (n.to_string(), format!("{v:?}"))));
            })
            .unwrap();
        let want = [
            ("t", "Bool(true)"),
            ("f", "Bool(false)"),
            ("b", "Byte(-1)"),
            ("s", "Short(258)"),
            ("i", "Int(256)"),
            ("l", "Long(7)"),
            ("y", "Bytes([222, 173])"),
            (":event-type", "String(\"abc\")"),
            ("ts", "Timestamp(256)"),
            (
                "u",
                "Uuid([9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9])",
            ),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        for bad in [
            &[1, b'x', 10][..],
            &[1, b'x', 7, 0, 9, b'a'],
            &[1, 0xff, 0],
            &[1, b'x', 7, 0, 1, 0xff],
        ] {
            let err = EventStreamDecoder::default()
                .push(&framed(bad, b""), &mut |_| panic!("a bad header decoded"))
                .unwrap_err();
            assert!(
                matches!(err, EventStreamError::Malformed { offset: 0, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn damage_is_reported_with_its_offset_never_a_panic() {
        let (bytes, _) = stream();
        let second = encode(
            &[(":message-type", "event"), (":event-type", "messageStart")],
            b"{\"role\":\"assistant\"}",
        )
        .len() as u64;
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            let mut d = EventStreamDecoder::default();
            let r = d.push(&bad, &mut |_| {});
            assert!(
                r.is_err() || d.is_mid_message(),
                "flip at {at} went unnoticed"
            );
        }
        let mut bad = bytes.clone();
        bad[second as usize + 20] ^= 1;
        let err = EventStreamDecoder::default()
            .push(&bad, &mut |_| {})
            .unwrap_err();
        assert_eq!(err, EventStreamError::MessageCrc { offset: second });
        let err = EventStreamDecoder::new(16)
            .push(&bytes, &mut |_| {})
            .unwrap_err();
        assert!(
            matches!(err, EventStreamError::TooLarge { offset: 0, .. }),
            "{err}"
        );
    }
}
