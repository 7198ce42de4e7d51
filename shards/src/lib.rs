//! broca-shards: the thread-per-core runtime. It knows nothing of LLMs.
//!
//! One glommio executor per core, pinned with `Placement::Fixed` ([`run_pinned`]); a key (a
//! session address) picks its shard with [`shard_for`]. Each shard owns what runs on it; work
//! reaches another shard only as a message over the [`mesh`] (one bounded queue per shard).
//! On a shard, a [`registry`] keeps one actor per key (started on first use, commands in
//! order through a bounded inbox, closed when idle or to make room), [`timer`] has its
//! periodic tasks and stop flags, and [`services`] what the shard owns once (its group-commit
//! scheduler, its HTTP client).

pub mod mesh;
pub mod registry;
pub mod services;
pub mod timer;

use std::future::Future;
use std::io;

use glommio::{LocalExecutorBuilder, Placement};

/// Locked memory for each executor's io_uring registered buffers. Kept small so that several
/// executors fit under a default memlock limit; larger buffers come from the heap.
pub const IO_MEMORY_BYTES: usize = 2 * 1024 * 1024;

/// The shard that owns `key`: a multiplicative hash of the key onto `shards` (jump-free and
/// uniform for a uniform key, which session addresses are).
pub fn shard_for(key: u64, shards: usize) -> usize {
    assert!(shards > 0, "there is at least one shard");
    ((u128::from(key) * shards as u128) >> 64) as usize
}

/// The cores this process may run on.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `fut` to completion on a new executor on the current thread (not pinned). For the
/// standalone commands and for tests.
pub fn run_local<T>(fut: impl Future<Output = T>) -> io::Result<T> {
    let ex = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .map_err(io::Error::from)?;
    Ok(ex.run(fut))
}

/// Starts `shards` executors, shard `i` pinned to CPU `i % cores`, each running `body(i)`,
/// and waits for all of them. Returns each shard's result in shard order.
pub fn run_pinned<T, F, G>(shards: usize, body: G) -> io::Result<Vec<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + 'static,
    G: Fn(usize) -> F + Send + Sync + Clone + 'static,
{
    assert!(shards > 0, "there is at least one shard");
    let cores = available_cores();
    let mut handles = Vec::with_capacity(shards);
    for shard in 0..shards {
        let body = body.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(shard % cores))
            .name(&format!("broca-shard-{shard}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || body(shard))
            .map_err(io::Error::from)?;
        handles.push(handle);
    }
    handles
        .into_iter()
        .map(|h| h.join().map_err(io::Error::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_every_shard_and_stay_put() {
        let shards = 4;
        let mut counts = [0usize; 4];
        for i in 0..40_000u64 {
            let key = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let s = shard_for(key, shards);
            assert_eq!(s, shard_for(key, shards));
            counts[s] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn each_pinned_shard_runs_its_own_body() {
        let results = run_pinned(2, |shard| async move { shard * 10 }).unwrap();
        assert_eq!(results, vec![0, 10]);
    }
}
