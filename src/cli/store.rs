//! `broca store check|rebuild` and `broca export usage`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use broca_core::usage::{to_csv_row, CSV_HEADER};
use broca_store::Store;

use super::{print_help, rest, usage, EXIT_FAILURE, EXIT_OK};

pub(super) const STORE_HELP: &str = "\
Usage: broca store check|rebuild

The store (<state-dir>/store) holds projections of the WALs: the run index, admission
checkpoints, usage facts and transcripts. The WALs are authoritative.

  check     compare every projection with the WALs; exit 1 naming each difference (reads
            only: works on a read-only state dir, and never changes the store)
  rebuild   clear every projection and rebuild it from the WALs (the one command that
            changes the store by hand)
";

pub(super) const EXPORT_HELP: &str = "\
Usage: broca export usage [--since TIME] [--format jsonl|csv]

Prints one spend fact per model step and failed attempt, after bringing the store up to date
with the WALs: fact_id, kind, session, run_id, step, attempt, provider, model, credential_id,
usage (only the measures the provider reported: an absent one is absent, never 0), the
charge basis (the catalog prices frozen when the run was admitted), at_unix_ms, wal_seq.

Options:
  --since TIME     facts at or after TIME: 2026-11-30, 2026-11-30T12:00:00Z or Unix ms
  --format FORMAT  jsonl (default: one JSON object per line) or csv (with a header line;
                   absent values are empty cells)
";

fn open(state_dir: &Path) -> Result<Store, String> {
    let (store, notes) = Store::open(state_dir)?;
    for n in notes {
        broca_io::errln!("broca: {n}");
    }
    Ok(store)
}

pub(super) fn store(mut pargs: pico_args::Arguments, help: bool, state_dir: Option<PathBuf>) -> u8 {
    let sub = pargs.subcommand().ok().flatten();
    if help {
        return print_help(STORE_HELP);
    }
    if let Err(e) = rest(pargs).and_then(|r| match r.is_empty() {
        true => Ok(()),
        false => Err("`broca store` takes no arguments besides check or rebuild".into()),
    }) {
        return usage(&e);
    }
    let Some(state) = super::resolve_state_dir(state_dir) else {
        return usage("no state dir: set --state-dir, BROCA_STATE_DIR or HOME");
    };
    let wal_dir = state.join("wal");
    match sub.as_deref() {
        Some("check") => check(&state, &wal_dir),
        Some("rebuild") => rebuild(&state, &wal_dir),
        None => usage("`broca store` needs `check` or `rebuild`; see `broca store --help`"),
        Some(other) => usage(&format!(
            "unknown command `store {other}`; see `broca store --help`"
        )),
    }
}

/// `broca store check`: only reads (nothing in the state dir is created, moved or cleared).
fn check(state: &std::path::Path, wal_dir: &std::path::Path) -> u8 {
    let result = Store::open_read_only(state).and_then(|s| s.check(wal_dir));
    match result {
        Ok(diffs) if diffs.is_empty() => {
            broca_io::outln!("the store agrees with the WALs");
            EXIT_OK
        }
        Ok(diffs) => {
            for d in &diffs {
                broca_io::outln!("DIFF {d}");
            }
            broca_io::errln!(
                "broca: {} differences; `broca store rebuild` rebuilds the store from the WALs",
                diffs.len()
            );
            EXIT_FAILURE
        }
        Err(e) => {
            broca_io::errln!("broca: {e}");
            EXIT_FAILURE
        }
    }
}

/// `broca store rebuild`, with a progress bar and the pass's figures.
fn rebuild(state: &std::path::Path, wal_dir: &std::path::Path) -> u8 {
    let started = Instant::now();
    let mut bar: Option<super::progress::Count> = None;
    let mut progress = |done: u64, total: u64| {
        bar.get_or_insert_with(|| super::progress::Count::new("WALs projected", total))
            .set(done)
    };
    let rebuilt = open(state).and_then(|s| Ok(s.rebuild_with(wal_dir, &mut progress)?));
    drop(bar);
    let pass = match rebuilt {
        Ok(pass) => pass,
        Err(e) => {
            broca_io::errln!("broca: {e}");
            return EXIT_FAILURE;
        }
    };
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    broca_io::outln!(
        "rebuilt {} sessions: {} facts from {} WAL bytes in {:.3} s ({:.0} facts/s, {:.1} MB/s)",
        pass.sessions,
        pass.facts,
        pass.wal_bytes,
        secs,
        pass.facts as f64 / secs,
        pass.wal_bytes as f64 / secs / 1e6
    );
    for f in &pass.failed {
        broca_io::errln!("broca: {f}");
    }
    if pass.failed.is_empty() {
        EXIT_OK
    } else {
        EXIT_FAILURE
    }
}

pub(super) fn export(
    mut pargs: pico_args::Arguments,
    help: bool,
    state_dir: Option<PathBuf>,
) -> u8 {
    let sub = pargs.subcommand().ok().flatten();
    if help {
        return print_help(EXPORT_HELP);
    }
    if sub.as_deref() != Some("usage") {
        return usage("`broca export` exports `usage`; see `broca export --help`");
    }
    let since: Option<String> = match pargs.opt_value_from_str("--since") {
        Ok(v) => v,
        Err(e) => return usage(&format!("--since: {e}")),
    };
    let format: String = match pargs.opt_value_from_str("--format") {
        Ok(v) => v.unwrap_or_else(|| "jsonl".into()),
        Err(e) => return usage(&format!("--format: {e}")),
    };
    if let Err(e) = rest(pargs).and_then(|r| match r.is_empty() {
        true => Ok(()),
        false => Err("`broca export usage` takes only --since and --format".into()),
    }) {
        return usage(&e);
    }
    if format != "jsonl" && format != "csv" {
        return usage(&format!("--format `{format}`: use jsonl or csv"));
    }
    let since_ms = match since.as_deref().map(parse_time).transpose() {
        Ok(v) => v,
        Err(e) => return usage(&format!("--since: {e}")),
    };
    let Some(state) = super::resolve_state_dir(state_dir) else {
        return usage("no state dir: set --state-dir, BROCA_STATE_DIR or HOME");
    };
    let facts = open(&state).and_then(|s| {
        let pass = s.catch_up_all(&state.join("wal"))?;
        for f in &pass.failed {
            broca_io::errln!("broca: {f}; its facts are not exported");
        }
        Ok(s.facts(since_ms)?)
    });
    let facts = match facts {
        Ok(f) => f,
        Err(e) => {
            broca_io::errln!("broca: {e}");
            return EXIT_FAILURE;
        }
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    use std::io::Write;
    if format == "csv" {
        let _ = writeln!(out, "{CSV_HEADER}");
    }
    for f in &facts {
        let line = if format == "csv" {
            to_csv_row(f)
        } else {
            serde_json::to_string(f).expect("a fact serializes")
        };
        if writeln!(out, "{line}").is_err() {
            return EXIT_FAILURE; // the reader went away
        }
    }
    let _ = out.flush();
    EXIT_OK
}

/// `2026-11-30`, `2026-11-30T12:00:00Z` (UTC; seconds optional) or Unix milliseconds.
pub(crate) fn parse_time(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse().map_err(|_| format!("`{t}` is too large"));
    }
    let bad = || {
        format!("`{t}` is not a date (2026-11-30), a UTC time (2026-11-30T12:00:00Z) or Unix ms")
    };
    let (date, time) = match t.split_once('T') {
        Some((d, rest)) => (d, Some(rest.strip_suffix('Z').ok_or_else(bad)?)),
        None => (t, None),
    };
    let d: Vec<&str> = date.split('-').collect();
    let [y, m, day] = d.as_slice() else {
        return Err(bad());
    };
    let num = |s: &str, lo: i64, hi: i64| {
        s.parse::<i64>()
            .ok()
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(bad)
    };
    let (y, m, day) = (num(y, 1970, 9999)?, num(m, 1, 12)?, num(day, 1, 31)?);
    let (mut hh, mut mm, mut ss) = (0, 0, 0);
    if let Some(time) = time {
        let parts: Vec<&str> = time.split(':').collect();
        match parts.as_slice() {
            [h, mi] => (hh, mm) = (num(h, 0, 23)?, num(mi, 0, 59)?),
            [h, mi, s] => (hh, mm, ss) = (num(h, 0, 23)?, num(mi, 0, 59)?, num(s, 0, 60)?),
            _ => return Err(bad()),
        }
    }
    // Days from 1970-01-01 (the civil-from-days algorithm, run backwards).
    let (yy, mo) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_parse_as_utc_milliseconds() {
        assert_eq!(parse_time("1970-01-01").unwrap(), 0);
        assert_eq!(parse_time("2026-11-30").unwrap(), 1_795_996_800_000);
        assert_eq!(parse_time("2026-11-30T12:00Z").unwrap(), 1_796_040_000_000);
        assert_eq!(parse_time("2000-02-29T23:59:59Z").unwrap(), 951_868_799_000);
        assert_eq!(parse_time("1795996800000").unwrap(), 1_795_996_800_000);
        for bad in ["yesterday", "2026-13-01", "2026-11-30T12:00", "2026-11"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
