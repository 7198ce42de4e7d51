//! The `broca` binary.

use std::process::ExitCode;

/// mimalloc: replay and the run loop allocate many small objects; glibc's allocator spent a
/// quarter of replay time consolidating free chunks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
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
