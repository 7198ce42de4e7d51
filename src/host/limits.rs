//! How many sessions a shard keeps open: the descriptor budget. Each open session holds its
//! WAL's descriptor and, while it runs, a connection to its provider, so the default comes
//! from the process's open-files limit (raised to its hard limit first): a third of it for
//! the sessions' logs and provider connections, shared by the shards, two thirds for the
//! clients' connections (a subscriber each, management requests) and everything else. A
//! session past the budget waits for an open one to close; it is not refused.

/// The open-files limit assumed when it cannot be read.
const OPEN_FILES_UNKNOWN: u64 = 1024;
/// Sessions a shard keeps open at least and at most by default.
const OPEN_SESSIONS_MIN: u64 = 64;
const OPEN_SESSIONS_MAX: u64 = 16_384;

/// Raises this process's open-files soft limit to its hard limit; returns the soft limit in
/// force.
fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write plain structs for this process.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return OPEN_FILES_UNKNOWN;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Descriptors an open session may hold: its WAL, and a provider connection while it runs.
const DESCRIPTORS_PER_SESSION: u64 = 2;
/// The share of the open-files limit the open sessions take (the rest is for connections).
const SESSIONS_SHARE: (u64, u64) = (1, 3);

/// Sessions each shard keeps open by default: [`SESSIONS_SHARE`] of the open-files limit, at
/// [`DESCRIPTORS_PER_SESSION`] each, shared by the shards, within [`OPEN_SESSIONS_MIN`] and
/// [`OPEN_SESSIONS_MAX`].
fn open_sessions_budget(open_files: u64, shards: usize) -> usize {
    assert!(shards > 0, "there is at least one shard");
    let (share, of) = SESSIONS_SHARE;
    let per_shard = open_files.saturating_mul(share) / of / DESCRIPTORS_PER_SESSION / shards as u64;
    per_shard.clamp(OPEN_SESSIONS_MIN, OPEN_SESSIONS_MAX) as usize
}

/// A limit the options ask for that cannot be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLimit(pub &'static str);

impl std::fmt::Display for BadLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Raises the open-files limit and answers the sessions each shard keeps open: `asked`, or
/// the budget the limit leaves when the options ask for none.
pub(crate) fn open_sessions(asked: Option<usize>, shards: usize) -> Result<usize, BadLimit> {
    let files = raise_open_files_limit();
    let budget = open_sessions_budget(files, shards);
    let chosen = match asked {
        None => budget,
        Some(0) => return Err(BadLimit("open_sessions_max must be at least 1")),
        Some(n) if n > budget => {
            tracing::warn!(
                "open_sessions_max {n} per shard is more than the open-files limit ({files}) \
                 leaves room for; opening sessions may fail with `too many open files`"
            );
            n
        }
        Some(n) => n,
    };
    tracing::info!(
        open_files = files,
        open_sessions_max = chosen,
        "descriptor budget: sessions kept open per shard (their logs and provider \
         connections); a session past it waits for one to close"
    );
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_gives_a_third_of_the_limit_to_sessions_within_its_bounds() {
        // 20,000 descriptors: 1,666 sessions a shard, 6,664 descriptors for logs and
        // provider connections, the rest for clients' connections.
        assert_eq!(open_sessions_budget(20_000, 2), 1_666);
        assert_eq!(open_sessions_budget(10, 2), OPEN_SESSIONS_MIN as usize);
        assert_eq!(
            open_sessions_budget(u64::MAX, 1),
            OPEN_SESSIONS_MAX as usize
        );
        assert_eq!(
            open_sessions(Some(0), 1),
            Err(BadLimit("open_sessions_max must be at least 1"))
        );
        assert_eq!(open_sessions(Some(3), 1), Ok(3));
    }
}
