//! The `broca` command line (pico-args). Exit codes: 0 success, 1 a failure the command found
//! (corruption, refused input), 2 bad usage. Errors go to stderr as one line.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use crate::wal::verify::{dump, verify_file, wal_files, FileReport};

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the command found a failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit code: bad usage.
pub const EXIT_USAGE: u8 = 2;

const HELP: &str = "\
broca: a durable runner for LLM agent loops

Usage: broca [--state-dir DIR] <command> [args]

Commands:
  wal verify [PATH...]   check WAL files (files, folders or a state dir; default: the state dir)
  wal dump FILE          print every record of a WAL as one JSON object per line

Global options:
  --state-dir DIR   state directory (default: $BROCA_STATE_DIR, else $XDG_DATA_HOME/broca,
                    else ~/.local/share/broca)
  -h, --help        this help (also after any command)
  -V, --version     the version

Environment:
  BROCA_LOG         log filter for stderr (default: warn), e.g. BROCA_LOG=broca=debug
";

const WAL_HELP: &str = "\
Usage: broca wal <verify|dump> ...

  verify [PATH...]  check WAL files; exit 0 when each is intact or ends in a torn tail that
                    recovery may cut (said as such), 1 naming file, offset and reason for any
                    corruption or any file that is not a WAL
  dump FILE         one JSON object per record, in order: seq, offset, len (the whole frame:
                    offset + len is where the next record starts), kind, epoch, record
";

const VERIFY_HELP: &str = "\
Usage: broca wal verify [PATH...]

Checks each WAL file named, each *.wal file in a folder named, or each WAL of a state dir
(<dir>/wal/*.wal). Without PATH, checks the state dir. Reads only: never truncates or repairs.
Exit 0 when every WAL is intact or ends in a torn tail that recovery may cut; exit 1 naming
file, offset and reason for any corruption and for any file that is not a WAL. An empty file
(a crash while it was being created) is reported by name and does not fail the check.
";

const DUMP_HELP: &str = "\
Usage: broca wal dump FILE

Prints one JSON object per record, in order: {\"seq\", \"offset\", \"len\", \"kind\", \"epoch\",
\"record\"}. `offset + len` is where the next record starts. Stops at corruption with exit 1
after printing the records before it.
";

/// Runs the command line `args` (without the program name) and returns the exit code.
pub fn run(args: Vec<OsString>) -> u8 {
    let mut pargs = pico_args::Arguments::from_vec(args);
    let help = pargs.contains(["-h", "--help"]);
    if pargs.contains(["-V", "--version"]) {
        println!("broca {}", env!("CARGO_PKG_VERSION"));
        return EXIT_OK;
    }
    let state_dir: Option<PathBuf> = match pargs.opt_value_from_str("--state-dir") {
        Ok(dir) => dir,
        Err(e) => return usage(&format!("--state-dir: {e}")),
    };
    let command = pargs.subcommand().ok().flatten();
    match command.as_deref() {
        None if help => print_help(HELP),
        None => usage("no command given; see `broca --help`"),
        Some("wal") => wal(pargs, help, state_dir),
        Some(other) => usage(&format!("unknown command `{other}`; see `broca --help`")),
    }
}

fn print_help(text: &str) -> u8 {
    print!("{text}");
    EXIT_OK
}

fn usage(message: &str) -> u8 {
    eprintln!("broca: {message}");
    EXIT_USAGE
}

fn rest(pargs: pico_args::Arguments) -> Result<Vec<OsString>, String> {
    let rest = pargs.finish();
    if let Some(flag) = rest.iter().find(|a| a.to_string_lossy().starts_with('-')) {
        return Err(format!("unknown option `{}`", flag.to_string_lossy()));
    }
    Ok(rest)
}

/// The state dir: `--state-dir`, else `$BROCA_STATE_DIR`, else `$XDG_DATA_HOME/broca`, else
/// `~/.local/share/broca`.
pub fn resolve_state_dir(flag: Option<PathBuf>) -> Option<PathBuf> {
    let env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    flag.or_else(|| env("BROCA_STATE_DIR"))
        .or_else(|| env("XDG_DATA_HOME").map(|d| d.join("broca")))
        .or_else(|| env("HOME").map(|h| h.join(".local/share/broca")))
}

fn wal(mut pargs: pico_args::Arguments, help: bool, state_dir: Option<PathBuf>) -> u8 {
    let sub = pargs.subcommand().ok().flatten();
    match sub.as_deref() {
        None if help => print_help(WAL_HELP),
        None => usage("`broca wal` needs `verify` or `dump`; see `broca wal --help`"),
        Some("verify") if help => print_help(VERIFY_HELP),
        Some("dump") if help => print_help(DUMP_HELP),
        Some("verify") => match rest(pargs) {
            Ok(paths) => wal_verify(paths, state_dir),
            Err(e) => usage(&e),
        },
        Some("dump") => match rest(pargs) {
            Ok(paths) if paths.len() == 1 => wal_dump(PathBuf::from(&paths[0])),
            Ok(_) => usage("`broca wal dump` takes exactly one FILE"),
            Err(e) => usage(&e),
        },
        Some(other) => usage(&format!(
            "unknown command `wal {other}`; see `broca wal --help`"
        )),
    }
}

fn wal_verify(paths: Vec<OsString>, state_dir: Option<PathBuf>) -> u8 {
    let args: Vec<PathBuf> = if paths.is_empty() {
        match resolve_state_dir(state_dir) {
            Some(dir) if dir.exists() => vec![dir],
            Some(dir) => {
                println!("no state dir at {}: no WALs to verify", dir.display());
                return EXIT_OK;
            }
            None => return usage("no PATH and no state dir (set --state-dir or HOME)"),
        }
    } else {
        paths.into_iter().map(PathBuf::from).collect()
    };
    let mut failed = 0usize;
    let mut checked = 0usize;
    for arg in args {
        let files = match wal_files(&arg) {
            Ok(files) => files,
            Err(e) => {
                eprintln!("FAIL {e}");
                failed += 1;
                continue;
            }
        };
        for file in files {
            checked += 1;
            let shown = file.display();
            match verify_file(&file) {
                FileReport::Intact { records, end } => {
                    println!("ok    {shown}: {records} records, intact (ends at offset {end})")
                }
                FileReport::Torn {
                    records,
                    at,
                    bytes,
                    reason,
                } => println!(
                    "torn  {shown}: {records} records, then a torn tail at offset {at} ({bytes} \
                     bytes; {reason}) that recovery cuts when a writer opens the log"
                ),
                FileReport::Empty { reason } => println!(
                    "empty {shown}: {reason} (a crash while it was being created; a writer \
                     initializes it)"
                ),
                report @ FileReport::Failed(_) => {
                    failed += 1;
                    if let FileReport::Failed(e) = report {
                        eprintln!("FAIL  {e}");
                    }
                }
            }
        }
    }
    println!("{checked} WAL files checked, {failed} failed");
    if failed > 0 {
        EXIT_FAILURE
    } else {
        EXIT_OK
    }
}

fn wal_dump(path: PathBuf) -> u8 {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = dump(&path, &mut out);
    let flushed = out.flush();
    match (result, flushed) {
        (Ok(_), Ok(())) => EXIT_OK,
        (Err(e), _) => {
            eprintln!("broca: {e}");
            EXIT_FAILURE
        }
        (Ok(_), Err(e)) => {
            eprintln!("broca: writing to stdout failed: {e}");
            EXIT_FAILURE
        }
    }
}
