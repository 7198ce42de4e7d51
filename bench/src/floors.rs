//! What bounds the end-to-end figures, measured in the same run: the disk's own write +
//! fdatasync ceiling over N files, and the loopback provider alone under a closed-loop client
//! (its ceiling, and what one HTTP exchange costs a client).

use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};

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

/// `files` O_DIRECT files in `dir`, each rewritten one 4 KiB block then fdatasynced in a
/// loop for `secs`, all at once on one glommio executor (as a shard's logs are).
pub fn fsync_floor(dir: &Path, files: usize, secs: f64) -> Floor {
    let dir = dir.to_path_buf();
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let ops = Rc::new(Cell::new(0u64));
            let lat = Rc::new(std::cell::RefCell::new(Vec::new()));
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let cpu0 = process_cpu_secs();
            let started = Instant::now();
            let mut tasks = Vec::new();
            for i in 0..files {
                let path = dir.join(format!("floor-{i}"));
                let (ops, lat) = (ops.clone(), lat.clone());
                tasks.push(glommio::spawn_local(async move {
                    let file = glommio::io::DmaFile::create(&path).await.expect("a file");
                    while Instant::now() < until {
                        let t = Instant::now();
                        let mut buf = file.alloc_dma_buffer(4096);
                        buf.as_bytes_mut().fill(7);
                        file.write_at(buf, 0).await.expect("a write");
                        file.fdatasync().await.expect("an fdatasync");
                        ops.set(ops.get() + 1);
                        lat.borrow_mut().push(t.elapsed().as_micros() as u32);
                    }
                    let _ = file.close().await;
                    let _ = std::fs::remove_file(&path);
                }));
            }
            for t in tasks {
                t.await;
            }
            let secs = started.elapsed().as_secs_f64();
            let lat = lat.take();
            floor_of(ops.get(), secs, process_cpu_secs() - cpu0, lat)
        })
        .expect("an executor")
        .join()
        .expect("the fsync floor")
}

/// `conns` keep-alive connections each posting `body` to the provider at `port` and reading
/// the whole answer, for `secs`: the provider's ceiling, and (as `cpu_us_per_op`) what an
/// exchange costs this client. The provider's own CPU is read by the caller.
pub fn provider_alone(port: u16, conns: usize, body: Vec<u8>, secs: f64) -> Floor {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let req = Rc::new(
                [
                    format!(
                        "POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\n\r\n",
                        body.len()
                    )
                    .into_bytes(),
                    body,
                ]
                .concat(),
            );
            let ops = Rc::new(Cell::new(0u64));
            let lat = Rc::new(std::cell::RefCell::new(Vec::new()));
            let until = Instant::now() + Duration::from_secs_f64(secs);
            let cpu0 = process_cpu_secs();
            let started = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..conns {
                let (ops, lat, req) = (ops.clone(), lat.clone(), req.clone());
                tasks.push(glommio::spawn_local(async move {
                    let mut s = glommio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .expect("the provider");
                    let _ = s.set_nodelay(true);
                    let mut buf = vec![0u8; 16 * 1024];
                    while Instant::now() < until {
                        let t = Instant::now();
                        s.write_all(&req).await.expect("a request");
                        // Content-Length framed: read the head, then the body.
                        let mut got = Vec::new();
                        let total = loop {
                            let n = s.read(&mut buf).await.expect("an answer");
                            assert!(n > 0, "the provider closed");
                            got.extend_from_slice(&buf[..n]);
                            if let Some(h) = memchr::memmem::find(&got, b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&got[..h]).to_ascii_lowercase();
                                let len: usize = head
                                    .split("content-length:")
                                    .nth(1)
                                    .and_then(|r| r.split("\r\n").next())
                                    .and_then(|v| v.trim().parse().ok())
                                    .expect("content-length");
                                break h + 4 + len;
                            }
                        };
                        while got.len() < total {
                            let n = s.read(&mut buf).await.expect("an answer");
                            assert!(n > 0, "the provider closed");
                            got.extend_from_slice(&buf[..n]);
                        }
                        ops.set(ops.get() + 1);
                        lat.borrow_mut().push(t.elapsed().as_micros() as u32);
                    }
                }));
            }
            for t in tasks {
                t.await;
            }
            let secs = started.elapsed().as_secs_f64();
            let lat = lat.take();
            floor_of(ops.get(), secs, process_cpu_secs() - cpu0, lat)
        })
        .expect("an executor")
        .join()
        .expect("the provider floor")
}
