use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;
fn bare(path: &std::path::Path, n: u64, label: &str) {
    let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path).unwrap();
    let mut buf = broca_bench::AlignedBuf::zeroed(4096, 4096);
    let t = Instant::now();
    let mut off = 0u64;
    for _ in 0..n {
        let pos = off & !511; let len = ((off + 256).div_ceil(512) * 512 - pos) as usize;
        f.write_all_at(&buf.as_mut_slice()[..len], pos).unwrap();
        f.sync_data().unwrap();
        off += 256;
    }
    println!("{label}: {:.1} us/op", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}
fn main() {
    let dir = tempfile::tempdir_in("/work/main/target/bench-files").unwrap();
    let a = dir.path().join("a");
    let mut f = File::create(&a).unwrap();
    f.write_all(&vec![0u8; 8 << 20]).unwrap(); f.sync_all().unwrap(); drop(f);
    let b = dir.path().join("b");
    let f = OpenOptions::new().create(true).read(true).write(true).custom_flags(libc::O_DIRECT).open(&b).unwrap();
    let mut z = broca_bench::AlignedBuf::zeroed(8 << 20, 4096);
    f.write_all_at(z.as_mut_slice(), 0).unwrap(); f.sync_all().unwrap(); drop(f);
    for _ in 0..2 { bare(&a, 3000, "buffered-prezeroed"); bare(&b, 3000, "direct-prezeroed"); }
    broca_shards::run_local(async { bare(&b, 3000, "inside executor"); }).unwrap();
    let b2 = b.clone();
    broca_shards::run_local(async move {
        let f = glommio::io::OpenOptions::new().read(true).write(true).dma_open(&b2).await.unwrap();
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        let mut gbuf = f.alloc_dma_buffer(4096);
        let mut hbuf = broca_bench::AlignedBuf::zeroed(4096, 4096);
        let heap = std::env::args().nth(1).is_some();
        let ptr = if heap { hbuf.as_mut_slice().as_ptr() } else { gbuf.as_bytes_mut().as_ptr() };
        let t = Instant::now();
        let mut off = 0u64;
        for _ in 0..3000 {
            let pos = off & !511; let len = ((off + 256).div_ceil(512) * 512 - pos) as usize;
            unsafe { libc::pwrite(fd, ptr.cast(), len, pos as i64); libc::fdatasync(fd); }
            off += 256;
        }
        println!("glommio fd: {:.1} us/op", t.elapsed().as_secs_f64() * 1e6 / 3000.0);
    }).unwrap();
}
