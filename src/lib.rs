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
