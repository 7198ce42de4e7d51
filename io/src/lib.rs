//! broca-io: generic I/O for broca. It knows nothing of LLMs or of the WAL's record format.
//!
//! - [`log`]: the durable log file: O_DIRECT appends merged into one aligned write per batch,
//!   the partial tail block rewritten in place, space zeroed ahead of the tail, and group
//!   commit (every append ready in a tick shares one `fdatasync`).
//! - [`eventstream`]: the AWS event-stream frame decoder (sans-IO, any chunk boundary).
//! - [`commit`]: the per-shard group-commit scheduler shared by all the logs of a shard.
//! - [`fence`]: the stale-writer fence (inotify on the log directory).
//! - [`http1`]: the HTTP/1.1 response decoder (sans-IO: head, Content-Length, chunked, close).
//! - [`net`]: the network client: TCP, TLS (rustls, sans-IO), HTTP/1.1 with a keep-alive
//!   pool, CONNECT proxies, WebSocket.
//! - [`sse`]: the server-sent events decoder (sans-IO, any chunk boundary).
//! - [`fs`]: small file-system helpers: alignment probing, directory fsync, advisory locks.
//! - [`power_loss`]: the simulated power loss of crash tests (writes held until their sync,
//!   a ledger of directory entries not yet durable).
//! - [`outln!`], [`out!`], [`errln!`]: stdout and stderr writes that never panic.

pub mod blocking;
pub mod commit;
pub mod eventstream;
pub mod fence;
pub mod fs;
pub mod http1;
pub mod http_server;
pub mod log;
pub mod net;
pub mod power_loss;
pub mod sse;

pub use commit::{CommitStats, Committer};
pub use log::{FaultHook, FaultPoint, LogConfig, LogError, LogFile};

/// Writes a line to stdout, ignoring failures: a closed or broken stdout must never take a
/// daemon down (`println!` panics on a broken pipe).
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
/// (`eprintln!` does, on a broken pipe).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
