//! The `broca` binary.

use std::process::ExitCode;

/// mimalloc: replay and the run loop allocate many small objects; glibc's allocator spent a
/// quarter of replay time consolidating free chunks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    broca::cli::init_process();
    let mut args = std::env::args_os();
    let program = args.next();
    ExitCode::from(broca::cli::run_as(program, args.collect()))
}
