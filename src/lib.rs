//! broca: a durable runner for LLM agent loops.
//!
//! The domain crate. Floors from the ground up: `wal` (the per-session write-ahead log) and the
//! CLI in `main.rs`. The generic I/O lives in broca-io, the thread-per-core runtime in
//! broca-shards. See docs/architecture.md for the map.

pub mod catalog;
pub mod cli;
pub mod core;
pub mod module;
pub mod owner_only;
pub mod protocol;
pub mod provider;
pub mod store;
pub mod tools;
pub mod wal;
pub mod wire;

/// Writes a line to stdout, ignoring failures: a closed or broken stdout must never take a
/// daemon down (`crate::outln!` panics on a broken pipe).
#[macro_export]
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Writes to stdout without a newline, ignoring failures (see [`outln!`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

/// Writes a line to stderr, ignoring failures: a closed stderr must never panic broca
/// (`crate::errln!` does, on a broken pipe).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
