//! The accept loops of one shard: its descriptor of the TCP listener and (shard 0) the Unix
//! socket. Each loop waits on two things only, the listener and the shard's stop signal, so
//! an idle daemon never wakes (glommio keeps one waker reference per poll of a pending accept
//! on a 16-bit counter: a loop woken by a timer overflows it in minutes, so nothing here
//! polls on a timer).
//!
//! Accept failures back off instead of spinning: when the process is out of descriptors
//! (EMFILE, ENFILE) the loop frees its spare descriptor, accepts the waiting connections and
//! closes them with a 503 so their clients are told, takes the spare back, and pauses
//! accepting with a doubling delay (10 ms to 1 s) that the stop signal cuts short. It logs the
//! failures once per [`ERROR_LOG_EVERY`] with a count, and recovers by itself when
//! descriptors free up.

use std::cell::Cell;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use broca_shards::timer::StopSignal;

/// The first pause after a failed accept; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Failed accepts are logged at most once per this interval, with their count.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(10);
/// Connections accepted and closed at once while the process is out of descriptors.
const SHED_PER_PAUSE_MAX: usize = 64;

/// The accept loops' counters, for /metrics.
#[derive(Debug, Default)]
pub(crate) struct AcceptStats {
    /// Times an accept loop woke without a connection or an error to handle (it should not).
    pub wakes: Cell<u64>,
    /// Failed accepts.
    pub errors: Cell<u64>,
    /// Connections accepted only to be closed with a 503, the process being out of
    /// descriptors.
    pub shed: Cell<u64>,
}

/// Counts the polls of `inner` after the first that find it still pending: every such poll
/// is a wake that had nothing to do.
struct CountWakes<'a, F> {
    inner: Pin<&'a mut F>,
    polled: bool,
    wakes: &'a Cell<u64>,
}

impl<F: Future> Future for CountWakes<'_, F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let out = self.inner.as_mut().poll(cx);
        if out.is_pending() {
            if self.polled {
                self.wakes.set(self.wakes.get() + 1);
            }
            self.polled = true;
        }
        out
    }
}

/// A listener the loop accepts from.
pub(crate) trait Listen {
    type Stream: 'static;
    fn accept(&self) -> impl Future<Output = glommio::Result<Self::Stream, ()>>;
}

impl Listen for glommio::net::TcpListener {
    type Stream = glommio::net::TcpStream;
    fn accept(&self) -> impl Future<Output = glommio::Result<Self::Stream, ()>> {
        glommio::net::TcpListener::accept(self)
    }
}

impl Listen for glommio::net::UnixListener {
    type Stream = glommio::net::UnixStream;
    fn accept(&self) -> impl Future<Output = glommio::Result<Self::Stream, ()>> {
        glommio::net::UnixListener::accept(self)
    }
}

/// One accept loop.
pub(crate) struct Loop<L> {
    pub listener: L,
    /// What the loop is called in logs.
    pub name: &'static str,
    /// The listener's descriptor, for shedding connections when out of descriptors (`None`:
    /// this listener only pauses).
    pub raw_fd: Option<RawFd>,
    pub stop: Rc<StopSignal>,
    pub stats: Rc<AcceptStats>,
}

impl<L: Listen> Loop<L> {
    /// Accepts until stopped, handing each connection to `serve`.
    pub async fn run<X: Clone>(self, ctx: X, serve: impl Fn(X, L::Stream)) {
        let mut errors = ErrorLog::new(self.name);
        let _ = shed_response(); // made now, not when out of descriptors
        let mut spare = open_spare();
        let mut backoff = BACKOFF_MIN;
        loop {
            let accept = self.listener.accept();
            futures_lite::pin!(accept);
            let counted = CountWakes {
                inner: accept,
                polled: false,
                wakes: &self.stats.wakes,
            };
            let Some(next) = self.stop.or_stop(counted).await else {
                break;
            };
            match next {
                Ok(stream) => {
                    backoff = BACKOFF_MIN;
                    errors.recovered();
                    serve(ctx.clone(), stream);
                }
                Err(e) => {
                    let e = std::io::Error::from(e);
                    self.stats.errors.set(self.stats.errors.get() + 1);
                    if transient_accept_error(&e) {
                        continue; // the peer gave up before we accepted: nothing is wrong
                    }
                    if out_of_descriptors(&e) {
                        if let Some(fd) = self.raw_fd {
                            let shed = shed_waiting(fd, &mut spare);
                            self.stats.shed.set(self.stats.shed.get() + shed as u64);
                        }
                    }
                    errors.failed(&e, backoff);
                    let pause = glommio::timer::sleep(backoff);
                    if self.stop.or_stop(pause).await.is_none() {
                        break;
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}

/// Failed accepts, logged once per interval with their count.
struct ErrorLog {
    name: &'static str,
    unlogged: u64,
    failing_since: Option<Instant>,
    last_logged: Option<Instant>,
    total: u64,
}

impl ErrorLog {
    fn new(name: &'static str) -> ErrorLog {
        ErrorLog {
            name,
            unlogged: 0,
            failing_since: None,
            last_logged: None,
            total: 0,
        }
    }

    fn failed(&mut self, e: &std::io::Error, pause: Duration) {
        let now = Instant::now();
        self.failing_since.get_or_insert(now);
        self.unlogged += 1;
        self.total += 1;
        if self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= ERROR_LOG_EVERY)
        {
            tracing::warn!(
                "accept on {}: {e} ({} failures since the last report); pausing accepts for \
                 {} ms{}",
                self.name,
                self.unlogged,
                pause.as_millis(),
                if out_of_descriptors(e) {
                    "; waiting connections are closed with 503 until descriptors free up"
                } else {
                    ""
                }
            );
            self.last_logged = Some(now);
            self.unlogged = 0;
        }
    }

    fn recovered(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::warn!(
                "accept on {}: accepting again after {} failures over {} ms",
                self.name,
                self.total,
                since.elapsed().as_millis()
            );
            self.total = 0;
            self.unlogged = 0;
            self.last_logged = None;
        }
    }
}

/// Out of descriptors, or of the kernel memory a socket takes.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    broca_io::fs::out_of_descriptors(e.raw_os_error())
        || matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::ENOMEM))
}

/// Errors of one connection that left before it was accepted.
fn transient_accept_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EINTR | libc::EAGAIN | libc::EPROTO)
    )
}

/// A descriptor held back for the moment the process runs out of them.
fn open_spare() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null")
        .ok()
        .map(|f| unsafe { OwnedFd::from_raw_fd(f.into_raw_fd()) })
}

/// What a connection shed for lack of descriptors is told (made once, at the first shed:
/// nothing is allocated while shedding).
fn shed_response() -> &'static [u8] {
    static RESPONSE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    RESPONSE.get_or_init(|| {
        let e = broca_wire::RpcError::new(
            broca_wire::Code::TooManyOpenFiles,
            "broca is out of file descriptors; retry later",
        );
        broca_io::http_server::response(e.status(), crate::JSON, &e.body(), false)
    })
}

/// Frees the spare descriptor, accepts the connections waiting on `listener` (non-blocking)
/// and closes each with a 503, then takes the spare back. Returns how many were shed.
fn shed_waiting(listener: RawFd, spare: &mut Option<OwnedFd>) -> usize {
    let shed_response = shed_response();
    drop(spare.take());
    let mut shed = 0;
    while shed < SHED_PER_PAUSE_MAX {
        // SAFETY: accept4 on a listening descriptor this process owns; the result is a new
        // descriptor we own (closed when `conn` drops).
        let fd = unsafe {
            libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            break;
        }
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a non-blocking send of a static buffer on a descriptor we own.
        unsafe {
            libc::send(
                conn.as_raw_fd(),
                shed_response.as_ptr().cast(),
                shed_response.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
        shed += 1;
    }
    *spare = open_spare();
    shed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shed_response_is_well_framed() {
        let shed = shed_response();
        let at = shed.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let body = &shed[at + 4..];
        let head = std::str::from_utf8(&shed[..at]).unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_open_files");
    }
}
