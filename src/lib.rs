//! broca: a durable runner for LLM agent loops.
//!
//! The `broca` package is the command line (`cli`, used by `main.rs`); the roles of the brief
//! live in their own crates under `src/`, one per floor (docs/architecture.md has the map).
//! This library re-exports them under short names for the binary, the tests, the benchmarks
//! and the crash tests.

pub mod cli;

pub use broca_archive as archive;
pub use broca_catalog as catalog;
pub use broca_ck as ck;
pub use broca_core as core;
pub use broca_daemon as daemon;
pub use broca_fetch_plan as fetch_plan;
pub use broca_host as host;
pub use broca_import as import;
pub use broca_owner_only as owner_only;
pub use broca_protocol as protocol;
pub use broca_provider as provider;
pub use broca_read as read;
pub use broca_run as run;
pub use broca_serve as serve;
pub use broca_session as session;
pub use broca_store as store;
pub use broca_subc as subc;
pub use broca_tools as tools;
pub use broca_transport as transport;
pub use broca_wire as wire;

/// The WAL: its format (broca-wal) and its writer (broca-wal-writer).
pub mod wal {
    pub use broca_wal::*;
    pub use broca_wal_writer as writer;
    pub use broca_wal_writer::{Recovered, WalWriter};
}

pub use broca_io::{errln, out, outln};
