#!/usr/bin/env python3
"""Where a durable step's CPU goes, by part of the cost model (docs/cost-model.md).

Reads `perf script -F pid,tid,comm,ip,sym,dso` output of a `perf record` of the serve_steps
bench (stdin), keeps the samples of the process PID (the bench, not its provider child; PID
`min` takes the lowest pid that has samples, which is the bench), and
puts each sample's leaf frame into one part by its symbol and object. Prints each part's
share of the samples, and, given CPU_US_PER_STEP (the cost table's user + system time per
durable step, measured by `BROCA_BENCH_COST=1`), its microseconds per step.

    perf script -i cost.data -F pid,tid,comm,ip,sym,dso | python3 cost_parts.py PID CPU_US_PER_STEP
"""

import re
import sys

# (part, kernel?, pattern on the symbol); the first that matches wins. Kernel frames are
# told apart by their object ([kernel.kallsyms]).
KERNEL = [
    ("measurement (perf's own tracepoints)", r"^perf_|syscall_trace|trace_"),
    ("kernel: scheduler, context switches, interrupts",
     r"schedule|finish_task_switch|irqentry|_raw_spin_unlock_irq|try_to_wake|wake_up|futex|enqueue|dequeue|pick_next|update_curr|ttwu|select_task|hrtimer|tick_|timerfd|epoll|do_idle|cpuidle"),
    ("kernel: io_uring", r"io_uring|^io_|^__io_|io_wq|io_worker|mod_delayed_work"),
    ("kernel: ext4 (new WALs' inodes), block layer, fdatasync",
     r"ext4|jbd2|blk_|dd_insert|bio|iomap|nvme|virtio|iowrite|submit_bio|find_get_block|recently_deleted|inode|xas_|filemap|dio|fdatasync|fsync|^wbt|^rq_"),
    ("kernel: loopback TCP", r"^tcp|inet|^ip_|ipv4|skb|^sock|netif|napi|__dev_queue|loopback|net_rx|^sk_|__sys_sendto|__sys_recvfrom|csum|__x64_sys_sendto|__x64_sys_recvfrom"),
    ("kernel: spinlocks", r"_raw_spin|queued_spin"),
    ("kernel: page faults, memory", r"page|fault|^mm_|memcg|folio|alloc_pages|vma|lru|mmap|munmap|madvise|kmem|kmalloc|kfree|slab"),
    ("kernel: system call entry and exit, file lookups", r"entry_SYSCALL|do_syscall|x64_sys_call|__x64_sys|exit_to_user|^fget|fdget|copy_user|rep_movs|_copy_|copy_to|copy_from|^__rcu|rcu_read"),
]
USER = [
    ("drops (values freed)", r"drop_in_place"),
    ("allocator (mimalloc)", r"^mi_|^_mi_|mimalloc|__rust_alloc|__rust_dealloc|__rust_realloc|alloc::alloc"),
    ("copies (memcpy, memmove, memset)", r"memcpy|memmove|memset|memcmp"),
    ("clock reads (vDSO)", r"clock_gettime|__vdso"),
    ("rendering the request", r"render|broca_provider::json|broca_provider::template|Template|write_json|escape"),
    ("reading the provider's stream", r"normaliz|Normaliz|broca_provider::scan|broca_io::sse|sse::|broca_provider::anthropic::read|EventStream|parse_event"),
    ("the WAL: records, appends, group commit", r"broca_wal|broca_io::log|broca_io::commit|Committer|crc32|encode_payload|RecordWriter"),
    ("JSON (serde_json)", r"serde_json|serde_core|serde::"),
    ("the run: machine, replay, admission, catalog", r"broca_core|broca_catalog"),
    ("the session actor and its hub", r"broca_session|broca_host"),
    ("HTTP/1.1 client and the provider transport", r"broca_io::net|broca_io::http1|httparse|http_client|ClientConn|chunked|broca_provider::transport"),
    ("libc system call wrappers (send, recv, read, syscall)", r"^syscall$|^read$|^__send$|^__libc_recv$|^write$|^__libc_"),
    ("glommio: executor, reactor, io_uring rings", r"glommio|futures_lite|async_task|concurrent_queue|io_uring_get_cqe|_io_uring"),
    ("the bench's own loop (broca's send and run inlined into it)", r"serve_steps::|broca_testkit"),
    ("tools", r"broca_tools"),
    ("hashing (blake3)", r"blake3"),
    ("the Rust standard library, smallvec", r"^std::|^core::|^alloc::|<std::|<core::|<alloc::|smallvec"),
]


def part_of(sym, dso):
    table = KERNEL if "kernel" in dso else USER
    for name, pattern in table:
        if re.search(pattern, sym):
            return name
    if "kernel" in dso:
        return "kernel: other"
    if "libc" in dso:
        return "libc (other)"
    return "other"


def main():
    pid = sys.argv[1]
    lines = sys.stdin.readlines()
    if pid == "min":
        pids = [int(l.split()[1].split("/")[0]) for l in lines if len(l.split()) > 3]
        pid = str(min(pids))
    cpu_us = float(sys.argv[2]) if len(sys.argv) > 2 else None
    counts = {}
    total = 0
    measured = 0
    for line in lines:
        # comm pid/tid ip sym... (dso)
        f = line.split()
        if len(f) < 4 or f[1].split("/")[0] != pid:
            continue
        dso = f[-1] if f[-1].startswith("(") else ""
        sym = " ".join(f[3:-1]) if dso else " ".join(f[3:])
        part = part_of(sym, dso)
        if part.startswith("measurement"):
            measured += 1
            continue
        counts[part] = counts.get(part, 0) + 1
        total += 1
    if total == 0:
        sys.exit("no samples of pid " + pid)
    print(f"{total} samples of pid {pid} ({measured} in perf's own tracepoints left out)")
    print("| part | share of broca's CPU | µs per durable step |")
    print("|---|---:|---:|")
    for part, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        share = n / total
        us = f"{share * cpu_us:.1f}" if cpu_us is not None else "n/a"
        print(f"| {part} | {share * 100:.1f}% | {us} |")


if __name__ == "__main__":
    main()
