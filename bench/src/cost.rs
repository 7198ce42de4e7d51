//! What a measured window cost the process, for the cost model (docs/cost-model.md): CPU
//! (getrusage: user and system time of every thread), context switches (voluntary: a thread
//! waited; involuntary: it was preempted), what it wrote (/proc/self/io: bytes to storage,
//! write-family system calls), and, with perf on the path, every system call (perf stat's
//! `raw_syscalls:sys_enter` over the process's threads, attached for the window).

use std::io::Read;
use std::process::{Child, Command, Stdio};

/// Counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub user_us: u64,
    pub sys_us: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// Bytes the process caused to be written to storage.
    pub write_bytes: u64,
    /// write-family system calls (`syscw`; io_uring submissions are not among them).
    pub write_calls: u64,
}

/// The process's counters now.
pub fn snapshot() -> Snapshot {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    Snapshot {
        user_us: us(ru.ru_utime),
        sys_us: us(ru.ru_stime),
        voluntary_switches: ru.ru_nvcsw as u64,
        involuntary_switches: ru.ru_nivcsw as u64,
        write_bytes: field("write_bytes:"),
        write_calls: field("syscw:"),
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, b: Snapshot) -> Snapshot {
        Snapshot {
            user_us: self.user_us.saturating_sub(b.user_us),
            sys_us: self.sys_us.saturating_sub(b.sys_us),
            voluntary_switches: self.voluntary_switches.saturating_sub(b.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(b.involuntary_switches),
            write_bytes: self.write_bytes.saturating_sub(b.write_bytes),
            write_calls: self.write_calls.saturating_sub(b.write_calls),
        }
    }
}

/// `perf stat` attached to this process for a window.
pub struct PerfStat {
    child: Child,
}

impl PerfStat {
    /// Starts counting `events` over this process's threads; `None` when perf cannot (not on
    /// the path, or not allowed).
    pub fn start(events: &[&str]) -> Option<PerfStat> {
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", &events.join(",")])
            .args(["-p", &std::process::id().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        // perf attaches before it counts: give it a moment.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Some(PerfStat { child })
    }

    /// Stops counting; each event's count.
    pub fn stop(mut self) -> Vec<(String, u64)> {
        // SAFETY: a signal to the child this value owns.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.child.wait();
        // CSV lines: count,unit,event,...
        err.lines()
            .filter_map(|l| {
                let mut f = l.split(',');
                let count = f.next()?.trim().parse().ok()?;
                let _unit = f.next()?;
                Some((f.next()?.trim().to_string(), count))
            })
            .collect()
    }
}
