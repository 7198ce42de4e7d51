//! The shard mesh: one bounded queue into each shard. A session-bound command, a
//! subscription or a stats request that finds its shard's queue full is refused at once
//! (`503 shard_busy`, counted in `broca_mesh_full_total`) rather than queued without limit;
//! control messages (stop, the end of the mesh) wait for room instead, since losing one
//! would leave a shard running.

use std::sync::atomic::{AtomicU64, Ordering};

use futures_channel::mpsc;

use super::ShardMsg;

/// Messages that may wait in one shard's queue.
pub(crate) const MESH_QUEUE_MAX: usize = 4096;

/// Why a message did not reach its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MeshError {
    /// The shard's queue is full: the caller should refuse and let the client retry.
    Full,
    /// The shard has stopped.
    Gone,
}

/// The senders into every shard, with the count of messages refused for a full queue.
pub(crate) struct Mesh {
    senders: Vec<mpsc::Sender<ShardMsg>>,
    full: AtomicU64,
}

impl Mesh {
    /// A mesh of `shards` queues, and the receiving end of each.
    pub fn new(shards: usize) -> (Mesh, Vec<mpsc::Receiver<ShardMsg>>) {
        let (senders, receivers) = (0..shards)
            .map(|_| mpsc::channel::<ShardMsg>(MESH_QUEUE_MAX))
            .unzip();
        (
            Mesh {
                senders,
                full: AtomicU64::new(0),
            },
            receivers,
        )
    }

    pub fn shards(&self) -> usize {
        self.senders.len()
    }

    /// Sends `msg` to `shard` if its queue has room.
    pub fn try_send(&self, shard: usize, msg: ShardMsg) -> Result<(), MeshError> {
        match self.senders[shard].clone().try_send(msg) {
            Ok(()) => Ok(()),
            Err(e) if e.is_full() => {
                self.full.fetch_add(1, Ordering::Relaxed);
                Err(MeshError::Full)
            }
            Err(_) => Err(MeshError::Gone),
        }
    }

    /// Sends `msg` to `shard`, waiting for room (control messages).
    pub async fn send(&self, shard: usize, msg: ShardMsg) -> Result<(), MeshError> {
        let mut tx = self.senders[shard].clone();
        futures_lite::future::poll_fn(|cx| tx.poll_ready(cx))
            .await
            .map_err(|_| MeshError::Gone)?;
        tx.start_send(msg).map_err(|_| MeshError::Gone)
    }

    /// Sends `msg` from a thread outside the shards, waiting for room (the signal thread).
    pub fn send_blocking(&self, shard: usize, mut msg: ShardMsg) -> Result<(), MeshError> {
        loop {
            match self.senders[shard].clone().try_send(msg) {
                Ok(()) => return Ok(()),
                Err(e) if e.is_full() => {
                    msg = e.into_inner();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(_) => return Err(MeshError::Gone),
            }
        }
    }

    /// Messages refused because their shard's queue was full.
    pub fn full_count(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }
}
