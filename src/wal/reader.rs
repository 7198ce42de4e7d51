//! A WAL read as a stream, in pages of bounded size, with plain reads: for readers beside a
//! live writer (subscribers replaying from a cursor) and for `wal verify` of files of any
//! size. Memory is one read-ahead buffer ([`READ_AHEAD_BYTES`], or the largest frame met)
//! plus the page the caller asks for; never the whole file.
//!
//! The frames are judged exactly as [`super::recovery::scan`] judges them (the same R1-R5
//! checks, the same R6-R8 tail verdict), so a paged read and a whole read of the same bytes
//! agree on every record and on the verdict.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::frame::{valid_frame_at, FrameHeader, FRAME_HEADER_BYTES};
use super::header::{HeaderError, WalHeader};
use super::recovery::{check_frame, tail_verdict, ReadAt, Verdict};
use super::{Record, WalError};

/// Bytes read from the file at once.
pub const READ_AHEAD_BYTES: usize = 256 * 1024;

/// A WAL file being read front to back.
pub struct PagedReader {
    file: Source,
    path: PathBuf,
    header: WalHeader,
    len: u64,
    /// File offset of the next frame.
    at: u64,
    next_seq: u64,
    epoch_max: u32,
    /// Bytes of the file from `buf_at`.
    buf: Vec<u8>,
    buf_at: u64,
    /// Set once no valid frame follows: how the records end.
    verdict: Option<Verdict>,
    unknown_kinds: u64,
    /// The offset whose frame was read again from the file, and how many times.
    rereads: (u64, u8),
}

/// What a reader reads: a live WAL file, or an archived WAL's bytes (digest checked).
enum Source {
    File(File),
    Bytes(Vec<u8>),
}

impl ReadAt for Source {
    fn len_bytes(&self) -> u64 {
        match self {
            Source::File(f) => f.len_bytes(),
            Source::Bytes(b) => b.len() as u64,
        }
    }
    fn read_at_most(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(f) => f.read_at_most(offset, buf),
            Source::Bytes(b) => b.as_slice().read_at_most(offset, buf),
        }
    }
}

/// One valid frame of a page.
pub struct PageFrame {
    pub seq: u64,
    pub offset: u64,
    pub kind: u16,
    pub epoch: u32,
    pub payload: Vec<u8>,
}

impl PagedReader {
    /// Opens `path` and reads its header. `Ok(None)` when the file does not exist yet or is
    /// still being created (empty, or its header not yet written).
    /// A session without a live WAL is read from the newest sealed container holding it.
    pub fn open_if_any(path: &Path) -> Result<Option<PagedReader>, WalError> {
        match Self::open(path) {
            Ok(r) => Ok(Some(r)),
            Err(WalError::Io { .. }) if !path.exists() => {
                match super::archive::archived_bytes(path).map_err(crate::WalError::from)? {
                    Some(bytes) => Self::from_source(path, Source::Bytes(bytes)).map(Some),
                    None => Ok(None),
                }
            }
            Err(WalError::Header {
                error: HeaderError::Empty | HeaderError::Uninitialized,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens `path` to read from the record `seq`, which a writer of this process said starts
    /// at `offset` (a seek point: a reader that resumes near the head reads only the tail).
    /// When the bytes at `offset` are not that record of this WAL (the file was replaced, the
    /// point is stale), it reads from the first record instead: never a wrong start.
    pub fn open_from(path: &Path, seq: u64, offset: u64) -> Result<Option<PagedReader>, WalError> {
        let Some(mut r) = Self::open_if_any(path)? else {
            return Ok(None);
        };
        if seq > 1 && offset >= r.header.data_offset && offset < r.len {
            r.at = offset;
            r.fill(FRAME_HEADER_BYTES)?;
            let rel = (r.at - r.buf_at) as usize;
            let ok = r.buf.len() >= rel + FRAME_HEADER_BYTES && {
                let h = FrameHeader::read(&r.buf[rel..rel + FRAME_HEADER_BYTES]);
                if h.payload_len as usize <= super::frame::PAYLOAD_BYTES_MAX {
                    r.fill(h.frame_len() as usize)?;
                }
                let rel = (r.at - r.buf_at) as usize;
                valid_frame_at(&r.buf, rel).is_some_and(|f| {
                    check_frame(&f, offset, r.header.lineage_tag(), seq, 0).is_ok()
                })
            };
            if ok {
                r.next_seq = seq;
            } else {
                r.at = r.header.data_offset;
                r.buf.clear();
                r.buf_at = 0;
            }
        }
        Ok(Some(r))
    }

    /// Opens `path` and reads its header.
    pub fn open(path: &Path) -> Result<PagedReader, WalError> {
        let io = |op: &'static str, e: std::io::Error| WalError::Io {
            path: path.to_path_buf(),
            op,
            message: e.to_string(),
        };
        let file = File::open(path).map_err(|e| io("open", e))?;
        Self::from_source(path, Source::File(file))
    }

    fn from_source(path: &Path, file: Source) -> Result<PagedReader, WalError> {
        let io = |op: &'static str, e: std::io::Error| WalError::Io {
            path: path.to_path_buf(),
            op,
            message: e.to_string(),
        };
        let len = file.len_bytes();
        let mut head = vec![0u8; (READ_AHEAD_BYTES as u64).min(len) as usize];
        let got = file.read_at_most(0, &mut head).map_err(|e| io("read", e))?;
        head.truncate(got);
        let header = WalHeader::decode(&head).or_else(|e| match e {
            // A header longer than the first read: read as much as it says it needs.
            HeaderError::Truncated { needed, .. } if needed <= len && needed > got as u64 => {
                let mut more = vec![0u8; needed as usize];
                let n = file.read_at_most(0, &mut more).map_err(|e| io("read", e))?;
                more.truncate(n);
                WalHeader::decode(&more).map_err(|error| WalError::Header {
                    path: path.to_path_buf(),
                    error,
                })
            }
            error => Err(WalError::Header {
                path: path.to_path_buf(),
                error,
            }),
        })?;
        if len < header.data_offset {
            return Err(WalError::Header {
                path: path.to_path_buf(),
                error: HeaderError::Truncated {
                    len,
                    needed: header.data_offset,
                },
            });
        }
        Ok(PagedReader {
            at: header.data_offset,
            file,
            path: path.to_path_buf(),
            header,
            len,
            next_seq: 1,
            epoch_max: 0,
            buf: Vec::new(),
            buf_at: 0,
            verdict: None,
            unknown_kinds: 0,
            rereads: (0, 0),
        })
    }

    pub fn header(&self) -> &WalHeader {
        &self.header
    }

    /// The seq of the last valid record read so far (0 before any).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Where the valid records read so far end.
    pub fn end(&self) -> u64 {
        self.at
    }

    /// How the records end, once [`PagedReader::next_frames`] has returned an empty page.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.verdict.as_ref()
    }

    /// Records of kinds this build does not know, skipped by [`PagedReader::next_records`].
    pub fn unknown_kinds(&self) -> u64 {
        self.unknown_kinds
    }

    fn io_error(&self, op: &'static str, e: std::io::Error) -> WalError {
        WalError::Io {
            path: self.path.clone(),
            op,
            message: e.to_string(),
        }
    }

    /// Makes the buffer hold `[self.at, self.at + need)` or as much of it as the file has.
    fn fill(&mut self, need: usize) -> Result<(), WalError> {
        let have_from = self.at - self.buf_at;
        if self.buf.len() as u64 >= have_from + need as u64 {
            return Ok(());
        }
        // Drop what was consumed, then read on from the end of what is kept.
        if have_from as usize >= self.buf.len() {
            self.buf.clear();
        } else {
            self.buf.drain(..have_from as usize);
        }
        self.buf_at = self.at;
        let want = need.max(READ_AHEAD_BYTES);
        let kept = self.buf.len();
        let file_left = self.len.saturating_sub(self.buf_at + kept as u64) as usize;
        let extra = (want.saturating_sub(kept)).min(file_left);
        if extra == 0 {
            return Ok(());
        }
        self.buf.resize(kept + extra, 0);
        let n = self
            .file
            .read_at_most(self.buf_at + kept as u64, &mut self.buf[kept..])
            .map_err(|e| self.io_error("read", e))?;
        self.buf.truncate(kept + n);
        Ok(())
    }

    /// Drops the bytes held from `self.at` on and measures the file again, so that the next
    /// fill reads the frame there from the file; at most `times` times for one offset.
    /// `false` for archived bytes (they do not change) or once the rereads are spent.
    fn reread_at(&mut self, times: u8) -> bool {
        let Source::File(f) = &self.file else {
            return false;
        };
        let done = if self.rereads.0 == self.at {
            self.rereads.1
        } else {
            0
        };
        if done >= times {
            return false;
        }
        self.rereads = (self.at, done + 1);
        self.len = f.len_bytes();
        let keep = (self.at - self.buf_at) as usize;
        self.buf.truncate(keep.min(self.buf.len()));
        true
    }

    /// The frame at the position, read into the buffer, with its place in the buffer; `None`
    /// when no valid frame starts there.
    fn frame_here(&mut self) -> Result<Option<(FrameHeader, usize)>, WalError> {
        self.fill(FRAME_HEADER_BYTES)?;
        assert!(
            self.at >= self.buf_at,
            "the buffer starts at or before the position"
        );
        let rel = (self.at - self.buf_at) as usize;
        if self.buf.len() < rel + FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let h = FrameHeader::read(&self.buf[rel..rel + FRAME_HEADER_BYTES]);
        if h.payload_len as usize <= super::frame::PAYLOAD_BYTES_MAX {
            self.fill(h.frame_len() as usize)?;
        }
        let rel = (self.at - self.buf_at) as usize;
        Ok(valid_frame_at(&self.buf, rel).map(|f| (f, rel)))
    }

    /// What the end of the valid frames at the position is: clean when the tail is not
    /// judged, else the tail's verdict, unless the frame should be read from the file again.
    fn end_here(&mut self, judge_tail: bool, tag: [u8; 8]) -> Result<End, WalError> {
        if !judge_tail {
            return Ok(End::Judged(Verdict::Clean));
        }
        // Beside a live writer the file may have grown since it was measured, or its tail
        // sector been written again: read the frame from the file once more.
        if self.reread_at(1) {
            return Ok(End::ReadAgain);
        }
        let verdict =
            tail_verdict(&self.file, self.at, tag).map_err(|e| self.io_error("read", e))?;
        // A witness read after this frame says the frame was durable: a writer may have
        // completed it after the bytes held here were read. Read it again, now durable,
        // before calling it corruption.
        if matches!(verdict, Verdict::Corrupt { .. }) && self.reread_at(2) {
            return Ok(End::ReadAgain);
        }
        Ok(End::Judged(verdict))
    }

    /// The next valid frames, their payloads adding up to about `payload_bytes_max` (at least
    /// one frame when any is left). Empty once the valid records end; then
    /// [`PagedReader::verdict`] says how (the tail is judged when `judge_tail` is set, which
    /// reads the rest of the file; readers beside a live writer stop without it).
    pub fn next_frames(
        &mut self,
        payload_bytes_max: usize,
        judge_tail: bool,
    ) -> Result<Vec<PageFrame>, WalError> {
        let mut page = Vec::new();
        let mut bytes = 0usize;
        let tag = self.header.lineage_tag();
        while self.verdict.is_none() && (page.is_empty() || bytes < payload_bytes_max) {
            let Some((frame, rel)) = self.frame_here()? else {
                match self.end_here(judge_tail, tag)? {
                    End::ReadAgain => continue,
                    End::Judged(verdict) => {
                        self.verdict = Some(verdict);
                        break;
                    }
                }
            };
            if let Err(reason) = check_frame(&frame, self.at, tag, self.next_seq, self.epoch_max) {
                self.verdict = Some(Verdict::Corrupt { reason });
                break;
            }
            assert_eq!(frame.seq, self.next_seq, "the frame was checked");
            let payload = &self.buf[rel + FRAME_HEADER_BYTES..rel + frame.frame_len() as usize];
            assert_eq!(payload.len(), frame.payload_len as usize);
            bytes += payload.len();
            page.push(PageFrame {
                seq: frame.seq,
                offset: self.at,
                kind: frame.kind,
                epoch: frame.epoch,
                payload: payload.to_vec(),
            });
            assert!(
                frame.epoch >= self.epoch_max,
                "epochs never go down (checked)"
            );
            self.epoch_max = frame.epoch;
            self.next_seq += 1;
            self.at += frame.frame_len();
        }
        assert!(
            page.windows(2).all(|w| w[1].seq == w[0].seq + 1),
            "a page is in seq order"
        );
        Ok(page)
    }

    /// The next valid records, decoded (kinds this build does not know are skipped and
    /// counted); empty once they end. A payload that does not parse is corruption naming its
    /// seq and offset.
    pub fn next_records(
        &mut self,
        payload_bytes_max: usize,
    ) -> Result<Vec<(u64, Record)>, WalError> {
        let frames = self.next_frames(payload_bytes_max, false)?;
        let mut out = Vec::with_capacity(frames.len());
        for f in frames {
            match Record::decode(f.kind, &f.payload) {
                Ok(Record::Unknown { .. }) => self.unknown_kinds += 1,
                Ok(record) => out.push((f.seq, record)),
                Err(reason) => {
                    return Err(WalError::Corrupt {
                        path: self.path.clone(),
                        offset: f.offset,
                        reason: format!("seq {}: {reason}", f.seq),
                    })
                }
            }
        }
        Ok(out)
    }
}

/// How the valid frames end at a position (see `PagedReader::end_here`).
enum End {
    /// The frame may have been completed since it was read: read it again.
    ReadAgain,
    /// The frames end here, so.
    Judged(Verdict),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::write_frame;

    #[test]
    fn a_reader_opened_at_a_seek_point_reads_the_tail_and_a_wrong_point_reads_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w");
        std::fs::write(&path, image(50, &[0u8; 4096])).unwrap();
        let mut all = PagedReader::open(&path).unwrap();
        let frames = all.next_frames(usize::MAX, false).unwrap();
        let at40 = frames.iter().find(|f| f.seq == 40).unwrap().offset;
        let mut tail = PagedReader::open_from(&path, 40, at40).unwrap().unwrap();
        let seqs: Vec<u64> = tail
            .next_frames(usize::MAX, false)
            .unwrap()
            .iter()
            .map(|f| f.seq)
            .collect();
        assert_eq!(seqs, (40..=50).collect::<Vec<_>>());
        assert_eq!(tail.last_seq(), 50);
        // A point that names another record, or lands mid-frame: read from the start.
        for (seq, offset) in [(41, at40), (40, at40 + 3), (40, u64::MAX)] {
            let mut r = PagedReader::open_from(&path, seq, offset).unwrap().unwrap();
            let got = r.next_frames(usize::MAX, false).unwrap();
            assert_eq!(got.first().map(|f| f.seq), Some(1), "{seq}@{offset}");
            assert_eq!(got.len(), 50);
        }
    }

    /// A WAL image: a header, `records` frames with payloads of varying size, then zeros.
    fn image(records: u64, tail: &[u8]) -> Vec<u8> {
        let triple = crate::SessionTriple::new("/p", "h", "s").unwrap();
        let header = WalHeader::new(triple, 1);
        let mut out = header.encode();
        out.resize(header.data_offset as usize, 0);
        let tag = header.lineage_tag();
        for seq in 1..=records {
            let payload = format!("{{\"n\":\"{}\"}}", "x".repeat((seq * 37 % 3000) as usize));
            let mut frame = vec![0u8; FRAME_HEADER_BYTES + payload.len()];
            let synced = out.len() as u64;
            write_frame(&mut frame, seq, tag, synced, 1, 60_000, payload.as_bytes());
            out.extend_from_slice(&frame);
        }
        out.extend_from_slice(tail);
        out.resize(out.len() + 4096, 0);
        out
    }

    fn read_all(path: &Path, page: usize) -> (Vec<(u64, u64)>, Verdict, u64) {
        let mut r = PagedReader::open(path).unwrap();
        let mut seen = Vec::new();
        loop {
            let frames = r.next_frames(page, true).unwrap();
            if frames.is_empty() {
                break;
            }
            assert!(
                frames.len() == 1
                    || frames.iter().map(|f| f.payload.len()).sum::<usize>() < page + 3100
            );
            seen.extend(frames.iter().map(|f| (f.seq, f.offset)));
        }
        (seen, r.verdict().unwrap().clone(), r.end())
    }

    #[test]
    fn a_paged_read_agrees_with_the_whole_scan_at_every_page_size() {
        let dir = tempfile::tempdir().unwrap();
        for (name, tail) in [("clean", &b""[..]), ("torn", &b"\x01\x02garbage"[..])] {
            let bytes = image(400, tail);
            let path = dir.path().join(format!("{name}.wal"));
            std::fs::write(&path, &bytes).unwrap();
            let whole = crate::scan(&bytes).unwrap();
            let expected: Vec<(u64, u64)> =
                whole.frames.iter().map(|f| (f.seq, f.offset)).collect();
            for page in [1, 100, 4096, 1 << 20] {
                let (seen, verdict, end) = read_all(&path, page);
                assert_eq!(seen, expected, "{name} page {page}");
                assert_eq!(verdict, whole.verdict, "{name} page {page}");
                assert_eq!(end, whole.end);
            }
        }
    }

    #[test]
    fn a_frame_completed_by_the_writer_after_the_open_is_read_not_called_corruption() {
        let bytes = image(50, b"");
        let whole = crate::scan(&bytes).unwrap();
        let cut_frame = &whole.frames[30];
        // The file as a writer had it at the open: it ended on a sector inside frame 31.
        let cut = (cut_frame.offset / 512 + 1) * 512;
        assert!(cut < cut_frame.offset + cut_frame.len);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.wal");
        std::fs::write(&path, &bytes[..cut as usize]).unwrap();
        let mut r = PagedReader::open(&path).unwrap();
        // The writer completes that frame and appends the rest (each a durable witness).
        std::fs::write(&path, &bytes).unwrap();
        let mut seen = 0;
        loop {
            let frames = r.next_frames(usize::MAX, true).unwrap();
            if frames.is_empty() {
                break;
            }
            seen += frames.len();
        }
        assert_eq!(seen, 50);
        assert_eq!(r.verdict(), Some(&whole.verdict));
    }

    #[test]
    fn damage_with_a_durable_witness_is_corruption_in_both_reads() {
        let mut bytes = image(300, b"");
        let whole = crate::scan(&bytes).unwrap();
        let victim = &whole.frames[100];
        bytes[victim.payload.start] ^= 0xff;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.wal");
        std::fs::write(&path, &bytes).unwrap();
        let whole = crate::scan(&bytes).unwrap();
        assert!(matches!(whole.verdict, Verdict::Corrupt { .. }));
        let (seen, verdict, end) = read_all(&path, 10_000);
        assert_eq!(seen.len(), 100);
        assert_eq!((verdict, end), (whole.verdict, whole.end));
    }
}
