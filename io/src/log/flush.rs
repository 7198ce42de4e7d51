//! A log's flush task: the pending batch written and fdatasynced (one write, one
//! fdatasync), deferred appends made urgent when their time runs out, and the fence checked
//! before each write.

use std::io;
use std::rc::Rc;
use std::time::Instant;

use super::backend::Submit;
use super::{FaultPoint, LogError, Shared, State, ZERO_AHEAD_BATCH_BYTES_MAX};
use crate::fs::{self, align_down, align_up};

/// Starts the flush task unless it runs (it takes every pending byte once some are urgent).
pub(super) fn start_flush(shared: &Rc<Shared>, st: &mut State) {
    if !st.flushing && !st.pending.is_empty() {
        st.flushing = true;
        shared.committer.flush_started();
        glommio::spawn_local(flush_loop(shared.clone())).detach();
    }
}

/// Makes the deferred bytes urgent after `defer_max`, unless something writes them first.
/// The timer holds the log weakly: closing the log is not delayed by it.
pub(super) fn arm_defer(shared: &Rc<Shared>, st: &mut State) {
    if st.defer_armed || st.pending.is_empty() {
        return;
    }
    st.defer_armed = true;
    let weak = Rc::downgrade(shared);
    let after = shared.cfg.defer_max;
    glommio::spawn_local(async move {
        glommio::timer::sleep(after).await;
        let Some(shared) = weak.upgrade() else { return };
        let mut st = shared.state.borrow_mut();
        st.defer_armed = false;
        if !st.flushing && !st.pending.is_empty() && st.urgent_end < st.end {
            shared.committer.count_defer_timeout();
        }
        st.urgent_end = st.end;
        start_flush(&shared, &mut st);
    })
    .detach();
}

/// Writes batches while urgent bytes are pending. One per log at a time (`State::flushing`);
/// deferred bytes left when it stops get their timer.
async fn flush_loop(shared: Rc<Shared>) {
    loop {
        // Let every append that is ready in this tick join the batch.
        futures_lite::future::yield_now().await;
        let Some((batch, base)) = take_batch(&shared) else {
            return;
        };
        let permit = shared.committer.admit_batch().await;
        let result = write_batch(&shared, &batch, base).await;
        drop(permit);
        let mut st = shared.state.borrow_mut();
        match result {
            Ok(written) => batch_durable(&mut st, written),
            Err(err) => {
                tracing::error!(error = %err, "log write failed; the log is closed for writing");
                st.dead = Some(LogError::Dead {
                    path: shared.path.clone(),
                    cause: err.to_string(),
                    os_error: match &err {
                        LogError::Io { os_error, .. } => *os_error,
                        _ => None,
                    },
                });
                for (_, waker) in st.durable_waiters.drain(..) {
                    waker.wake();
                }
                for waker in st.room_waiters.drain(..) {
                    waker.wake();
                }
                st.flushing = false;
                shared.committer.flush_ended();
                return;
            }
        }
        let mut batch = batch;
        batch.clear();
        st.spare = batch;
    }
}

/// The pending bytes as the next batch, with the offset they start at; `None` ends the loop
/// (nothing urgent is pending, or the log is dead), the deferred bytes left getting their timer.
fn take_batch(shared: &Rc<Shared>) -> Option<(Vec<u8>, u64)> {
    let mut st = shared.state.borrow_mut();
    let pending_from = st.end - st.pending.len() as u64;
    if st.pending.is_empty() || st.dead.is_some() || st.urgent_end <= pending_from {
        st.flushing = false;
        shared.committer.flush_ended();
        if st.dead.is_none() {
            arm_defer(shared, &mut st);
        }
        return None;
    }
    assert_eq!(
        pending_from, st.durable_end,
        "one batch of a log is in flight at a time"
    );
    let spare = std::mem::take(&mut st.spare);
    let batch = std::mem::replace(&mut st.pending, spare);
    assert!(
        batch.len() <= shared.cfg.batch_bytes_max.max(super::APPEND_BYTES_MAX),
        "a batch is bounded (one append larger than a batch goes alone)"
    );
    for waker in st.room_waiters.drain(..) {
        waker.wake();
    }
    Some((batch, st.durable_end))
}

/// A written batch's bytes are durable: the durable end moves and its waiters wake.
fn batch_durable(st: &mut State, written: Written) {
    assert!(
        written.durable_end > st.durable_end,
        "a batch makes bytes durable"
    );
    assert!(written.durable_end <= st.end, "durable bytes were appended");
    st.durable_end = written.durable_end;
    st.zeroed_end = written.zeroed_end;
    st.tail_block = written.tail_block;
    let durable = st.durable_end;
    st.durable_waiters.retain(|(end, waker)| {
        let done = *end <= durable;
        if done {
            waker.wake_by_ref();
        }
        !done
    });
}

struct Written {
    durable_end: u64,
    zeroed_end: u64,
    tail_block: Vec<u8>,
}

/// Where one batch's write goes: from the start of the partial tail block to `write_end`
/// (the batch's end, aligned, or further when zeroed space grows with it).
struct Span {
    block_start: u64,
    data_end: u64,
    write_end: u64,
    zeroed_end: u64,
}

impl Span {
    /// The span of `batch` appended at `base`, the tail block holding `tail_len` bytes and
    /// zeroes on disk reaching `zeroed_end`.
    fn plan(
        shared: &Shared,
        base: u64,
        batch_len: usize,
        tail_len: usize,
        zeroed_end: u64,
    ) -> Span {
        let align = shared.align;
        let block_start = align_down(base, align);
        assert_eq!(
            block_start + tail_len as u64,
            base,
            "the tail block ends where the batch starts"
        );
        assert!(tail_len < align as usize, "the tail block is partial");
        let data_end = base + batch_len as u64;
        let mut write_end = align_up(data_end, align);
        let mut new_zeroed_end = zeroed_end.max(write_end);
        if write_end > zeroed_end && batch_len < ZERO_AHEAD_BATCH_BYTES_MAX {
            // Grow the zeroed space in the same write, in proportion to the file, within
            // limits. A large batch skips it: it extends the file itself, and the one metadata
            // commit its fdatasync then carries is small beside its own bytes, while zeroing
            // ahead would write every byte twice.
            let grow = data_end.clamp(
                shared.cfg.zero_ahead_min_bytes,
                shared.cfg.zero_ahead_max_bytes,
            );
            new_zeroed_end = align_up(data_end + grow, align);
            write_end = new_zeroed_end;
        }
        assert!(
            write_end % align == 0 && block_start % align == 0,
            "an O_DIRECT span is aligned"
        );
        assert!(data_end <= write_end && write_end <= new_zeroed_end);
        Span {
            block_start,
            data_end,
            write_end,
            zeroed_end: new_zeroed_end,
        }
    }

    fn len(&self) -> usize {
        usize::try_from(self.write_end - self.block_start).expect("a batch fits in memory")
    }
}

/// One batch: one aligned write from the start of the partial tail block, then one fdatasync.
async fn write_batch(shared: &Shared, batch: &[u8], base: u64) -> Result<Written, LogError> {
    let (tail_block, zeroed_end) = {
        let st = shared.state.borrow();
        (st.tail_block.clone(), st.zeroed_end)
    };
    let span = Span::plan(shared, base, batch.len(), tail_block.len(), zeroed_end);
    check_fence(shared)?;
    // A lone batch on the shard goes inline; batches of several logs overlap in the ring.
    let submit = submit_of(shared);
    write_span(shared, &span, &tail_block, batch, submit).await?;
    sync(shared, submit).await?;
    let new_block_start = align_down(span.data_end, shared.align);
    let mut new_tail = tail_block;
    if new_block_start == span.block_start {
        new_tail.extend_from_slice(batch);
    } else {
        let from = (new_block_start - base) as usize;
        new_tail.clear();
        new_tail.extend_from_slice(&batch[from..]);
    }
    assert_eq!(new_block_start + new_tail.len() as u64, span.data_end);
    Ok(Written {
        durable_end: span.data_end,
        zeroed_end: span.zeroed_end,
        tail_block: new_tail,
    })
}

/// Writes the span: the tail block's acknowledged bytes, the batch, zeros to its end.
async fn write_span(
    shared: &Shared,
    span: &Span,
    tail_block: &[u8],
    batch: &[u8],
    submit: Submit,
) -> Result<(), LogError> {
    let len = span.len();
    assert!(
        tail_block.len() + batch.len() <= len,
        "the span holds the tail and the batch"
    );
    let fault = |point| shared.cfg.faults.as_ref().and_then(|hook| (hook.0)(point));
    if let Some(e) = fault(FaultPoint::Write {
        pos: span.block_start,
        len,
    }) {
        return Err(LogError::io(&shared.path, "write", e));
    }
    shared
        .file
        .write_filled(span.block_start, len, submit, |buf| {
            let head = tail_block.len();
            buf[..head].copy_from_slice(tail_block);
            buf[head..head + batch.len()].copy_from_slice(batch);
            buf[head + batch.len()..].fill(0);
        })
        .await
        .map_err(|e| LogError::io(&shared.path, "write", e))?;
    if let Some(e) = fault(FaultPoint::Written {
        fd: shared.file.raw_fd(),
        pos: span.block_start,
        len,
    }) {
        return Err(LogError::io(&shared.path, "write", e));
    }
    shared.committer.count_write(len);
    Ok(())
}

/// How a flush's system calls go: inline when the shard flushes this log alone, through the
/// executor's io_uring when several logs flush at once (their calls then overlap).
fn submit_of(shared: &Shared) -> Submit {
    if shared.committer.flushing_logs() <= 1 {
        Submit::Inline
    } else {
        Submit::Ring
    }
}

/// The batch's one fdatasync; its failure is fatal for the log (never retried).
async fn sync(shared: &Shared, submit: Submit) -> Result<(), LogError> {
    let fault = |point| shared.cfg.faults.as_ref().and_then(|hook| (hook.0)(point));
    let started = Instant::now();
    let synced = match fault(FaultPoint::Sync) {
        Some(e) => Err(e),
        None => shared.file.fdatasync(submit).await,
    };
    if let Err(e) = synced {
        shared.committer.count_fsync_error();
        return Err(LogError::io(&shared.path, "fdatasync", e));
    }
    shared.committer.count_fsync(started.elapsed());
    Ok(())
}

/// The fence: never write through a file that another writer has replaced or removed. The path
/// is stat'ed only when the directory watch saw a change since the last check.
fn check_fence(shared: &Shared) -> Result<(), LogError> {
    let generation = shared.watch.as_ref().map(|w| w.poll());
    if generation.is_some() && generation == Some(shared.fenced_generation.get()) {
        return Ok(());
    }
    match fs::path_identity(&shared.path) {
        Ok(id) if id == shared.identity => {
            shared.fenced_generation.set(generation.unwrap_or(0));
            Ok(())
        }
        Ok(_) => Err(LogError::Stale {
            path: shared.path.clone(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(LogError::Stale {
            path: shared.path.clone(),
        }),
        Err(e) => Err(LogError::io(&shared.path, "stat", e)),
    }
}
