//! Other harnesses' session logs read into broca episodes: Claude Code's session JSONL
//! (`~/.claude/projects/<project>/<session>.jsonl`) and Codex's rollout JSONL
//! (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`). Sans-IO: handed a file's bytes and what
//! the session already holds of it, [`plan`] answers the episode to append (or that there is
//! nothing new), never half of one: a malformed line is an error naming file and line.
//!
//! Where things are: other harnesses' logs (Claude Code, Codex) planned into episodes, sans-IO,
//! a line and an episode bounded (docs/import.md); the reading of a log (regular files only,
//! bounded) and `session.import`'s folder confinement are broca-session's (`import.rs`)

mod claude;
mod codex;
mod episode;

use broca_wal::importrec::{EpisodeImported, ImportOrigin};
use broca_wire::Code;

/// A log format broca reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    ClaudeCode,
    Codex,
}

impl Format {
    /// The format's name: also the harness of a session imported from it by default.
    pub fn name(self) -> &'static str {
        match self {
            Format::ClaudeCode => "claude-code",
            Format::Codex => "codex",
        }
    }

    pub fn parse(name: &str) -> Option<Format> {
        match name {
            "claude-code" => Some(Format::ClaudeCode),
            "codex" => Some(Format::Codex),
            _ => None,
        }
    }
}

/// The most bytes one line of a log may have (an episode is one WAL record, and one record
/// holds at most [`broca_wal::frame::PAYLOAD_BYTES_MAX`]).
pub const LINE_BYTES_MAX: usize = 8 << 20;

/// Why a log cannot be imported. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportError {
    /// `import_malformed`, `import_empty`, `import_conflict`, `import_diverged`, or the
    /// reader's own (`import_unreadable`, `import_too_large`, `invalid_params`).
    pub code: Code,
    pub file: String,
    /// The 1-based line the error is about, when it is about one.
    pub line: Option<u64>,
    pub message: String,
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ImportError {}

/// Who a log says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The log's own session id.
    pub session: String,
    /// The working directory the session ran in, if the log says.
    pub cwd: Option<String>,
}

/// What the session holds of a source already: its latest import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prior {
    pub import_id: String,
    pub bytes: u64,
    pub blake3: String,
    pub last_line: u64,
    /// Whether the session went on after that import (a run of its own): a longer log
    /// can no longer be appended.
    pub diverged: bool,
}

/// What importing a source comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// The session holds the source as it is: nothing to write.
    Nothing { import_id: String },
    /// An episode to append (its `import_id` and `at_unix_ms` are the writer's to fill).
    Episode(Box<EpisodeImported>),
}

/// Reads a log's identity (its session id and working directory).
pub fn identify(format: Format, file: &str, bytes: &[u8]) -> Result<Identity, ImportError> {
    let lines = Lines::new(file, &bytes[..covered(bytes).0], 0, 1);
    let found = match format {
        Format::ClaudeCode => claude::identify(lines)?,
        Format::Codex => codex::identify(lines)?,
    };
    found.ok_or_else(|| ImportError {
        code: Code::ImportEmpty,
        file: file.to_string(),
        line: None,
        message: format!("no {} session id in the log", format.name()),
    })
}

/// Plans the import of `bytes` (the file `file`, as the log's `identity` says) into a session
/// that holds `prior` of it and whose last assistant message left `open_calls` without a
/// result. `progress` hears the bytes read so far, now and then.
pub fn plan(
    format: Format,
    file: &str,
    bytes: &[u8],
    identity: &Identity,
    prior: Option<&Prior>,
    open_calls: &[String],
    progress: &mut dyn FnMut(u64),
) -> Result<Plan, ImportError> {
    let err = |code, line, message: String| ImportError {
        code,
        file: file.to_string(),
        line,
        message,
    };
    let (covered, cut) = covered(bytes);
    let (start, first_line) = match prior {
        None => (0, 1),
        Some(p) => match continues(file, bytes, covered, p)? {
            Some(from) => from,
            None => {
                return Ok(Plan::Nothing {
                    import_id: p.import_id.clone(),
                })
            }
        },
    };
    assert!(start <= covered, "an import starts inside what it covers");
    let lines = Lines::new(file, &bytes[..covered], start, first_line).with_progress(progress);
    let mut episode = episode::Episode::new(format.name(), open_calls);
    let last_line = match format {
        Format::ClaudeCode => claude::read(lines, &mut episode)?,
        Format::Codex => codex::read(lines, &mut episode)?,
    };
    if let Some(line) = cut {
        episode.note(
            line,
            "the line is incomplete (the log was cut, or is still being written): left for a \
             later import",
        );
    }
    if prior.is_none() && episode.is_empty() {
        return Err(err(
            Code::ImportEmpty,
            None,
            format!("no conversation in the log (no {} message)", format.name()),
        ));
    }
    let built = episode.finish();
    let episode = EpisodeImported {
        import_id: String::new(),
        origin: ImportOrigin {
            format: format.name().to_string(),
            source: file.to_string(),
            source_session: identity.session.clone(),
            blake3: blake3::hash(&bytes[..covered]).to_hex().to_string(),
            bytes: covered as u64,
            first_line,
            last_line: last_line.max(first_line.saturating_sub(1)),
            continues: prior.map(|p| p.import_id.clone()),
        },
        messages: built.messages,
        usage: built.usage,
        outcome_unknown: built.outcome_unknown,
        pending: built.pending,
        notes: built.notes,
        at_unix_ms: 0,
    };
    fits(file, &episode)?;
    Ok(Plan::Episode(Box::new(episode)))
}

/// Room a record's encoding keeps for what the writer fills in (the import id, the time).
const EPISODE_SLACK_BYTES: usize = 256;

/// Refuses an episode whose record would be larger than one WAL record may be, naming the
/// log and the lines it covers.
fn fits(file: &str, episode: &EpisodeImported) -> Result<(), ImportError> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, episode).map_err(|e| ImportError {
        code: Code::ImportMalformed,
        file: file.to_string(),
        line: None,
        message: format!("the episode cannot be encoded: {e}"),
    })?;
    let limit = broca_wal::frame::PAYLOAD_BYTES_MAX - EPISODE_SLACK_BYTES;
    if count.0 <= limit {
        return Ok(());
    }
    Err(ImportError {
        code: Code::ImportTooLarge,
        file: file.to_string(),
        line: None,
        message: format!(
            "lines {} to {} come to an episode of {} bytes, more than the {limit} one import \
             may write: import the log while it is shorter, or in parts as it grows",
            episode.origin.first_line, episode.origin.last_line, count.0
        ),
    })
}

/// Where a log that was imported before (`prior`) goes on: the byte and the line its new part
/// starts at; `None` when it holds nothing new. Refused when it is not a longer version of
/// what was imported, or the session went on after that import.
fn continues(
    file: &str,
    bytes: &[u8],
    covered: usize,
    p: &Prior,
) -> Result<Option<(usize, u64)>, ImportError> {
    let err = |code, message: String| ImportError {
        code,
        file: file.to_string(),
        line: None,
        message,
    };
    let same = p.bytes <= covered as u64
        && blake3::hash(&bytes[..p.bytes as usize]).to_hex().as_str() == p.blake3;
    if !same {
        return Err(err(
            Code::ImportConflict,
            format!(
                "not a longer version of the log imported as {}: its first {} bytes differ \
                 from what that import read",
                p.import_id, p.bytes
            ),
        ));
    }
    if p.bytes == covered as u64 {
        return Ok(None);
    }
    if p.diverged {
        return Err(err(
            Code::ImportDiverged,
            format!(
                "the session went on in broca after import {}: the log's new lines (from line \
                 {}) cannot be appended after it",
                p.import_id,
                p.last_line + 1
            ),
        ));
    }
    Ok(Some((p.bytes as usize, p.last_line + 1)))
}

/// The bytes an import covers: through the last complete line, and the final unterminated
/// line too when it is whole JSON (the writer has not added its newline yet). The number
/// of an incomplete last line, if there is one.
fn covered(bytes: &[u8]) -> (usize, Option<u64>) {
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let tail = &bytes[end..];
    if tail.iter().all(u8::is_ascii_whitespace) {
        return (bytes.len(), None);
    }
    if serde_json::from_slice::<serde::de::IgnoredAny>(tail).is_ok() {
        return (bytes.len(), None);
    }
    let line = bytes[..end].iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    debug_assert!(end < bytes.len(), "an incomplete last line is left out");
    (end, Some(line))
}

/// A log's lines from an offset, numbered, each parsed as JSON.
pub(crate) struct Lines<'a> {
    file: &'a str,
    bytes: &'a [u8],
    at: usize,
    line: u64,
    /// The number of the last line handed out.
    last: u64,
    progress: Option<Progress<'a>>,
}

impl<'a> Lines<'a> {
    fn new(file: &'a str, bytes: &'a [u8], start: usize, first_line: u64) -> Lines<'a> {
        // A line the previous import took whole before its newline was written: that
        // newline ends it, and starts nothing.
        let start = if start > 0 && bytes.get(start) == Some(&b'\n') && bytes[start - 1] != b'\n' {
            start + 1
        } else {
            start
        };
        Lines {
            file,
            bytes,
            at: start,
            line: first_line,
            last: first_line.saturating_sub(1),
            progress: None,
        }
    }

    /// Reports the bytes read to `report` now and then.
    fn with_progress(mut self, report: &'a mut dyn FnMut(u64)) -> Lines<'a> {
        self.progress = Some(Progress::new(report));
        self
    }

    /// The number of the last line handed out (the one before the first, before any).
    pub fn last_line(&self) -> u64 {
        self.last
    }

    /// The error for line `line`.
    pub fn error(&self, line: u64, message: String) -> ImportError {
        ImportError {
            code: Code::ImportMalformed,
            file: self.file.to_string(),
            line: Some(line),
            message,
        }
    }

    /// The next non-empty line: its number and its JSON.
    pub fn next_value(&mut self) -> Option<Result<(u64, serde_json::Value), ImportError>> {
        loop {
            if self.at >= self.bytes.len() {
                return None;
            }
            let rest = &self.bytes[self.at..];
            let len = rest.iter().position(|&b| b == b'\n');
            let text = &rest[..len.unwrap_or(rest.len())];
            self.at += len.map_or(rest.len(), |l| l + 1);
            let line = self.line;
            self.line += 1;
            self.last = line;
            debug_assert!(
                self.at <= self.bytes.len(),
                "lines are read within the bytes"
            );
            if let Some(p) = &mut self.progress {
                p.at(self.at as u64);
            }
            if text.len() > LINE_BYTES_MAX {
                return Some(Err(ImportError {
                    code: Code::ImportTooLarge,
                    file: self.file.to_string(),
                    line: Some(line),
                    message: format!(
                        "the line has {} bytes, more than the {LINE_BYTES_MAX} a line may have",
                        text.len()
                    ),
                }));
            }
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(
                serde_json::from_slice(text)
                    .map(|v| (line, v))
                    .map_err(|e| self.error(line, format!("not a JSON line: {e}"))),
            );
        }
    }
}

/// Calls `progress` every 4 MiB read.
struct Progress<'p> {
    report: &'p mut dyn FnMut(u64),
    next: u64,
}

impl<'p> Progress<'p> {
    fn new(report: &'p mut dyn FnMut(u64)) -> Progress<'p> {
        Progress {
            report,
            next: 4 << 20,
        }
    }

    fn at(&mut self, offset: u64) {
        if offset >= self.next {
            (self.report)(offset);
            self.next = offset + (4 << 20);
        }
        debug_assert!(self.next > offset, "the next report is ahead");
    }
}

/// A string field of a JSON object.
pub(crate) fn str_of<'v>(v: &'v serde_json::Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(serde_json::Value::as_str)
}

/// A count field of a JSON object (absent, null or not a count: `None`).
pub(crate) fn count_of(v: &serde_json::Value, key: &str) -> Option<u64> {
    v.get(key).and_then(serde_json::Value::as_u64)
}

#[cfg(test)]
mod tests;
