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

/// A header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Bool(bool),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Bytes(Vec<u8>),
    String(String),
    Timestamp(i64),
    Uuid([u8; 16]),
}

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub headers: Vec<(String, HeaderValue)>,
    pub payload: Vec<u8>,
}

impl Message {
    /// A string header's value (`:event-type`, `:message-type`, `:exception-type`).
    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|(n, v)| match v {
            HeaderValue::String(s) if n == name => Some(s.as_str()),
            _ => None,
        })
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

/// CRC-32 lookup tables for slicing by eight: `CRC_TABLES[0]` is the classic byte table,
/// `CRC_TABLES[k]` advances a byte that is `k` bytes further from the end.
const CRC_TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// CRC-32 (IEEE 802.3, reflected, as zlib computes it), eight bytes a step.
pub fn crc32(bytes: &[u8]) -> u32 {
    let t = &CRC_TABLES;
    let mut c = !0u32;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let one = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ c;
        let two = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        c = t[7][(one & 0xFF) as usize]
            ^ t[6][((one >> 8) & 0xFF) as usize]
            ^ t[5][((one >> 16) & 0xFF) as usize]
            ^ t[4][(one >> 24) as usize]
            ^ t[3][(two & 0xFF) as usize]
            ^ t[2][((two >> 8) & 0xFF) as usize]
            ^ t[1][((two >> 16) & 0xFF) as usize]
            ^ t[0][(two >> 24) as usize];
    }
    for &b in words.remainder() {
        c = t[0][((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
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

    /// Decodes `chunk`, handing each complete message to `on_message`.
    pub fn push(
        &mut self,
        chunk: &[u8],
        on_message: &mut impl FnMut(Message),
    ) -> Result<(), EventStreamError> {
        self.buf.extend_from_slice(chunk);
        let mut at = 0;
        while self.buf.len() - at >= PRELUDE {
            let b = &self.buf[at..];
            let offset = self.offset + at as u64;
            let total = be32(b) as usize;
            let headers_len = be32(&b[4..]) as usize;
            if crc32(&b[..8]) != be32(&b[8..]) {
                return Err(EventStreamError::PreludeCrc { offset });
            }
            if total > self.limit {
                return Err(EventStreamError::TooLarge {
                    offset,
                    len: total,
                    limit: self.limit,
                });
            }
            if total < PRELUDE + TRAILER || headers_len > total - PRELUDE - TRAILER {
                return Err(EventStreamError::Malformed {
                    offset,
                    why: format!("lengths do not fit (total {total}, headers {headers_len})"),
                });
            }
            if b.len() < total {
                break;
            }
            if crc32(&b[..total - TRAILER]) != be32(&b[total - TRAILER..]) {
                return Err(EventStreamError::MessageCrc { offset });
            }
            let headers = parse_headers(&b[PRELUDE..PRELUDE + headers_len])
                .map_err(|why| EventStreamError::Malformed { offset, why })?;
            let payload = b[PRELUDE + headers_len..total - TRAILER].to_vec();
            on_message(Message { headers, payload });
            at += total;
        }
        self.buf.drain(..at);
        self.offset += at as u64;
        Ok(())
    }
}

fn parse_headers(mut b: &[u8]) -> Result<Vec<(String, HeaderValue)>, String> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
        if b.len() < n {
            return Err("a header runs past the headers".into());
        }
        let (v, rest) = b.split_at(n);
        *b = rest;
        Ok(v.to_vec())
    };
    while !b.is_empty() {
        let name_len = take(&mut b, 1)?[0] as usize;
        let name = String::from_utf8(take(&mut b, name_len)?)
            .map_err(|_| "a header name is not UTF-8".to_string())?;
        let kind = take(&mut b, 1)?[0];
        let fixed = |b: &mut &[u8], n: usize| -> Result<i64, String> {
            Ok(take(b, n)?.iter().fold(0i64, |a, &x| (a << 8) | x as i64))
        };
        let value = match kind {
            0 => HeaderValue::Bool(true),
            1 => HeaderValue::Bool(false),
            2 => HeaderValue::Byte(fixed(&mut b, 1)? as i8),
            3 => HeaderValue::Short(fixed(&mut b, 2)? as i16),
            4 => HeaderValue::Int(fixed(&mut b, 4)? as i32),
            5 => HeaderValue::Long(fixed(&mut b, 8)?),
            6 | 7 => {
                let len = fixed(&mut b, 2)? as usize;
                let v = take(&mut b, len)?;
                if kind == 6 {
                    HeaderValue::Bytes(v)
                } else {
                    HeaderValue::String(
                        String::from_utf8(v)
                            .map_err(|_| format!("header `{name}` is not UTF-8"))?,
                    )
                }
            }
            8 => HeaderValue::Timestamp(fixed(&mut b, 8)?),
            9 => {
                let v = take(&mut b, 16)?;
                HeaderValue::Uuid(v.try_into().expect("16 bytes"))
            }
            other => return Err(format!("header `{name}` has unknown type {other}")),
        };
        out.push((name, value));
    }
    Ok(out)
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

    #[test]
    fn crc32_matches_the_standard_check_value() {
        // The CRC-32/ISO-HDLC check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        // Every length around the eight-byte steps agrees with the byte-at-a-time form.
        let data: Vec<u8> = (0..200u32).map(|i| (i * 131 % 251) as u8).collect();
        for n in 0..data.len() {
            let mut c = !0u32;
            for &b in &data[..n] {
                c = CRC_TABLES[0][((c ^ b as u32) & 0xFF) as usize] ^ (c >> 8);
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
        d.push(&frame, &mut |m| got.push(m)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload, b"{'foo':'bar'}");
        assert_eq!(encode(&[], b"{'foo':'bar'}"), frame);
    }

    fn stream() -> (Vec<u8>, Vec<Message>) {
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
            msgs.push(Message {
                headers: h
                    .iter()
                    .map(|(n, v)| (n.to_string(), HeaderValue::String(v.to_string())))
                    .collect(),
                payload: p.to_vec(),
            });
        }
        (bytes, msgs)
    }

    #[test]
    fn every_split_gives_the_same_messages() {
        let (bytes, want) = stream();
        for i in 0..=bytes.len() {
            let mut d = EventStreamDecoder::default();
            let mut got = Vec::new();
            d.push(&bytes[..i], &mut |m| got.push(m)).unwrap();
            d.push(&bytes[i..], &mut |m| got.push(m)).unwrap();
            assert_eq!(got, want, "split at {i}");
            assert!(!d.is_mid_message());
        }
        assert_eq!(want[1].header_str(":event-type"), Some("contentBlockDelta"));
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
