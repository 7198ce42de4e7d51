//! `broca wal verify` and `broca wal dump`: read-only checks of WAL files, with plain std I/O
//! (no executor, no lease, no truncation).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::reader::PagedReader;
use super::record::Record;
use super::recovery::{scan, Scan, Verdict};
use super::{HeaderError, WalError};

/// The verdict on one file.
#[derive(Debug)]
pub enum FileReport {
    /// Intact: `records` valid records, nothing after them but zeros.
    Intact { records: usize, end: u64 },
    /// Intact up to a torn tail that the writer cuts when it opens the log.
    Torn {
        records: usize,
        at: u64,
        bytes: u64,
        reason: String,
    },
    /// The file holds no bytes (or only zeros): a crash while it was being created.
    Empty { reason: HeaderError },
    /// Corruption, or a file that is not a WAL, or one that cannot be read.
    Failed(WalError),
}

impl FileReport {
    /// Whether this report fails `wal verify`.
    pub fn is_failure(&self) -> bool {
        matches!(self, FileReport::Failed(_))
    }
}

/// The media the WAL at `path` references (a send's attachments, a tool's images, a committed
/// upload), each once, read page by page (bounded memory, as `wal verify` reads). A record
/// of a media-bearing kind that does not decode is skipped: `verify_file` names it.
pub fn referenced_media(path: &Path) -> Result<Vec<broca_protocol::media::Media>, WalError> {
    use super::record::kind;
    use std::collections::BTreeMap;
    let Some(mut reader) = PagedReader::open_if_any(path)? else {
        return Ok(Vec::new());
    };
    let mut media: BTreeMap<String, broca_protocol::media::Media> = BTreeMap::new();
    let mut begun: BTreeMap<String, broca_protocol::media::Media> = BTreeMap::new();
    loop {
        let page = reader.next_frames(PAGE_BYTES, true)?;
        if page.is_empty() {
            break;
        }
        for f in page {
            if !matches!(
                f.kind,
                kind::RUN_STARTED
                    | kind::SEND_QUEUED
                    | kind::SEND_STEERED
                    | kind::TOOL_RESULT
                    | kind::UPLOAD_BEGUN
                    | kind::UPLOAD_COMMITTED
            ) {
                continue;
            }
            let mut add = |m: &broca_protocol::media::Media| {
                media.insert(m.sha256.clone(), m.clone());
            };
            match Record::decode(f.kind, &f.payload) {
                Ok(Record::RunStarted(r)) => r.media.iter().for_each(&mut add),
                Ok(Record::SendQueued(r)) => r.media.iter().for_each(&mut add),
                Ok(Record::SendSteered(r)) => r.media.iter().for_each(&mut add),
                Ok(Record::ToolResult(r)) => r.result.parts.iter().for_each(|p| {
                    if let crate::runrec::ResultPart::Media(m) = p {
                        add(m)
                    }
                }),
                Ok(Record::UploadBegun(u)) => {
                    let m = broca_protocol::media::Media {
                        kind: broca_protocol::media::kind_of(&u.mime)
                            .unwrap_or(broca_protocol::media::kind::DOCUMENT)
                            .into(),
                        mime: u.mime,
                        bytes: u.bytes,
                        sha256: u.sha256,
                    };
                    begun.insert(u.upload_id, m);
                }
                Ok(Record::UploadCommitted(u)) => {
                    if let Some(m) = begun.remove(&u.upload_id) {
                        add(&m);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(media.into_values().collect())
}

/// Reads the file at `path` and scans it.
pub fn read_and_scan(path: &Path) -> Result<(Vec<u8>, Scan), WalError> {
    let bytes = fs::read(path).map_err(|e| WalError::Io {
        path: path.to_path_buf(),
        op: "read",
        message: e.to_string(),
    })?;
    let scan = scan(&bytes).map_err(|error| WalError::Header {
        path: path.to_path_buf(),
        error,
    })?;
    Ok((bytes, scan))
}

/// Like [`read_and_scan`], for a reader beside a live writer: `None` when the file does not
/// exist yet or is still being created (empty, or its header not yet written).
///
/// A session without a live WAL is read from the newest sealed container holding it (its
/// digest checked): the live WAL first, then the archive.
pub fn read_and_scan_if_any(path: &Path) -> Result<Option<(Vec<u8>, Scan)>, WalError> {
    let scanned = match read_live(path)? {
        Some(bytes) => {
            let first = scan_bytes(path, bytes);
            // Read while a writer wrote its tail, a damaged frame can seem to have a durable
            // witness after it: corruption is what a second read of the file still shows.
            match first {
                Ok((_, ref s)) if matches!(s.verdict, crate::Verdict::Corrupt { .. }) => {
                    match read_live(path)? {
                        Some(again) => scan_bytes(path, again),
                        None => first,
                    }
                }
                other => other,
            }
        }
        None => match super::archive::archived_bytes(path).map_err(WalError::from)? {
            Some(b) => scan_bytes(path, b),
            None => return Ok(None),
        },
    };
    match scanned {
        Ok(found) => Ok(Some(found)),
        Err(WalError::Header {
            error: HeaderError::Empty | HeaderError::Uninitialized,
            ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The live WAL's bytes; `None` when there is no file.
fn read_live(path: &Path) -> Result<Option<Vec<u8>>, WalError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WalError::Io {
            path: path.to_path_buf(),
            op: "read",
            message: e.to_string(),
        }),
    }
}

fn scan_bytes(path: &Path, bytes: Vec<u8>) -> Result<(Vec<u8>, Scan), WalError> {
    scan(&bytes)
        .map(|scan| (bytes, scan))
        .map_err(|error| WalError::Header {
            path: path.to_path_buf(),
            error,
        })
}

/// Payload bytes read per page while verifying or dumping (memory stays about this size,
/// whatever the file's).
const PAGE_BYTES: usize = 1 << 20;

/// Verifies one WAL file, reading it in pages.
pub fn verify_file(path: &Path) -> FileReport {
    let mut reader = match PagedReader::open(path) {
        Ok(r) => r,
        Err(WalError::Header {
            error: reason @ (HeaderError::Empty | HeaderError::Uninitialized),
            ..
        }) => return FileReport::Empty { reason },
        Err(e) => return FileReport::Failed(e),
    };
    if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
        let expected = reader.header().address.wal_file_name();
        if name.ends_with(".wal") && name != expected {
            return FileReport::Failed(WalError::Corrupt {
                path: path.to_path_buf(),
                offset: 0,
                reason: format!("misdirected: the header names session file {expected}"),
            });
        }
    }
    let mut records = 0;
    loop {
        match reader.next_frames(PAGE_BYTES, true) {
            Ok(page) if page.is_empty() => break,
            Ok(page) => records += page.len(),
            Err(e) => return FileReport::Failed(e),
        }
    }
    let end = reader.end();
    match reader.verdict().cloned().unwrap_or(Verdict::Clean) {
        Verdict::Clean => FileReport::Intact { records, end },
        Verdict::Torn { reason, bytes } => FileReport::Torn {
            records,
            at: end,
            bytes,
            reason,
        },
        Verdict::Corrupt { reason } => FileReport::Failed(WalError::Corrupt {
            path: path.to_path_buf(),
            offset: end,
            reason: corruption_text(&reason),
        }),
    }
}

/// The WAL files a `verify` argument names: a file itself; a directory's `*.wal` files; a state
/// directory's `wal/*.wal` files. Sorted by name.
pub fn wal_files(arg: &Path) -> Result<Vec<PathBuf>, WalError> {
    let io = |path: &Path, op: &'static str| {
        let path = path.to_path_buf();
        move |e: std::io::Error| WalError::Io {
            path,
            op,
            message: e.to_string(),
        }
    };
    let meta = fs::metadata(arg).map_err(io(arg, "stat"))?;
    if !meta.is_dir() {
        // A file named is verified only when it is a regular file: a FIFO would hang the read.
        if let Some(what) = crate::listing::not_regular(&meta.file_type()) {
            return Err(WalError::Io {
                path: arg.to_path_buf(),
                op: "open",
                message: format!("{what}, not a WAL (a WAL is a regular file)"),
            });
        }
        return Ok(vec![arg.to_path_buf()]);
    }
    let dir = if arg.join("wal").is_dir() {
        arg.join("wal")
    } else {
        arg.to_path_buf()
    };
    crate::listing::wal_dir_files(&dir).map_err(io(&dir, "list"))
}

/// Writes one JSON line per record of `path` to `out`: seq, offset, len, kind, epoch and the
/// record itself, reading the file in pages. Stops with an error at corruption, after
/// printing the records before it.
pub fn dump(path: &Path, out: &mut impl Write) -> Result<(), WalError> {
    // A session's WAL path that only the archive holds is dumped from there.
    let mut reader = match PagedReader::open_if_any(path)? {
        Some(r) => r,
        None => PagedReader::open(path)?,
    };
    let write_err = |e: std::io::Error| WalError::Io {
        path: PathBuf::from("<stdout>"),
        op: "write",
        message: e.to_string(),
    };
    loop {
        let page = reader.next_frames(PAGE_BYTES, true)?;
        if page.is_empty() {
            break;
        }
        for frame in &page {
            let payload = &frame.payload;
            let kind_name = Record::kind_name(frame.kind);
            let record: serde_json::Value = serde_json::from_slice(payload).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(payload).into_owned())
            });
            let line = serde_json::json!({
                "seq": frame.seq,
                "offset": frame.offset,
                "len": (super::frame::FRAME_HEADER_BYTES + payload.len()) as u64,
                "kind": kind_name.map_or_else(|| format!("unknown({})", frame.kind), str::to_string),
                "epoch": frame.epoch,
                "record": record,
            });
            serde_json::to_writer(&mut *out, &line).map_err(|e| write_err(e.into()))?;
            out.write_all(b"\n").map_err(write_err)?;
        }
    }
    if let Some(Verdict::Corrupt { reason }) = reader.verdict() {
        return Err(WalError::Corrupt {
            path: path.to_path_buf(),
            offset: reader.end(),
            reason: corruption_text(reason),
        });
    }
    Ok(())
}

/// A corruption as a WAL error says it: what was found, and the case of the recovery table.
pub fn corruption_text(c: &crate::Corruption) -> String {
    format!("{c} (recovery case {})", c.case())
}
