//! Recovery: reading a WAL's bytes into its valid records and a verdict on its tail. Pure: it
//! takes the bytes and returns what they hold; it never writes, so readers never truncate.
//!
//! The case table (docs/wal-format.md holds the same table; keep them together). Scanning
//! walks frames from `data_offset`, expecting seq `s` and at least epoch `e`. At offset `X`:
//!
//! | case | bytes at X                                              | verdict                  |
//! |------|---------------------------------------------------------|--------------------------|
//! | R1   | a valid frame, our lineage, seq s, epoch ≥ e, synced_end ≤ X | record; go on       |
//! | R2   | a valid frame of another lineage                         | corrupt: foreign lineage |
//! | R3   | a valid frame of our lineage, seq ≠ s                    | corrupt: sequence gap    |
//! | R4   | a valid frame of our lineage, epoch < e                  | corrupt: stale writer    |
//! | R5   | a valid frame whose synced_end > X                       | corrupt: impossible frame|
//! | R6   | no valid frame, and every byte from X to the end is zero | clean end at X           |
//! | R7   | no valid frame, and a later valid frame of our lineage has synced_end > X | corrupt: damaged record (it was durable) |
//! | R8   | no valid frame otherwise                                 | torn tail: cut at X      |
//!
//! R7 is what keeps a torn tail inside the window of writes that may have been in flight: a
//! record's `synced_end` is the durable end when it was appended, so a later record with
//! `synced_end > X` proves that the bytes at X had been acknowledged, and damage there is
//! corruption, never a tail to cut. Without such a witness the damage lies in bytes that were
//! never proven durable: the batch in flight at the crash (or the one before it).

use std::ops::Range;

use memchr::memmem;

use super::frame::{valid_frame_at, FrameHeader, FRAME_HEADER_BYTES};
use super::header::{HeaderError, WalHeader};

/// One valid record found by a scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameInfo {
    pub seq: u64,
    pub offset: u64,
    /// The whole frame's length; `offset + len` is where the next record starts.
    pub len: u64,
    pub kind: u16,
    pub epoch: u32,
    pub synced_end: u64,
    /// Where the payload lies in the scanned bytes.
    pub payload: Range<usize>,
}

/// How the valid records end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// R6: nothing but zeros after the last record.
    Clean,
    /// R8: a torn tail that the lease holder cuts logically when it opens the log.
    Torn { reason: String, bytes: u64 },
    /// R2-R5, R7: corruption; the records before the scan's end are intact, nothing after is
    /// trusted.
    Corrupt { reason: Corruption },
}

/// Which case of the table a corruption is, with what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// R2: a valid frame of another lineage.
    ForeignLineage { found: [u8; 8], expected: [u8; 8] },
    /// R3: a valid frame of this lineage with another seq than the next one.
    SequenceGap { expected: u64, found: u64 },
    /// R4: a valid frame whose epoch is below one already seen.
    StaleWriter { epoch: u32, after: u32 },
    /// R5: a valid frame claiming bytes beyond its own offset were durable.
    ImpossibleFrame { synced_end: u64 },
    /// R7: damage in bytes that a later record proves were durable.
    DamagedRecord { witness_at: u64, synced_end: u64 },
}

impl Corruption {
    /// The case of the recovery table (docs/wal-format.md).
    pub fn case(&self) -> &'static str {
        match self {
            Corruption::ForeignLineage { .. } => "R2",
            Corruption::SequenceGap { .. } => "R3",
            Corruption::StaleWriter { .. } => "R4",
            Corruption::ImpossibleFrame { .. } => "R5",
            Corruption::DamagedRecord { .. } => "R7",
        }
    }
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Corruption::ForeignLineage { found, expected } => write!(
                f,
                "a record of another lineage (tag {}) where this WAL's lineage (tag {}) belongs",
                hex(found),
                hex(expected)
            ),
            Corruption::SequenceGap { expected, found } => {
                write!(f, "sequence gap: expected seq {expected}, found {found}")
            }
            Corruption::StaleWriter { epoch, after } => write!(
                f,
                "stale writer: epoch {epoch} after epoch {after} (a writer wrote after losing \
                 its lease)"
            ),
            Corruption::ImpossibleFrame { synced_end } => write!(
                f,
                "record claims {synced_end} bytes were durable, beyond its own offset"
            ),
            Corruption::DamagedRecord {
                witness_at,
                synced_end,
            } => write!(
                f,
                "damaged record: the record at offset {witness_at} was appended after \
                 {synced_end} bytes were durable, so these bytes had been acknowledged"
            ),
        }
    }
}

/// What a scan found.
#[derive(Debug, Clone)]
pub struct Scan {
    pub header: WalHeader,
    pub frames: Vec<FrameInfo>,
    /// Where the valid records end: the cut point for a torn tail, the damaged offset for
    /// corruption.
    pub end: u64,
    pub verdict: Verdict,
    /// The highest lease epoch among the valid records (0 when none).
    pub epoch_max: u32,
}

impl Scan {
    /// The seq the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.frames.last().map_or(1, |f| f.seq + 1)
    }
}

/// Scans a whole WAL file's bytes.
pub fn scan(bytes: &[u8]) -> Result<Scan, HeaderError> {
    let header = WalHeader::decode(bytes)?;
    let tag = header.lineage_tag();
    let start = header.data_offset as usize;
    if bytes.len() < start {
        // The initial zeroed region is written with the header in one write; a file that ends
        // before its data offset was cut short by something else.
        return Err(HeaderError::Truncated {
            len: bytes.len() as u64,
            needed: start as u64,
        });
    }
    let mut frames = Vec::new();
    let mut at = start;
    let mut expected_seq = 1u64;
    let mut epoch_max = 0u32;
    let verdict = loop {
        let Some(frame) = valid_frame_at(bytes, at) else {
            break tail_verdict(&bytes, at as u64, tag).expect("reading a slice cannot fail");
        };
        if let Err(reason) = check_frame(&frame, at as u64, tag, expected_seq, epoch_max) {
            break Verdict::Corrupt { reason };
        }
        frames.push(info(&frame, at));
        assert!(frame.epoch >= epoch_max, "epochs never go down (checked)");
        epoch_max = frame.epoch;
        expected_seq += 1;
        at += frame.frame_len() as usize;
        assert!(at <= bytes.len(), "a valid frame lies inside the bytes");
    };
    assert!(at >= start && at <= bytes.len());
    assert_eq!(frames.len() as u64, expected_seq - 1, "one frame per seq");
    Ok(Scan {
        header,
        frames,
        end: at as u64,
        verdict,
        epoch_max,
    })
}

/// R1-R5 for a valid frame at `at`: `Ok` when it is the next record (R1), else the
/// corruption it shows.
pub(crate) fn check_frame(
    frame: &FrameHeader,
    at: u64,
    tag: [u8; 8],
    expected_seq: u64,
    epoch_max: u32,
) -> Result<(), Corruption> {
    if frame.lineage_tag != tag {
        return Err(Corruption::ForeignLineage {
            found: frame.lineage_tag,
            expected: tag,
        });
    }
    if frame.seq != expected_seq {
        return Err(Corruption::SequenceGap {
            expected: expected_seq,
            found: frame.seq,
        });
    }
    if frame.epoch < epoch_max {
        return Err(Corruption::StaleWriter {
            epoch: frame.epoch,
            after: epoch_max,
        });
    }
    if frame.synced_end > at {
        return Err(Corruption::ImpossibleFrame {
            synced_end: frame.synced_end,
        });
    }
    Ok(())
}

fn info(frame: &FrameHeader, at: usize) -> FrameInfo {
    let payload_start = at + FRAME_HEADER_BYTES;
    FrameInfo {
        seq: frame.seq,
        offset: at as u64,
        len: frame.frame_len(),
        kind: frame.kind,
        epoch: frame.epoch,
        synced_end: frame.synced_end,
        payload: payload_start..payload_start + frame.payload_len as usize,
    }
}

/// Bytes that can be read at an offset: a WAL in memory, or its file (read in pieces, so a
/// long tail never has to fit in memory).
pub trait ReadAt {
    /// The length in bytes.
    fn len_bytes(&self) -> u64;
    /// Fills `buf` from `offset` as far as the bytes go; returns how many were read.
    fn read_at_most(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize>;
}

impl ReadAt for &[u8] {
    fn len_bytes(&self) -> u64 {
        self.len() as u64
    }
    fn read_at_most(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let start = (offset as usize).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

impl ReadAt for std::fs::File {
    fn len_bytes(&self) -> u64 {
        self.metadata().map_or(0, |m| m.len())
    }
    fn read_at_most(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}

/// The piece of the tail read at once when judging it.
const TAIL_CHUNK_BYTES: usize = 1 << 20;

/// R6-R8: there is no valid frame at `at`. Reads the rest of `src` in pieces of
/// [`TAIL_CHUNK_BYTES`]: the last nonzero byte decides R6, and every place the lineage tag
/// occurs is a candidate witness for R7.
pub(crate) fn tail_verdict(src: &impl ReadAt, at: u64, tag: [u8; 8]) -> std::io::Result<Verdict> {
    const TAG_OFFSET: u64 = 16; // where the lineage tag sits in a frame header
    let len = src.len_bytes();
    let mut chunk = vec![0u8; TAIL_CHUNK_BYTES.min(len.saturating_sub(at) as usize + 8)];
    let mut last_nonzero = None;
    let mut witness = None;
    // Each piece starts 7 bytes before the previous one ended, so a tag across the seam is
    // found once (candidates before `next_candidate` were already tried).
    let mut pos = at;
    let mut next_candidate = at + 1 + TAG_OFFSET;
    while pos < len {
        let n = src.read_at_most(pos, &mut chunk)?;
        if n == 0 {
            break;
        }
        let piece = &chunk[..n];
        if let Some(i) = piece.iter().rposition(|&b| b != 0) {
            last_nonzero = Some(pos + i as u64);
        }
        if witness.is_none() {
            for hit in memmem::find_iter(piece, &tag) {
                let tag_at = pos + hit as u64;
                if tag_at < next_candidate {
                    continue;
                }
                next_candidate = tag_at + 1;
                let frame_at = tag_at - TAG_OFFSET;
                if let Some(f) = frame_at_in(src, frame_at)? {
                    if f.synced_end > at {
                        witness = Some((frame_at, f.synced_end));
                        break;
                    }
                }
            }
        }
        if pos + (n as u64) >= len {
            break;
        }
        pos += (n as u64).saturating_sub(7).max(1);
    }
    let Some(last_nonzero) = last_nonzero else {
        return Ok(Verdict::Clean);
    };
    if let Some((witness_at, synced_end)) = witness {
        return Ok(Verdict::Corrupt {
            reason: Corruption::DamagedRecord {
                witness_at,
                synced_end,
            },
        });
    }
    let mut head = [0u8; FRAME_HEADER_BYTES];
    let got = src.read_at_most(at, &mut head)?;
    let reason = if got < FRAME_HEADER_BYTES {
        "the file ends inside a frame header".to_string()
    } else {
        let header = FrameHeader::read(&head);
        let frame_end = at + header.frame_len();
        if header.payload_len as usize > super::frame::PAYLOAD_BYTES_MAX {
            format!(
                "a frame length of {} bytes is out of range",
                header.payload_len
            )
        } else if frame_end > len {
            format!("the frame runs to offset {frame_end}, past the end of the file")
        } else {
            "checksum mismatch".to_string()
        }
    };
    Ok(Verdict::Torn {
        reason,
        bytes: last_nonzero - at + 1,
    })
}

/// The valid frame at `offset` of `src`, read whole, if one is there.
pub(crate) fn frame_at_in(src: &impl ReadAt, offset: u64) -> std::io::Result<Option<FrameHeader>> {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    if src.read_at_most(offset, &mut head)? < FRAME_HEADER_BYTES {
        return Ok(None);
    }
    let header = FrameHeader::read(&head);
    if header.payload_len as usize > super::frame::PAYLOAD_BYTES_MAX
        || offset + header.frame_len() > src.len_bytes()
    {
        return Ok(None);
    }
    let mut frame = vec![0u8; header.frame_len() as usize];
    if src.read_at_most(offset, &mut frame)? < frame.len() {
        return Ok(None);
    }
    Ok(valid_frame_at(&frame, 0))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The records of a scan, decoded.
#[derive(Debug, Clone, Default)]
pub struct Decoded {
    /// Each known record with its seq, in order.
    pub records: Vec<(u64, super::Record)>,
    /// Records of kinds this build does not know: skipped and counted.
    pub unknown_kinds: u64,
}

impl Scan {
    /// Decodes the payloads of the valid records in `bytes` (the bytes that were scanned).
    /// A known kind whose payload does not parse is an error naming its offset and seq. Long
    /// logs are decoded on several threads (each frame is independent), as in
    /// [`Scan::decode_chunks`].
    pub fn decode(&self, bytes: &[u8]) -> Result<Decoded, (u64, String)> {
        let mut out = Decoded {
            records: Vec::with_capacity(self.frames.len()),
            unknown_kinds: 0,
        };
        out.unknown_kinds = self.decode_chunks(
            bytes,
            |records| {
                out.records.extend(records);
                Ok(())
            },
            |offset, reason| (offset, reason),
        )?;
        Ok(out)
    }
}

impl Scan {
    /// Decodes the records in order, chunk by chunk, handing each chunk to `sink` on this
    /// thread while worker threads decode the chunks after it: replay overlaps decoding. A
    /// log of one chunk ([`DECODE_CHUNK_FRAMES`]) is decoded on this thread alone. The
    /// caller runs this off any executor (it blocks, and it starts threads).
    pub fn decode_chunks<E>(
        &self,
        bytes: &[u8],
        mut sink: impl FnMut(Vec<(u64, super::Record)>) -> Result<(), E>,
        decode_error: impl Fn(u64, String) -> E,
    ) -> Result<u64, E> {
        let chunks: Vec<&[FrameInfo]> = self.frames.chunks(DECODE_CHUNK_FRAMES).collect();
        let workers = if chunks.len() >= 2 {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, DECODE_THREADS_MAX)
        } else {
            0
        };
        if workers == 0 {
            let mut unknown = 0;
            for chunk in chunks {
                let d = decode_frames(chunk, bytes).map_err(|(o, r)| decode_error(o, r))?;
                unknown += d.unknown_kinds;
                sink(d.records)?;
            }
            return Ok(unknown);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel(DECODE_AHEAD_CHUNKS);
            for _ in 0..workers {
                let (tx, next, chunks) = (tx.clone(), &next, &chunks);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(chunk) = chunks.get(i) else { break };
                    if tx.send((i, decode_frames(chunk, bytes))).is_err() {
                        break; // the consumer stopped at an error
                    }
                });
            }
            drop(tx);
            let mut pending = std::collections::BTreeMap::new();
            let mut want = 0usize;
            let mut unknown = 0;
            for (i, decoded) in rx.iter() {
                pending.insert(i, decoded);
                while let Some(decoded) = pending.remove(&want) {
                    let d = decoded.map_err(|(o, r)| decode_error(o, r))?;
                    unknown += d.unknown_kinds;
                    sink(d.records)?;
                    want += 1;
                }
            }
            Ok(unknown)
        })
    }
}

/// Frames per chunk when decoding while replaying.
pub const DECODE_CHUNK_FRAMES: usize = 2048;
/// Decoded chunks that may wait ahead of the replay.
pub const DECODE_AHEAD_CHUNKS: usize = 16;

/// The most threads one decode uses.
pub const DECODE_THREADS_MAX: usize = 8;

fn decode_frames(frames: &[FrameInfo], bytes: &[u8]) -> Result<Decoded, (u64, String)> {
    let mut out = Decoded {
        records: Vec::with_capacity(frames.len()),
        unknown_kinds: 0,
    };
    for frame in frames {
        match super::Record::decode(frame.kind, &bytes[frame.payload.clone()]) {
            Ok(super::Record::Unknown { .. }) => out.unknown_kinds += 1,
            Ok(record) => out.records.push((frame.seq, record)),
            Err(reason) => return Err((frame.offset, format!("seq {}: {reason}", frame.seq))),
        }
    }
    Ok(out)
}
