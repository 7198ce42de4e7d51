//! Frames: the 21-byte envelope and its body, decoded from bytes as they arrive and encoded
//! whole (header and body in one buffer, one write). The envelope's rules are
//! subc-protocol's (`decode_header`): an unknown version or type, reserved flag bits, a
//! pure-header frame with a body, a non-zero epoch on channel 0 are errors.

use crate::LinkError;
use subc_protocol::{EnvelopeHeader, Flags, Frame, FrameType, Priority, HEADER_LEN};

/// The largest body broca takes from the daemon (the wire's own cap is 64 MiB).
pub const BODY_MAX: u32 = 16 << 20;

/// A frame as read: its header and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameIn {
    pub header: EnvelopeHeader,
    pub body: Vec<u8>,
}

/// Decodes frames from a byte stream.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    at: usize,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if the bytes hold one; an error for a frame the wire's rules
    /// refuse (the connection cannot go on after one).
    pub fn next_frame(&mut self) -> Result<Option<FrameIn>, LinkError> {
        assert!(
            self.at <= self.buf.len(),
            "the decoder's position is inside its buffer"
        );
        let rest = &self.buf[self.at..];
        if rest.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = subc_protocol::decode_header(&rest[..HEADER_LEN])
            .map_err(|e| LinkError::Protocol(format!("a frame the wire refuses: {e:?}")))?;
        if header.len > BODY_MAX {
            return Err(LinkError::Protocol(format!(
                "a frame of {} bytes, more than the {BODY_MAX} broca takes",
                header.len
            )));
        }
        let end = HEADER_LEN + header.len as usize;
        if rest.len() < end {
            return Ok(None);
        }
        let body = rest[HEADER_LEN..end].to_vec();
        assert_eq!(body.len(), header.len as usize);
        self.at += end;
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > 1 << 20 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        Ok(Some(FrameIn { header, body }))
    }
}

/// A frame's bytes, header and body together. A body over the wire's cap is an error.
pub fn encode(
    ty: FrameType,
    flags: Flags,
    channel: u16,
    epoch: u32,
    corr: u64,
    body: Vec<u8>,
) -> Result<Vec<u8>, LinkError> {
    let frame = Frame::build(ty, flags, channel, epoch, corr, body)
        .map_err(|e| LinkError::Protocol(format!("cannot build a frame: {e:?}")))?;
    let mut out = Vec::with_capacity(HEADER_LEN + frame.body.len());
    debug_assert_eq!(
        frame.header.len as usize,
        frame.body.len(),
        "the header counts the body"
    );
    out.extend_from_slice(&frame.header.encode());
    out.extend_from_slice(&frame.body);
    debug_assert_eq!(
        out.len(),
        HEADER_LEN + frame.body.len(),
        "a frame is its header and body"
    );
    Ok(out)
}

/// Flags of control frames (channel 0): passive.
pub fn control() -> Flags {
    Flags::new(false, Priority::Passive, false)
}

/// Flags of data frames (responses, errors, stream frames): interactive.
pub fn data() -> Flags {
    Flags::new(false, Priority::Interactive, false)
}

/// Flags of the last frame of a stream (STREAM_END): interactive, LAST set.
pub fn last() -> Flags {
    Flags::new(false, Priority::Interactive, true)
}

/// A received frame made by hand, for tests: `body` as JSON on route (3, 1), corr 9 (channel
/// 0 when `ty`'s flags are the control ones).
#[cfg(test)]
pub(crate) fn test_frame(ty: FrameType, flags: Flags, body: &serde_json::Value) -> FrameIn {
    let body = serde_json::to_vec(body).expect("JSON serializes");
    let control = flags == control();
    FrameIn {
        header: subc_protocol::EnvelopeHeader {
            len: body.len() as u32,
            ver: 2,
            ty,
            flags,
            channel: if control { 0 } else { 3 },
            epoch: u32::from(!control),
            corr: 9,
        },
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_wire_vectors_encode_and_decode_split_anywhere() {
        // subc-transport's wire vectors (tests/wire_vectors.rs): GOODBYE on channel 0, corr 7,
        // and a 40-byte interactive REQUEST on channel 0, corr 1.
        let goodbye = encode(FrameType::Goodbye, control(), 0, 0, 7, Vec::new()).unwrap();
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let goodbye_hex = [
            "00000000",
            "02",
            "0b",
            "00",
            "0000",
            "00000000",
            "0700000000000000",
        ];
        assert_eq!(hex(&goodbye), goodbye_hex.concat());
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec();
        let req = encode(FrameType::Request, data(), 0, 0, 1, body.clone()).unwrap();
        let req_hex = [
            "28000000",
            "02",
            "00",
            "02",
            "0000",
            "00000000",
            "0100000000000000",
        ];
        assert_eq!(hex(&req[..21]), req_hex.concat());
        let stream = [goodbye.clone(), req.clone()].concat();
        for split in 0..=stream.len() {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                d.push(part);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(got[0].header.ty, FrameType::Goodbye);
            assert_eq!((got[1].header.corr, &got[1].body), (1, &body));
        }
    }

    #[test]
    fn a_frame_the_wire_refuses_is_an_error() {
        let mut bad = encode(FrameType::Request, data(), 0, 0, 1, b"{}".to_vec()).unwrap();
        bad[4] = 9; // an unknown protocol version
        let mut d = Decoder::new();
        d.push(&bad);
        assert!(d.next_frame().is_err());
        let mut epoch_on_zero =
            encode(FrameType::Request, data(), 0, 0, 1, b"{}".to_vec()).unwrap();
        epoch_on_zero[9] = 1;
        let mut d = Decoder::new();
        d.push(&epoch_on_zero);
        assert!(d.next_frame().is_err());
        let mut huge = encode(FrameType::Request, data(), 3, 1, 1, Vec::new()).unwrap();
        huge[..4].copy_from_slice(&(BODY_MAX + 1).to_le_bytes());
        let mut d = Decoder::new();
        d.push(&huge);
        assert!(d
            .next_frame()
            .unwrap_err()
            .to_string()
            .contains("more than"));
    }
}
