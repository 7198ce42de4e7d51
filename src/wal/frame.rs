//! Record framing. Every record is a 40-byte frame header followed by its payload:
//!
//! ```text
//! offset  size  field
//!      0     4  crc32c of bytes [4, 40) and of the payload
//!      4     4  payload_len (u32 LE)
//!      8     8  seq (u64 LE): 1 for the first record, then +1 per record
//!     16     8  lineage tag: the first 8 bytes of the file's lineage_id
//!     24     8  synced_end (u64 LE): a file offset below which every byte was durable when
//!               this record was appended
//!     32     4  epoch (u32 LE): the writer lease's epoch
//!     36     2  kind (u16 LE)
//!     38     2  flags (u16 LE) = 0
//!     40     …  payload (JSON)
//! ```
//! The checksum covers the lineage tag, so bytes of another WAL never read as valid here; the
//! sequence number catches stale or missing records; `synced_end` lets recovery prove that a
//! damaged record was once durable (see docs/wal-format.md).

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 40;
/// The largest payload a frame may carry.
pub const PAYLOAD_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The fields of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub crc: u32,
    pub payload_len: u32,
    pub seq: u64,
    pub lineage_tag: [u8; 8],
    pub synced_end: u64,
    pub epoch: u32,
    pub kind: u16,
    pub flags: u16,
}

impl FrameHeader {
    /// Reads a frame header; `bytes` holds at least [`FRAME_HEADER_BYTES`].
    pub fn read(bytes: &[u8]) -> FrameHeader {
        assert!(
            bytes.len() >= FRAME_HEADER_BYTES,
            "a frame header is read whole"
        );
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u16_at = |at: usize| u16::from_le_bytes(bytes[at..at + 2].try_into().expect("2"));
        FrameHeader {
            crc: u32_at(0),
            payload_len: u32_at(4),
            seq: u64_at(8),
            lineage_tag: bytes[16..24].try_into().expect("8"),
            synced_end: u64_at(24),
            epoch: u32_at(32),
            kind: u16_at(36),
            flags: u16_at(38),
        }
    }

    /// The frame's whole length, header included.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_BYTES as u64 + u64::from(self.payload_len)
    }
}

/// The checksum of a frame whose header (crc field excluded) and payload are given.
pub fn frame_crc(header_after_crc: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header_after_crc), payload)
}

/// Writes a whole frame into `out`, which is exactly `FRAME_HEADER_BYTES + payload.len()` long.
#[allow(clippy::too_many_arguments)]
pub fn write_frame(
    out: &mut [u8],
    seq: u64,
    lineage_tag: [u8; 8],
    synced_end: u64,
    epoch: u32,
    kind: u16,
    payload: &[u8],
) {
    assert_eq!(
        out.len(),
        FRAME_HEADER_BYTES + payload.len(),
        "frame buffer size"
    );
    assert!(
        payload.len() <= PAYLOAD_BYTES_MAX,
        "payload over the frame limit"
    );
    out[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..24].copy_from_slice(&lineage_tag);
    out[24..32].copy_from_slice(&synced_end.to_le_bytes());
    out[32..36].copy_from_slice(&epoch.to_le_bytes());
    out[36..38].copy_from_slice(&kind.to_le_bytes());
    out[38..40].copy_from_slice(&0u16.to_le_bytes());
    out[FRAME_HEADER_BYTES..].copy_from_slice(payload);
    let crc = frame_crc(&out[4..FRAME_HEADER_BYTES], payload);
    out[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// A frame that checks out at `offset` in `bytes`: complete, within limits, checksum right.
/// Returns its header, or `None` when the bytes there are not a whole valid frame.
pub fn valid_frame_at(bytes: &[u8], offset: usize) -> Option<FrameHeader> {
    let head = bytes.get(offset..offset.checked_add(FRAME_HEADER_BYTES)?)?;
    let header = FrameHeader::read(head);
    if header.payload_len as usize > PAYLOAD_BYTES_MAX || header.flags != 0 {
        return None;
    }
    let end = offset + FRAME_HEADER_BYTES + header.payload_len as usize;
    assert!(end > offset, "a frame has a length");
    let payload = bytes.get(offset + FRAME_HEADER_BYTES..end)?;
    (frame_crc(&head[4..], payload) == header.crc).then_some(header)
}
