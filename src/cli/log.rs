//! The process's start: transparent huge pages off, and the log's level and format.

use std::ffi::OsString;

/// What every broca process does first: no transparent huge pages (mimalloc asks for them on
/// its arena, and khugepaged then fills whole 2 MiB pages around the few small pages a
/// daemon's sessions touch, so an idle daemon's resident memory kept growing for minutes
/// after its load ended: the soak in BENCHMARKS.md), and logs on stderr (lines that cannot
/// be written dropped: a subscriber that reported them on stderr again would panic). The
/// global `--log-level FILTER` and `--log-format text|json` are taken out of `args` here; the
/// filter is `--log-level`, else `BROCA_LOG`, else `RUST_LOG`, else `warn`, and one that does
/// not parse is an error naming where it came from.
pub fn init_process(args: &mut Vec<OsString>) -> Result<(), String> {
    // SAFETY: prctl on this process with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let level = take_global(args, "--log-level")?;
    let format = take_global(args, "--log-format")?;
    let (source, text) = match level {
        Some(l) => ("--log-level".to_string(), l),
        None => ["BROCA_LOG", "RUST_LOG"]
            .into_iter()
            .find_map(|var| std::env::var(var).ok().map(|v| (var.to_string(), v)))
            .unwrap_or_else(|| ("the default".into(), "warn".into())),
    };
    let filter = tracing_subscriber::EnvFilter::builder()
        .parse(&text)
        .map_err(|e| format!("{source} `{}`: not a log filter: {e}", text.escape_debug()))?;
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .log_internal_errors(false);
    match format.as_deref() {
        None | Some("text") => builder.init(),
        Some("json") => builder.json().flatten_event(true).init(),
        Some(other) => {
            return Err(format!(
                "--log-format `{}`: use text or json",
                other.escape_debug()
            ))
        }
    }
    Ok(())
}

/// Takes `--name VALUE` or `--name=VALUE` out of `args` (before a `--`), if given.
fn take_global(args: &mut Vec<OsString>, name: &str) -> Result<Option<String>, String> {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let prefix = format!("{name}=");
    for i in 0..end {
        let Some(arg) = args[i].to_str() else {
            continue;
        };
        if let Some(v) = arg.strip_prefix(&prefix) {
            let v = v.to_string();
            args.remove(i);
            return Ok(Some(v));
        }
        if arg == name {
            if i + 1 >= end {
                return Err(format!("{name} needs a value"));
            }
            let v = args.remove(i + 1);
            args.remove(i);
            return v
                .into_string()
                .map(Some)
                .map_err(|_| format!("{name}: the value is not UTF-8"));
        }
    }
    Ok(None)
}
