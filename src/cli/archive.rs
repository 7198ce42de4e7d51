//! `broca archive pack|list|verify|restore`: sealed WAL containers under
//! `<state-dir>/wal-archive/` (docs/wal-archive.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use broca_archive::{PackOptions, Progress, Restored};
use broca_wal::archive as format;
use broca_wal::SessionTriple;

use super::{print_help, resolve_state_dir, usage, EXIT_FAILURE, EXIT_OK};

const HELP: &str = "\
Usage: broca archive <pack|list|verify|restore|retention> ...

  pack [--idle-days N] [--dry-run] [--prune-reasoning]
        pack every WAL idle for N days (default 30; 0 packs every idle one) with no open run
        and no writer holding its lease into a sealed container under
        <state-dir>/wal-archive/; each live WAL is removed once its container is durable;
        --prune-reasoning empties each packed session's model reasoning (its text and
        signature) in place, and every older sealed copy of it goes (docs/retention.md)
  list  the containers, their members, and the sessions restored from them
  verify [CONTAINER...]
        read every byte of each container (default: all of them): the digest that names it
        and each member's digest; exit 1 naming container, member and offset for damage
        (nothing is deleted because of it)
  restore ADDRESS | --project-root P --harness H --session S
        put an archived session's WAL back into <state-dir>/wal/ (a send does this itself)
  retention
        what whole-session retention will do (docs/retention.md), before it does it: each
        session kept with a retention and when it expires (never while a run of it is open),
        soonest first, and each expired session whose deletion is not finished
";

pub fn archive(mut pargs: pico_args::Arguments, help: bool, state_dir: Option<PathBuf>) -> u8 {
    let sub = pargs.subcommand().ok().flatten();
    if help || sub.is_none() {
        return if help {
            print_help(HELP)
        } else {
            usage("`broca archive` needs pack, list, verify, restore or retention; see `broca archive --help`")
        };
    }
    let Some(state) = resolve_state_dir(state_dir) else {
        return usage("no state dir (set --state-dir or HOME)");
    };
    let done = match sub.as_deref() {
        Some("pack") => pack(pargs, &state),
        Some("list") => super::rest(pargs).and_then(|_| list(&state)),
        Some("verify") => super::rest(pargs).and_then(|paths| verify(&state, paths)),
        Some("restore") => restore(pargs, &state),
        Some("retention") => super::rest(pargs).and_then(|_| retention(&state)),
        Some(other) => {
            return usage(&format!(
                "unknown command `archive {other}`; see `broca archive --help`"
            ))
        }
        None => unreachable!("handled above"),
    };
    match done {
        Ok(true) => EXIT_OK,
        Ok(false) => EXIT_FAILURE,
        Err(e) if e.starts_with("usage: ") => usage(&e["usage: ".len()..]),
        Err(e) => {
            broca_io::errln!("broca: {e}");
            EXIT_FAILURE
        }
    }
}

/// `broca archive retention`: what retention will do, soonest first.
fn retention(state: &Path) -> Result<bool, String> {
    use broca_host::retention::Planned;
    let mut rows = broca_host::retention::plan(state, &state.join("wal"))
        .map_err(|e| format!("{}: {e}", state.display()))?;
    let now = broca_session::now_unix_ms();
    let when = |p: &Planned| match p {
        Planned::Deleting { .. } => 0,
        Planned::Expires { at_ms, .. } => *at_ms,
        Planned::Held { .. } | Planned::Unreadable { .. } => u64::MAX,
    };
    rows.sort_by_key(when);
    if rows.is_empty() {
        broca_io::outln!("no session is kept with a retention");
    }
    let name = |t: &SessionTriple| format!("{} {} {}", t.project_root, t.harness, t.session);
    for row in &rows {
        match row {
            Planned::Expires {
                triple,
                rule,
                at_ms,
            } => {
                let left = if *at_ms <= now {
                    "due now: deleted at the next look".to_string()
                } else {
                    format!("in {} s", (at_ms - now).div_ceil(1000))
                };
                broca_io::outln!(
                    "{}  {}  {rule}  expires at {at_ms} ({left})",
                    triple.address(),
                    name(triple)
                );
            }
            Planned::Held { triple, rule } => broca_io::outln!(
                "{}  {}  {rule}  held: a run of it is not over",
                triple.address(),
                name(triple)
            ),
            Planned::Unreadable { triple, why } => broca_io::outln!(
                "{}  {}  its WAL cannot be read: {why}",
                triple.address(),
                name(triple)
            ),
            Planned::Deleting {
                address,
                expired_at_ms,
            } => broca_io::outln!(
                "{address}  expired at {expired_at_ms}: tombstoned, its content deleted at the \
                 next start"
            ),
        }
    }
    Ok(true)
}

fn pack(mut pargs: pico_args::Arguments, state: &Path) -> Result<bool, String> {
    let days: u64 = pargs
        .opt_value_from_str("--idle-days")
        .map_err(|e| format!("usage: --idle-days: {e}"))?
        .unwrap_or(30);
    let dry_run = pargs.contains("--dry-run");
    let prune = pargs.contains("--prune-reasoning");
    super::rest(pargs).map_err(|e| format!("usage: {e}"))?;
    let opts = PackOptions {
        idle: Duration::from_secs(days.saturating_mul(86_400)),
        dry_run,
        rewrite: prune.then_some(broca_host::prune_reasoning as broca_archive::Rewrite),
        ..Default::default()
    };
    let mut bar: Option<super::progress::Count> = None;
    let mut progress = |p: Progress| match p {
        Progress::Looked { done, total } => bar
            .get_or_insert_with(|| super::progress::Count::new("WALs looked at", total as u64))
            .set(done as u64),
        Progress::Sealed { path, members } => {
            if let Some(b) = bar.as_mut() {
                b.clear();
            }
            broca_io::errln!("broca: sealed {} ({members} sessions)", path.display())
        }
    };
    let started = std::time::Instant::now();
    let packed = broca_archive::pack(state, &opts, &mut progress);
    drop(progress);
    drop(bar); // cleared before the summary
    report_pack(&packed?, dry_run, started);
    Ok(true)
}

/// What a pack did, session by session, then its totals.
fn report_pack(r: &broca_archive::PackReport, dry_run: bool, started: std::time::Instant) {
    if r.cleaned > 0 {
        broca_io::errln!(
            "broca: removed {} temporary file(s) an interrupted pack or restore left",
            r.cleaned
        );
    }
    for (file, why) in &r.skipped {
        broca_io::outln!("kept    {file}: {why}");
    }
    let (verb, pruned) = if dry_run {
        ("would pack", "would prune")
    } else {
        ("packed", "pruned")
    };
    for file in &r.rewritten {
        broca_io::outln!("{pruned} the reasoning of {file}");
    }
    for (file, why) in &r.not_rewritten {
        broca_io::outln!("kept the reasoning of {file}: {why}");
    }
    for m in &r.packed {
        broca_io::outln!(
            "{verb:<7} {} ({}, {}, {}): {} bytes",
            m.file,
            m.project_root,
            m.harness,
            m.session,
            m.size
        );
    }
    broca_io::outln!(
        "{verb} {} sessions ({} bytes) into {} container(s) in {:.1} s; {} kept live",
        r.packed.len(),
        r.bytes,
        r.containers.len(),
        started.elapsed().as_secs_f64(),
        r.skipped.len()
    );
}

fn list(state: &Path) -> Result<bool, String> {
    let dir = state.join(format::DIR_NAME);
    let paths = format::container_paths(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut ok = true;
    for p in &paths {
        match format::open(p) {
            Ok(c) => {
                let bytes: u64 = c.index.members.iter().map(|m| m.size).sum();
                broca_io::outln!(
                    "container {} ({} sessions, {bytes} bytes, sealed at {} ms)",
                    p.display(),
                    c.index.members.len(),
                    c.index.created_unix_ms
                );
                for m in &c.index.members {
                    let live = state.join("wal").join(&m.file).exists();
                    broca_io::outln!(
                        "  {} ({}, {}, {}): {} bytes, last seq {}, lineage {}{}",
                        m.file,
                        m.project_root,
                        m.harness,
                        m.session,
                        m.size,
                        m.last_seq,
                        m.lineage_id,
                        if live {
                            "; also live (the live WAL is read)"
                        } else {
                            ""
                        }
                    );
                }
            }
            Err(e) => {
                ok = false;
                broca_io::errln!("FAIL  {e}");
            }
        }
    }
    let restored = std::fs::read_to_string(dir.join("restored.jsonl")).unwrap_or_default();
    for line in restored.lines() {
        broca_io::outln!("restored {line}");
    }
    broca_io::outln!("{} container(s)", paths.len());
    Ok(ok)
}

fn verify(state: &Path, paths: Vec<std::ffi::OsString>) -> Result<bool, String> {
    let paths: Vec<PathBuf> = if paths.is_empty() {
        let dir = state.join(format::DIR_NAME);
        format::container_paths(&dir).map_err(|e| format!("{}: {e}", dir.display()))?
    } else {
        paths.into_iter().map(PathBuf::from).collect()
    };
    Ok(verify_containers(&paths) == 0)
}

/// Verifies each container, one line each; returns how many failed.
pub fn verify_containers(paths: &[PathBuf]) -> usize {
    let mut failed = 0;
    for p in paths {
        match format::verify(p) {
            Ok(c) => broca_io::outln!(
                "ok    {}: {} members, every digest matches",
                p.display(),
                c.index.members.len()
            ),
            Err(e) => {
                failed += 1;
                broca_io::errln!("FAIL  {e}");
            }
        }
    }
    failed
}

fn restore(mut pargs: pico_args::Arguments, state: &Path) -> Result<bool, String> {
    let mut opt = |name: &'static str| {
        pargs
            .opt_value_from_str::<_, String>(name)
            .map_err(|e| format!("usage: {name}: {e}"))
    };
    let (root, harness, session) = (opt("--project-root")?, opt("--harness")?, opt("--session")?);
    let rest = super::rest(pargs).map_err(|e| format!("usage: {e}"))?;
    let file =
        match (root, harness, session, rest.as_slice()) {
            (Some(r), Some(h), Some(s), []) => SessionTriple::new(r, &h, &s)
                .map_err(|e| format!("usage: {e}"))?
                .address()
                .wal_file_name(),
            (None, None, None, [addr]) => {
                let a = addr.to_string_lossy();
                let a = a.trim_end_matches(".wal");
                if a.len() != 32 || !a.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                    "usage: `{a}` is not a session address (32 hex digits, as `archive list` shows)"
                ));
                }
                format!("{}.wal", a.to_ascii_lowercase())
            }
            _ => return Err(
                "usage: restore takes an ADDRESS or all of --project-root, --harness, --session"
                    .into(),
            ),
        };
    let wal = state.join("wal").join(&file);
    match broca_archive::restore(&wal)? {
        Restored::AlreadyLive => broca_io::outln!("{file} is live already; nothing restored"),
        Restored::From(c) => {
            broca_io::outln!("restored {} from {}", wal.display(), c.display())
        }
        Restored::NotArchived => {
            return Err(format!(
                "{file}: no sealed container in {} holds this session",
                state.join(format::DIR_NAME).display()
            ))
        }
    }
    Ok(true)
}
