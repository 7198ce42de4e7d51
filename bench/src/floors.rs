//! What bounds the end-to-end figures, measured in the same run: the disk's own write +
//! fdatasync ceiling over N files, and the loopback provider alone under a closed-loop client
//! (its ceiling, and what one HTTP exchange costs a client).

use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The CPU seconds (user + system) this process has used, every thread and io_uring worker
/// included.
pub fn process_cpu_secs() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// What a floor measured.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    pub ops_per_s: f64,
    /// CPU of this process per operation, in µs.
    pub cpu_us_per_op: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

fn floor_of(ops: u64, secs: f64, cpu: f64, mut lat: Vec<u32>) -> Floor {
    lat.sort_unstable();
    let pick = |p: f64| {
        lat.get(((lat.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0) as f64
    };
    Floor {
        ops_per_s: ops as f64 / secs,
        cpu_us_per_op: cpu * 1e6 / ops.max(1) as f64,
        p50_us: pick(0.5),
        p99_us: pick(0.99),
    }
}

/// What one task of a floor records: each operation's latency.
pub(crate) struct Recorder {
    lat: std::cell::RefCell<Vec<u32>>,
}

impl Recorder {
    fn done(&self, started: Instant) {
        self.lat
            .borrow_mut()
            .push(started.elapsed().as_micros() as u32);
    }
}

/// Runs `tasks` copies of `task(i, until, recorder)` at once on a new glommio executor until
/// `until`, `secs` from now; the floor of what they recorded, with this process's CPU.
fn floor_on_executor<F, Fut>(tasks: usize, secs: f64, task: F) -> Floor
where
    F: Fn(usize, Instant, Rc<Recorder>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let recorder = Rc::new(Recorder {
                lat: Default::default(),
            });
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let cpu0 = process_cpu_secs();
            let started = Instant::now();
            let running: Vec<_> = (0..tasks)
                .map(|i| glommio::spawn_local(task(i, until, recorder.clone())))
                .collect();
            for t in running {
                t.await;
            }
            let secs = started.elapsed().as_secs_f64();
            let lat = recorder.lat.take();
            floor_of(lat.len() as u64, secs, process_cpu_secs() - cpu0, lat)
        })
        .expect("an executor")
        .join()
        .expect("the floor's executor")
}

/// `files` O_DIRECT files in `dir`, each rewritten one 4 KiB block then fdatasynced in a
/// loop for `secs`, all at once on one glommio executor (as a shard's logs are).
pub fn fsync_floor(dir: &Path, files: usize, secs: f64) -> Floor {
    let dir = dir.to_path_buf();
    floor_on_executor(files, secs, move |i, until, rec| {
        let path = dir.join(format!("floor-{i}"));
        async move {
            let file = glommio::io::DmaFile::create(&path).await.expect("a file");
            while Instant::now() < until {
                let t = Instant::now();
                let mut buf = file.alloc_dma_buffer(4096);
                buf.as_bytes_mut().fill(7);
                file.write_at(buf, 0).await.expect("a write");
                file.fdatasync().await.expect("an fdatasync");
                rec.done(t);
            }
            let _ = file.close().await;
        }
    })
}

/// `files` new files created in `dir` one after the other (owner-only, exclusive, as a new
/// session's WAL is): creates per second, and the CPU of each.
pub fn create_floor(dir: &Path, files: usize) -> Floor {
    use std::os::unix::fs::OpenOptionsExt;
    let cpu0 = process_cpu_secs();
    let started = Instant::now();
    let mut lat = Vec::with_capacity(files);
    for i in 0..files {
        let t = Instant::now();
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(format!("new-{i}")))
            .expect("a new file");
        lat.push(t.elapsed().as_micros() as u32);
    }
    floor_of(
        files as u64,
        started.elapsed().as_secs_f64(),
        process_cpu_secs() - cpu0,
        lat,
    )
}

/// `files` new WALs' files put in place the way broca does when a spare is at hand: each an
/// empty file made ahead in `spares` (not timed), renamed into `dir` unless something is
/// there (`renameat2` with `RENAME_NOREPLACE`).
pub fn spare_handout_floor(dir: &Path, spares: &Path, files: usize) -> Floor {
    let made: Vec<_> = (0..files)
        .map(|i| {
            let f = spares.join(format!("spare-{i}"));
            broca_io::fs::create_new(&f, 0o600).expect("a spare file");
            f
        })
        .collect();
    let cpu0 = process_cpu_secs();
    let started = Instant::now();
    let mut lat = Vec::with_capacity(files);
    for (i, spare) in made.iter().enumerate() {
        let t = Instant::now();
        broca_io::fs::rename_new(spare, &dir.join(format!("handed-{i}"))).expect("renamed");
        lat.push(t.elapsed().as_micros() as u32);
    }
    floor_of(
        files as u64,
        started.elapsed().as_secs_f64(),
        process_cpu_secs() - cpu0,
        lat,
    )
}

/// `conns` keep-alive connections each posting `body` to the provider at `port` and reading
/// the whole answer, for `secs`: the provider's ceiling, and (as `cpu_us_per_op`) what an
/// exchange costs this client. The provider's own CPU is read by the caller.
pub fn provider_alone(port: u16, conns: usize, body: Vec<u8>, secs: f64) -> Floor {
    let mut req = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let req = std::sync::Arc::new(req);
    floor_on_executor(conns, secs, move |_, until, rec| {
        let req = req.clone();
        async move {
            let mut s = glommio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("the provider");
            let _ = s.set_nodelay(true);
            while Instant::now() < until {
                let t = Instant::now();
                let (status, _) = crate::loadgen::exchange(&mut s, &req)
                    .await
                    .expect("an answer");
                assert_eq!(status, 200, "the provider answered {status}");
                rec.done(t);
            }
        }
    })
}
