//! Shared helpers of broca's benchmarks: latency recording and percentiles, aligned buffers.

pub mod cost;
pub mod floors;
pub mod loadgen;
pub mod peer;
pub mod roles;
pub mod runs;

use std::time::Duration;

/// Commit latencies recorded during a benchmark, by label.
#[derive(Default)]
pub struct Latencies {
    rows: Vec<(String, Vec<Duration>)>,
}

impl Latencies {
    /// The sample list for `label`, created on first use.
    pub fn samples(&mut self, label: &str) -> &mut Vec<Duration> {
        if let Some(i) = self.rows.iter().position(|(l, _)| l == label) {
            return &mut self.rows[i].1;
        }
        self.rows.push((label.to_string(), Vec::new()));
        &mut self.rows.last_mut().expect("just pushed").1
    }

    /// Prints `label  n  p50  p99` for every label, in the order first used.
    pub fn print(&mut self, title: &str) {
        println!("\n{title}");
        println!(
            "{:<40} {:>9} {:>11} {:>11}",
            "workload", "commits", "p50", "p99"
        );
        for (label, samples) in &mut self.rows {
            samples.sort_unstable();
            println!(
                "{:<40} {:>9} {:>11} {:>11}",
                label,
                samples.len(),
                fmt(percentile(samples, 50.0)),
                fmt(percentile(samples, 99.0))
            );
        }
    }
}

/// The `p`th percentile of sorted `samples` (nearest rank); zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// Raises this process's open-files limit to `want` (or as far as the hard limit allows).
pub fn raise_fd_limit(want: u64) {
    // SAFETY: reading and setting this process's own limit.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur < want {
            let new = libc::rlimit {
                rlim_cur: want,
                rlim_max: want.max(lim.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &new) != 0 {
                let soft = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
            }
        }
    }
}

/// A heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    /// `len` zeroed bytes aligned to `align`.
    pub fn zeroed(len: usize, align: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, align).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        AlignedBuf { ptr, layout }
    }

    /// The bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes for the life of self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `zeroed`.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&s, 50.0), Duration::from_micros(50));
        assert_eq!(percentile(&s, 99.0), Duration::from_micros(99));
        assert_eq!(percentile(&s[..1], 99.0), Duration::from_micros(1));
    }
}
