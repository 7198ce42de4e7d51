//! The `ck-broca` binary: broca as the subconscious daemon's module, the same entry as
//! `broca module` (the daemon launches modules by their name).

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut args: Vec<_> = std::env::args_os().skip(1).collect();
    if let Err(e) = broca::cli::init_process(&mut args) {
        broca_io::errln!("ck-broca: {e}");
        return ExitCode::from(2);
    }
    ExitCode::from(broca::cli::run_as(Some("ck-broca".into()), args))
}
