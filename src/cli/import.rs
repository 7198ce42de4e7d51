//! `broca import claude-code|codex PATH...`: other harnesses' session logs into broca
//! sessions, in this process (a running serve takes them through `session.import`).

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broca_import::Format;
use broca_run::import_logs;
use broca_session::{log_files, ImportTarget};

use super::{print_help, rest, usage, EXIT_FAILURE, EXIT_OK};

pub(super) const IMPORT_HELP: &str = "\
Usage: broca import <claude-code|codex> [options] PATH...

Imports other harnesses' session logs into broca sessions, which then continue with
`broca run` or `session.send` like any other. PATH is a log, or a folder whose *.jsonl files
(at any depth) are all imported: Claude Code writes ~/.claude/projects/<project>/<id>.jsonl,
Codex ~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl.

Each log becomes one episode, written as one durable record (all of it or nothing), whose
origin names the file and the blake3 of its bytes. The same log again imports nothing; a
longer version of it (the session went on) appends only its new lines. Tool calls without
a result, and the placeholders a harness writes for interrupted calls, are recorded as
outcome unknown, never as success; usage is kept as the log reported it. What is left out
(reasoning that cannot be sent back, harness instructions) is listed with its line.

Options (each part of the session identity defaults to the log's own):
  --project-root P   default: the log's working directory
  --harness H        default: claude-code or codex
  --session S        default: the log's session id
  --json             one JSON line per log instead of the summary

Exit 0 when every log was imported (or was already), 1 if any was refused (each named, with
file and line; nothing was written for it), 2 for bad usage.
";

pub(super) fn import(
    mut pargs: pico_args::Arguments,
    help: bool,
    state_dir: Option<PathBuf>,
) -> u8 {
    if help {
        return print_help(IMPORT_HELP);
    }
    let format = match pargs.subcommand().ok().flatten().as_deref() {
        Some(name) => match Format::parse(name) {
            Some(f) => f,
            None => {
                return usage(&format!(
                    "unknown log format `{name}` (claude-code or codex)"
                ))
            }
        },
        None => return usage("`broca import` needs a format: claude-code or codex"),
    };
    let target = match import_target(&mut pargs) {
        Ok(t) => t,
        Err(e) => return usage(&e),
    };
    let json = pargs.contains("--json");
    let paths: Vec<PathBuf> = match rest(pargs) {
        Ok(rest) if rest.is_empty() => return usage("`broca import` needs a PATH"),
        Ok(rest) => rest.into_iter().map(PathBuf::from).collect::<Vec<_>>(),
        Err(e) => return usage(&e),
    };
    let Some(state_dir) = super::resolve_state_dir(state_dir) else {
        return usage("no state dir: set --state-dir, BROCA_STATE_DIR or HOME");
    };
    let files = match log_files(&paths) {
        Ok(f) if !f.is_empty() => f,
        Ok(_) => {
            broca_io::errln!("broca: no *.jsonl log under {}", display(&paths));
            return EXIT_FAILURE;
        }
        Err(e) => {
            broca_io::errln!("broca: {e}");
            return EXIT_FAILURE;
        }
    };
    let bar = Arc::new(Bar::new(&files));
    let progress = {
        let bar = bar.clone();
        Arc::new(move |bytes: u64| bar.within(bytes))
    };
    let report = Box::new(
        |path: &std::path::Path, done: Result<_, broca_run::Failure>| {
            bar.clear();
            match done {
                Ok((triple, r)) => report_done(json, path, &triple, &r),
                Err(e) => {
                    broca_io::errln!("broca: {e}");
                    if json {
                        let line = serde_json::json!({"file": path, "error": e.to_string()});
                        broca_io::outln!("{line}");
                    }
                }
            }
            bar.file_done(path);
        },
    );
    match import_logs(state_dir, format, files, target, report, progress) {
        Ok(0) => EXIT_OK,
        Ok(failed) => {
            broca_io::errln!("broca: {failed} log(s) not imported");
            EXIT_FAILURE
        }
        Err(e) => {
            broca_io::errln!("broca: {e}");
            EXIT_FAILURE
        }
    }
}

/// Where `broca import`'s logs go: the flags that name a session's parts.
fn import_target(pargs: &mut pico_args::Arguments) -> Result<ImportTarget, String> {
    let mut opt = |name: &'static str| {
        pargs
            .opt_value_from_str::<_, String>(name)
            .map_err(|e| format!("{name}: {e}"))
    };
    Ok(ImportTarget {
        project_root: opt("--project-root")?,
        harness: opt("--harness")?,
        session: opt("--session")?,
    })
}

fn display(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

fn report_done(
    json: bool,
    path: &std::path::Path,
    triple: &broca_wal::SessionTriple,
    r: &broca_session::ImportReply,
) {
    if json {
        let line = r.to_json(&path.display().to_string(), triple);
        broca_io::outln!("{line}");
        return;
    }
    if r.existing {
        broca_io::outln!(
            "{}: already imported as {} (session {}), nothing new",
            path.display(),
            r.import_id,
            triple.session
        );
        return;
    }
    broca_io::outln!(
        "{}: imported lines {}-{} as {} into {} / {} / {}: {} messages{}{}{}",
        path.display(),
        r.first_line,
        r.last_line,
        r.import_id,
        triple.project_root,
        triple.harness,
        triple.session,
        r.messages,
        counted(", outcome unknown: ", &r.outcome_unknown),
        counted(", awaiting a result: ", &r.pending),
        if r.notes.is_empty() {
            String::new()
        } else {
            format!(", {} notes (--json lists them)", r.notes.len())
        },
    );
}

fn counted(label: &str, ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!("{label}{}", ids.join(" "))
    }
}

/// The progress bar on stderr, when stderr is a terminal: files done and bytes read.
struct Bar {
    on: bool,
    total: u64,
    files: u64,
    done_files: AtomicU64,
    done_bytes: AtomicU64,
    within: AtomicU64,
}

impl Bar {
    fn new(files: &[PathBuf]) -> Bar {
        let total = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        Bar {
            on: std::io::stderr().is_terminal(),
            total,
            files: files.len() as u64,
            done_files: AtomicU64::new(0),
            done_bytes: AtomicU64::new(0),
            within: AtomicU64::new(0),
        }
    }

    fn within(&self, bytes: u64) {
        self.within.store(bytes, Ordering::Relaxed);
        self.draw();
    }

    fn file_done(&self, path: &std::path::Path) {
        let len = std::fs::metadata(path).map_or(0, |m| m.len());
        self.done_bytes.fetch_add(len, Ordering::Relaxed);
        self.done_files.fetch_add(1, Ordering::Relaxed);
        self.within.store(0, Ordering::Relaxed);
        self.draw();
        if self.done_files.load(Ordering::Relaxed) == self.files {
            self.clear();
        }
    }

    fn draw(&self) {
        if !self.on {
            return;
        }
        let read = self.done_bytes.load(Ordering::Relaxed) + self.within.load(Ordering::Relaxed);
        let filled = (read.min(self.total) * 30)
            .checked_div(self.total)
            .unwrap_or(30) as usize;
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!(
                "\r[{}{}] {}/{} logs, {:.1}/{:.1} MB ",
                "#".repeat(filled),
                " ".repeat(30 - filled),
                self.done_files.load(Ordering::Relaxed),
                self.files,
                read as f64 / 1e6,
                self.total as f64 / 1e6
            )
            .as_bytes(),
        );
    }

    fn clear(&self) {
        if self.on {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), b"\r\x1b[2K");
        }
    }
}
