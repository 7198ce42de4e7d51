//! Why the daemon did not start, or stopped serving: one line a person reads, naming what
//! failed and where (its message), and the stage of the start it failed at, which callers
//! and tests tell apart without reading the text.

/// The stage of a daemon's start a failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The options do not hold (a count out of range, no state dir to be found).
    Options,
    /// The state dir: made, locked, its files written.
    StateDir,
    /// The network's settings (proxies, TLS roots), the signals.
    Process,
    /// The catalog, the store, the retention, the tools.
    Parts,
    /// A front (serve's listeners, the daemon's connection) did not bind or register.
    Front,
    /// A shard, or a thread beside them, did not start or failed.
    Shards,
}

/// A failed start, or a front's failure while serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    pub stage: Stage,
    pub message: String,
}

impl StartError {
    pub fn new(stage: Stage, message: impl Into<String>) -> StartError {
        let message = message.into();
        assert!(!message.is_empty(), "a failure says what failed");
        StartError { stage, message }
    }

    /// Maps an error of `stage` to a start's failure, its text the error's.
    pub fn at<E: std::fmt::Display>(stage: Stage) -> impl Fn(E) -> StartError {
        move |e| StartError::new(stage, e.to_string())
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StartError {}
