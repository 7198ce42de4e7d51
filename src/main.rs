//! The `broca` binary.

use std::process::ExitCode;

/// mimalloc: replay and the run loop allocate many small objects; glibc's allocator spent a
/// quarter of replay time consolidating free chunks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BROCA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
    ExitCode::from(broca::cli::run(std::env::args_os().skip(1).collect()))
}
