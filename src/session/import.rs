//! Importing another harness's log into the session: the plan is made on the blocking pool
//! from what the session holds of the source, and an episode is appended as one record,
//! durable before the answer. Nothing is written for a refused import or for a source the
//! session holds already.

use std::sync::Arc;

use broca_core::replay::Session;
use broca_import::{Format, ImportError, Plan, Prior};
use broca_wal::Record;

use broca_protocol::model::ModelClient;
use broca_tools::ToolRunner;

use crate::actor::{ActorError, SessionActor};
use crate::command::{ImportInput, ImportReply};

impl<P: ModelClient, T: ToolRunner> SessionActor<P, T> {
    /// Imports `input` into the session (see the module's doc); `progress` hears the bytes
    /// read, from the blocking pool.
    pub async fn import(
        &mut self,
        input: ImportInput,
        progress: Box<dyn FnMut(u64) + Send>,
    ) -> Result<ImportReply, ActorError> {
        if let Some(open) = &self.state.open {
            return Err(busy(input.file, &self.state.runs[open.index].run_id));
        }
        let prior = prior_of(&self.state, &input);
        let open_calls = self.state.unresolved_calls.clone();
        let planned = broca_io::blocking::run(broca_io::blocking::Kind::Import, move || {
            let mut progress = progress;
            broca_import::plan(
                input.format,
                &input.file,
                &input.bytes,
                &input.identity,
                prior.as_ref(),
                &open_calls,
                &mut *progress,
            )
        })
        .await
        .map_err(ActorError::Import)?;
        let mut episode = match planned {
            Plan::Nothing { import_id } => return Ok(existing(&self.state, import_id)),
            Plan::Episode(e) => e,
        };
        episode.import_id = self.next_id("imp");
        episode.at_unix_ms = crate::now_unix_ms();
        let reply = ImportReply {
            import_id: episode.import_id.clone(),
            existing: false,
            messages: episode.messages.len(),
            first_line: episode.origin.first_line,
            last_line: episode.origin.last_line,
            outcome_unknown: episode.outcome_unknown.clone(),
            pending: episode.pending.clone(),
            notes: episode
                .notes
                .iter()
                .map(|n| format!("line {}: {}", n.line, n.note))
                .collect(),
        };
        self.append(Record::EpisodeImported(episode), true).await?;
        self.state.refresh_unresolved();
        Ok(reply)
    }
}

/// The refusal of an import into a session whose run `run_id` has not ended.
pub(crate) fn busy(file: String, run_id: &str) -> ActorError {
    ActorError::Import(ImportError {
        code: broca_wire::Code::SessionBusy,
        file,
        line: None,
        message: format!("the session's run {run_id} has not ended: import once it has"),
    })
}

/// What the session holds of the source of `input`.
fn prior_of(state: &Session, input: &ImportInput) -> Option<Prior> {
    state
        .imported(input.format.name(), &input.identity.session)
        .map(|i| Prior {
            import_id: i.import_id.clone(),
            bytes: i.bytes,
            blake3: i.blake3.clone(),
            last_line: i.last_line,
            diverged: state.transcript.len() != i.transcript_len,
        })
}

/// The answer for a source the session holds as it is (import `import_id`).
fn existing(state: &Session, import_id: String) -> ImportReply {
    let held = state
        .imports
        .iter()
        .find(|i| i.import_id == import_id)
        .map_or(0, |i| i.last_line);
    ImportReply {
        import_id,
        existing: true,
        messages: 0,
        first_line: held + 1,
        last_line: held,
        outcome_unknown: Vec::new(),
        pending: Vec::new(),
        notes: Vec::new(),
    }
}

/// What importing `input` comes to, decided from a read of the session's WAL at `wal`
/// (no lease taken, nothing written): `Some` answer when the session holds the log as it is
/// already, an error when the import is refused (the log is malformed, or not a
/// continuation of what was imported), `None` when there is something to write. The actor
/// plans again under the lease before it writes.
pub fn check_read_only(
    wal: &std::path::Path,
    input: &ImportInput,
) -> Result<Option<ImportReply>, ImportError> {
    let state = match broca_read::read_session(wal, broca_read::Keep::State) {
        Ok(None) => Session::default(),
        Ok(Some(read)) => read.session,
        Err(_) => return Ok(None), // the actor's open names what is wrong with the WAL
    };
    let prior = prior_of(&state, input);
    let plan = broca_import::plan(
        input.format,
        &input.file,
        &input.bytes,
        &input.identity,
        prior.as_ref(),
        &state.unresolved_calls,
        &mut |_| {},
    )?;
    Ok(match plan {
        Plan::Nothing { import_id } => Some(existing(&state, import_id)),
        Plan::Episode(_) => None,
    })
}

/// The most bytes one log may have: a larger file is refused before it is read, and one that
/// grows past it while it is read is refused then.
pub const IMPORT_BYTES_MAX: u64 = 256 << 20;

/// The logs `paths` name, in order: each file named, and every `*.jsonl` file under each
/// directory named (at any depth, sorted by path).
pub fn log_files(paths: &[std::path::PathBuf]) -> Result<Vec<std::path::PathBuf>, ImportError> {
    use std::path::{Path, PathBuf};
    fn unreadable(path: &Path, e: std::io::Error) -> ImportError {
        ImportError {
            code: broca_wire::Code::ImportUnreadable,
            file: path.display().to_string(),
            line: None,
            message: e.to_string(),
        }
    }
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), ImportError> {
        let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))?;
        let mut paths = Vec::new();
        for entry in entries {
            paths.push(entry.map_err(|e| unreadable(dir, e))?.path());
        }
        paths.sort();
        for p in paths {
            // A link is not followed into a folder (a link to a folder above would loop);
            // a `*.jsonl` entry of any kind is listed, and its read says what it is.
            let kind = std::fs::symlink_metadata(&p).map_err(|e| unreadable(&p, e))?;
            if kind.is_dir() {
                walk(&p, out)?;
            } else if p.extension().is_some_and(|e| e == "jsonl") {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| unreadable(p, e))?;
        if meta.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Refuses `path` unless, with its links followed, it lies in one of `roots` (the folders a
/// management caller may import from; a root that does not exist holds nothing).
pub fn confine(roots: &[std::path::PathBuf], path: &std::path::Path) -> Result<(), ImportError> {
    let shown = path.display().to_string();
    let real = std::fs::canonicalize(path).map_err(|e| ImportError {
        code: broca_wire::Code::ImportUnreadable,
        file: shown.clone(),
        line: None,
        message: e.to_string(),
    })?;
    let inside = roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .any(|r| real.starts_with(&r));
    if inside {
        return Ok(());
    }
    let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(ImportError {
        code: broca_wire::Code::ImportForbidden,
        file: shown,
        line: None,
        message: if listed.is_empty() {
            "this daemon imports from no folder (its import_roots are empty)".into()
        } else {
            format!(
                "outside the folders this daemon imports from ({}): set --import-root to \
                 import from elsewhere",
                listed.join(", ")
            )
        },
    })
}

/// The session parts given for an import; a part not given comes from the log (the
/// project root from its working directory, the harness from its format, the session from
/// its id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportTarget {
    pub project_root: Option<String>,
    pub harness: Option<String>,
    pub session: Option<String>,
}

/// Reads the log at `path` and finds the session it goes into. Errors: `import_unreadable`,
/// `import_too_large`, `invalid_params` (the session it would go into), and the log's own
/// (`import_malformed`, `import_empty`).
pub fn read_source(
    format: Format,
    path: &std::path::Path,
    target: &ImportTarget,
) -> Result<(broca_wal::SessionTriple, ImportInput), ImportError> {
    let fail = |code, file: &str, message: String| ImportError {
        code,
        file: file.to_string(),
        line: None,
        message,
    };
    let shown = path.display().to_string();
    let path = std::path::absolute(path)
        .map_err(|e| fail(broca_wire::Code::ImportUnreadable, &shown, e.to_string()))?;
    let file = path
        .to_str()
        .ok_or_else(|| {
            fail(
                broca_wire::Code::ImportUnreadable,
                &shown,
                "the path is not UTF-8".into(),
            )
        })?
        .to_string();
    let bytes = read_log(&path, &file)?;
    let identity = broca_import::identify(format, &file, &bytes)?;
    let root = match (&target.project_root, &identity.cwd) {
        (Some(root), _) | (None, Some(root)) => root.clone(),
        (None, None) => {
            return Err(fail(
                broca_wire::Code::InvalidParams,
                &file,
                "the log names no working directory: give the project root".into(),
            ))
        }
    };
    let harness = target.harness.as_deref().unwrap_or(format.name());
    let session = target.session.as_deref().unwrap_or(&identity.session);
    let triple = broca_wal::SessionTriple::new(&root, harness, session)
        .map_err(|e| fail(broca_wire::Code::InvalidParams, &file, e.to_string()))?;
    Ok((
        triple,
        ImportInput {
            format,
            file,
            bytes: Arc::new(bytes),
            identity,
        },
    ))
}

/// The bytes of the log at `path` (shown as `file`): a regular file only (a FIFO, a device,
/// a socket or a folder, or a link to one, is refused before a byte is read: the file is
/// opened without blocking and its kind taken from the open file, so nothing can be swapped
/// in between), and at most [`IMPORT_BYTES_MAX`] bytes.
fn read_log(path: &std::path::Path, file: &str) -> Result<Vec<u8>, ImportError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |code, message: String| ImportError {
        code,
        file: file.to_string(),
        line: None,
        message,
    };
    let unreadable = |e: std::io::Error| fail(broca_wire::Code::ImportUnreadable, e.to_string());
    let log = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(unreadable)?;
    let meta = log.metadata().map_err(unreadable)?;
    let what = broca_wal::listing::not_regular(&meta.file_type());
    if let Some(what) = what {
        return Err(fail(
            broca_wire::Code::ImportUnreadable,
            format!("{what}: a log is read from a regular file only"),
        ));
    }
    let too_large = |len: u64| {
        fail(
            broca_wire::Code::ImportTooLarge,
            format!("{len} bytes, more than the {IMPORT_BYTES_MAX} a log may have"),
        )
    };
    if meta.len() > IMPORT_BYTES_MAX {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&log)
        .take(IMPORT_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > IMPORT_BYTES_MAX {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

impl ImportReply {
    /// The reply as the management surface and `broca import --json` give it.
    pub fn to_json(&self, file: &str, triple: &broca_wal::SessionTriple) -> serde_json::Value {
        serde_json::json!({
            "file": file,
            "project_root": triple.project_root,
            "harness": triple.harness,
            "session": triple.session,
            "import_id": self.import_id,
            "existing": self.existing,
            "messages": self.messages,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "outcome_unknown": self.outcome_unknown,
            "pending": self.pending,
            "notes": self.notes,
        })
    }
}

/// The management error for a refused import.
pub fn import_error(e: &ImportError) -> broca_wire::RpcError {
    broca_wire::RpcError::new(e.code, e.to_string())
}
