//! The `broca` binary.

use std::process::ExitCode;

/// mimalloc: replay and the run loop allocate many small objects; glibc's allocator spent a
/// quarter of replay time consolidating free chunks (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut args: Vec<_> = std::env::args_os().collect();
    let program = (!args.is_empty()).then(|| args.remove(0));
    if let Err(e) = broca::cli::init_process(&mut args) {
        broca_io::errln!("broca: {e}");
        return ExitCode::from(2);
    }
    ExitCode::from(broca::cli::run_as(program, args))
}
