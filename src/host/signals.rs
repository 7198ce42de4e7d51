//! SIGTERM, SIGINT and SIGHUP (a closed terminal or SSH session): blocked in every thread (the
//! shards inherit the mask) and waited for on a thread of their own, which stops the daemon;
//! once everything is closed the caller dies of the signal ([`reraise`]) so a supervisor sees
//! it. A second signal during the grace period exits at once: what is durable stays, and the
//! runs left open are resumed (or sealed) by the next start's recovery.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::{Host, ShardMsg};

/// Where a signal goes: the daemon once it runs; before that, the signal is kept for it.
#[derive(Default)]
pub(crate) struct SignalSlot {
    pub(crate) host: Option<Arc<Host>>,
    /// A signal that came before the daemon was ready (0: none).
    pub(crate) early: i32,
}

impl SignalSlot {
    /// The daemon is ready: signals go to it from now on, and one that came early stops it.
    pub(crate) fn install(slot: &Mutex<SignalSlot>, host: &Arc<Host>) {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.host = Some(host.clone());
        if slot.early != 0 {
            stop_for_signal(host, slot.early);
        }
    }
}

/// Stops the daemon for `sig`; a second signal while it stops exits at once.
pub(crate) fn stop_for_signal(host: &Host, sig: i32) {
    assert!(sig > 0, "a signal number is positive");
    let first = host
        .signal
        .compare_exchange(0, sig, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if !first {
        tracing::warn!(
            "signal {sig} again while stopping: exiting now; the runs still open are picked up \
             by the next start"
        );
        reraise(sig);
    }
    tracing::warn!("signal {sig}: stopping admission; active runs get the grace period");
    host.stopping.store(true, Ordering::Release);
    let _ = host.mesh.send_blocking(0, ShardMsg::Signal);
}

/// Why signals could not be caught.
#[derive(Debug)]
pub(crate) struct SignalError(String);

impl std::fmt::Display for SignalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread and waits for them on a thread of their
/// own.
pub(crate) fn catch_signals(slot: Arc<Mutex<SignalSlot>>) -> Result<(), SignalError> {
    // SAFETY: plain libc signal-set calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(SignalError("cannot block SIGTERM/SIGINT/SIGHUP".into()));
        }
        let set = set;
        std::thread::Builder::new()
            .name("broca-signals".into())
            .spawn(move || loop {
                let mut sig = 0;
                if libc::sigwait(&set, &mut sig) == 0 {
                    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                    match slot.host.as_ref() {
                        Some(host) => stop_for_signal(host, sig),
                        // Still starting (in module mode the daemon may ask before broca is
                        // ready): the daemon stops as soon as it is.
                        None if slot.early == 0 => slot.early = sig,
                        // A second signal before the daemon was ready: nothing runs yet.
                        None => reraise(sig),
                    }
                }
            })
            .map_err(|e| SignalError(format!("cannot start the signal thread: {e}")))?;
    }
    Ok(())
}

/// Dies of `sig` as if it had not been caught (the supervisor sees the signal).
pub fn reraise(sig: i32) -> ! {
    // SAFETY: resetting a signal to its default and raising it; nothing is left to run.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}
