//! The WAL file header: magic, format version, lineage, session triple, creation time.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "BROCAWAL"
//!      8     2  format version (u16 LE) = 1
//!     10     2  flags (u16 LE) = 0
//!     12     4  header_len (u32 LE): bytes from 0 that the header checksum covers
//!     16     4  data_offset (u32 LE): where the first record starts; a multiple of 4096
//!     20     4  reserved, zero
//!     24    16  lineage_id: random, chosen when the file is created
//!     40     8  created_unix_ms (u64 LE)
//!     48    16  session address
//!     64     …  the triple: project_root, harness, session, each a u32 LE length + UTF-8 bytes
//! header_len 4  crc32c of bytes [0, header_len)
//! ```

use super::address::{SessionAddr, SessionTriple};

/// The first eight bytes of every WAL file.
pub const MAGIC: [u8; 8] = *b"BROCAWAL";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Records start at a multiple of this, whatever the device's alignment.
pub const DATA_ALIGN: u64 = 4096;
const FIXED_BYTES: usize = 64;

/// A decoded WAL header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalHeader {
    pub version: u16,
    pub lineage_id: [u8; 16],
    pub created_unix_ms: u64,
    pub address: SessionAddr,
    pub triple: SessionTriple,
    pub data_offset: u64,
}

/// Why a file's header cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The file holds no bytes.
    Empty,
    /// The file holds only zero bytes: created, but the header never became durable.
    Uninitialized,
    /// The file does not start with the WAL magic.
    NotAWal,
    /// The file ends inside its header.
    Truncated { len: u64, needed: u64 },
    /// A header field or its checksum is wrong.
    Damaged(String),
    /// A format version this build does not read.
    UnsupportedVersion(u16),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Empty => write!(f, "empty file: no header"),
            HeaderError::Uninitialized => {
                write!(f, "only zero bytes: the header never became durable")
            }
            HeaderError::NotAWal => write!(f, "not a broca WAL (no BROCAWAL magic at offset 0)"),
            HeaderError::Truncated { len, needed } => {
                write!(
                    f,
                    "truncated header: the file has {len} bytes, the header needs {needed}"
                )
            }
            HeaderError::Damaged(why) => write!(f, "damaged header: {why}"),
            HeaderError::UnsupportedVersion(v) => write!(
                f,
                "format version {v} is not supported by this build (it reads version \
                 {FORMAT_VERSION})"
            ),
        }
    }
}

impl WalHeader {
    /// A header for a new WAL of `triple` with a fresh random lineage.
    pub fn new(triple: SessionTriple, created_unix_ms: u64) -> WalHeader {
        let address = triple.address();
        let mut header = WalHeader {
            version: FORMAT_VERSION,
            lineage_id: random_lineage(),
            created_unix_ms,
            address,
            triple,
            data_offset: 0,
        };
        header.data_offset = align_up(header.encoded_len() as u64, DATA_ALIGN);
        header
    }

    /// The eight bytes of the lineage that tag every record frame.
    pub fn lineage_tag(&self) -> [u8; 8] {
        self.lineage_id[..8].try_into().expect("8 bytes")
    }

    /// The lineage id as 32 hex digits.
    pub fn lineage_hex(&self) -> String {
        self.lineage_id.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn header_len(&self) -> usize {
        FIXED_BYTES
            + 12
            + self.triple.project_root.len()
            + self.triple.harness.len()
            + self.triple.session.len()
    }

    /// Bytes the header occupies, its checksum included.
    pub fn encoded_len(&self) -> usize {
        self.header_len() + 4
    }

    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let header_len = self.header_len();
        let mut out = Vec::with_capacity(header_len + 4);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
        out.extend_from_slice(&(self.data_offset as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.lineage_id);
        out.extend_from_slice(&self.created_unix_ms.to_le_bytes());
        out.extend_from_slice(&self.address.0);
        for part in [
            &self.triple.project_root,
            &self.triple.harness,
            &self.triple.session,
        ] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        assert_eq!(out.len(), header_len, "the header is as long as it says");
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<WalHeader, HeaderError> {
        if bytes.is_empty() {
            return Err(HeaderError::Empty);
        }
        if bytes.iter().all(|&b| b == 0) {
            return Err(HeaderError::Uninitialized);
        }
        let magic_len = MAGIC.len().min(bytes.len());
        if bytes[..magic_len] != MAGIC[..magic_len] {
            return Err(HeaderError::NotAWal);
        }
        let truncated = |needed: usize| HeaderError::Truncated {
            len: bytes.len() as u64,
            needed: needed as u64,
        };
        if bytes.len() < FIXED_BYTES {
            return Err(truncated(FIXED_BYTES));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let header_len = u32_at(bytes, 12) as usize;
        let data_offset = u64::from(u32_at(bytes, 16));
        if !(FIXED_BYTES + 12..=FIXED_BYTES + 12 + 3 * super::address::TRIPLE_COMPONENT_BYTES_MAX)
            .contains(&header_len)
        {
            return Err(HeaderError::Damaged(format!(
                "header_len {header_len} is out of range"
            )));
        }
        if bytes.len() < header_len + 4 {
            return Err(truncated(header_len + 4));
        }
        let stored_crc = u32_at(bytes, header_len);
        if crc32c::crc32c(&bytes[..header_len]) != stored_crc {
            return Err(HeaderError::Damaged("header checksum mismatch".into()));
        }
        if version != FORMAT_VERSION {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        if data_offset % DATA_ALIGN != 0 || data_offset < (header_len + 4) as u64 {
            return Err(HeaderError::Damaged(format!(
                "data_offset {data_offset} is invalid"
            )));
        }
        let triple = decode_triple(&bytes[..header_len])?;
        let address = SessionAddr(bytes[48..64].try_into().expect("16 bytes"));
        if triple.address() != address {
            return Err(HeaderError::Damaged(
                "the address does not match the triple".into(),
            ));
        }
        Ok(WalHeader {
            version,
            lineage_id: bytes[24..40].try_into().expect("16 bytes"),
            created_unix_ms: u64::from_le_bytes(bytes[40..48].try_into().expect("8 bytes")),
            address,
            triple,
            data_offset,
        })
    }
}

/// The session triple after the fixed part of a header (`header` is the header's bytes, its
/// checksum checked already): each component its u32 length and its UTF-8 bytes, inside the
/// header.
fn decode_triple(header: &[u8]) -> Result<SessionTriple, HeaderError> {
    assert!(header.len() >= FIXED_BYTES, "the fixed part was checked");
    let mut at = FIXED_BYTES;
    let mut parts = Vec::with_capacity(3);
    for name in ["project_root", "harness", "session"] {
        let past = || HeaderError::Damaged(format!("{name} runs past the header"));
        if at + 4 > header.len() {
            return Err(past());
        }
        let len = u32_at(header, at) as usize;
        at += 4;
        if len > header.len() - at {
            return Err(past());
        }
        let text = std::str::from_utf8(&header[at..at + len])
            .map_err(|_| HeaderError::Damaged(format!("{name} is not UTF-8")))?;
        parts.push(text.to_string());
        at += len;
    }
    assert!(at <= header.len());
    let [project_root, harness, session]: [String; 3] = parts.try_into().expect("three components");
    Ok(SessionTriple {
        project_root,
        harness,
        session,
    })
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

fn random_lineage() -> [u8; 16] {
    let mut out = [0u8; 16];
    let mut filled = 0;
    while filled < out.len() {
        // SAFETY: the pointer and length describe the unfilled part of `out`.
        let n =
            unsafe { libc::getrandom(out[filled..].as_mut_ptr().cast(), out.len() - filled, 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::Interrupted,
                "getrandom failed: {err}"
            );
            continue;
        }
        filled += n as usize;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> WalHeader {
        WalHeader::new(
            SessionTriple::new("/proj", "h", "s").unwrap(),
            1_700_000_000_000,
        )
    }

    #[test]
    fn a_header_round_trips_and_lineages_differ() {
        let h = header();
        assert_eq!(WalHeader::decode(&h.encode()).unwrap(), h);
        assert_ne!(header().lineage_id, h.lineage_id);
        assert_eq!(h.data_offset, 4096);
    }

    #[test]
    fn any_flipped_bit_in_the_header_is_refused() {
        let bytes = header().encode();
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                WalHeader::decode(&damaged).is_err(),
                "bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn every_truncation_of_the_header_is_refused() {
        let bytes = header().encode();
        for len in 0..bytes.len() {
            assert!(
                WalHeader::decode(&bytes[..len]).is_err(),
                "length {len} read as a header"
            );
        }
    }
}
