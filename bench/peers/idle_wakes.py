#!/usr/bin/env python3
"""How often an idle `broca serve` wakes: the context switches of all its threads per second,
over 10 s of no requests, for each binary given, alternated, RUNS rounds (default 3).

    python3 bench/peers/idle_wakes.py BINARY_BEFORE BINARY_AFTER [RUNS]
"""

import glob
import signal
import subprocess
import sys
import tempfile
import time

WINDOW_SECS = 10


def switches(pid):
    total = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended
    return total


def idle_rate(binary):
    state = tempfile.mkdtemp()
    serve = subprocess.Popen(
        [binary, "--state-dir", state, "serve", "--listen", "127.0.0.1:0", "--shards", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    serve.stdout.readline()  # the ready line
    time.sleep(2)  # past the start's own work
    before, t0 = switches(serve.pid), time.time()
    time.sleep(WINDOW_SECS)
    after, t1 = switches(serve.pid), time.time()
    serve.send_signal(signal.SIGTERM)
    serve.wait()
    return (after - before) / (t1 - t0)


def main():
    binaries = sys.argv[1:3]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rates = {b: [] for b in binaries}
    for _ in range(runs):
        for b in binaries:
            rates[b].append(idle_rate(b))
    for b, r in rates.items():
        r.sort()
        print(f"{b}: context switches per second, idle: {[round(x, 1) for x in r]}, median {r[len(r) // 2]:.1f}")


if __name__ == "__main__":
    main()
