//! The `ck-broca` binary: broca as the subconscious daemon's module, the same entry as
//! `broca module` (the daemon launches modules by their name).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    broca::cli::init_process();
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    ExitCode::from(broca::cli::run_as(Some("ck-broca".into()), args))
}
