//! The `broca` binary.

use std::process::ExitCode;

/// mimalloc: replay and the run loop allocate many small objects; glibc's allocator spent a
/// quarter of replay time consolidating free chunks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // No transparent huge pages for this process: mimalloc asks for them on its arena, and
    // the kernel's khugepaged then fills whole 2 MiB pages around the few small pages a
    // daemon's sessions touch, so an idle daemon's resident memory kept growing for minutes
    // after its load ended (the soak in BENCHMARKS.md). Small pages keep memory at what is
    // used.
    // SAFETY: prctl on this process with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BROCA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Log lines that cannot be written (stderr closed or a broken pipe) are dropped; the
    // subscriber must not report them on stderr again, which would panic.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .log_internal_errors(false)
        .init();
    ExitCode::from(broca::cli::run(std::env::args_os().skip(1).collect()))
}
