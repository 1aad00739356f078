"""``python -m bench.contention``: the capture's forward pass alone and beside a busy process, side by side.

PyTorch's OpenMP threads spin while they wait for each other, so when another process wants a core the
forward pass of a multi-threaded team can collapse. Each row runs in a fresh Python process (OpenMP reads
``OMP_WAIT_POLICY`` once, when torch loads it): the real offline model at 196 px, the median of
``--repeats`` captures of the sample photo, first on the machine as it is ("quiet"), then beside
``--busy`` processes of normal priority that each spin on one core (``python -c "while True: pass"``).
The ratio contended / quiet is the number to keep small (target ≤ 2.5× with one of two cores taken).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from bench import machine

BUSY = "while True: pass"
POLICIES = ("ACTIVE", "PASSIVE")


def forward_times(repeats: int) -> list[float]:
    """In this process: ``repeats`` captures of the sample photo, seconds each (after two warm-ups)."""
    import attnviz

    model = attnviz.load_model()
    image = attnviz.load_photo(attnviz.photos.sample("cat"), model).image
    for _ in range(2):
        attnviz.capture(model, image)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        attnviz.capture(model, image)
        times.append(time.perf_counter() - start)
    return times


def measure(policy: str, threads: int, busy: int, repeats: int) -> float:
    """Median capture seconds in a fresh process with this OpenMP policy and thread count."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy, "OMP_NUM_THREADS": str(threads)}
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        out = subprocess.run([sys.executable, "-m", "bench.contention", "--child", str(repeats)], env=env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    return statistics.median(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.contention")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the forward pass")
    parser.add_argument("--threads", default="1,2", help="PyTorch threads to try, comma-separated")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(forward_times(args.child)))
        return
    import psutil

    print(f"attnviz contention benchmark — {psutil.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in psutil.getloadavg())} before the run; real offline model at 196 px, "
          f"median of {args.repeats} captures; contended: beside {args.busy} process(es) spinning on a core")
    print(f"machine: {machine.describe()}\n")
    print("| OMP_WAIT_POLICY | threads | quiet | contended | contended / quiet |")
    print("|---|---|---|---|---|")
    for threads in (int(n) for n in args.threads.split(",")):
        for policy in POLICIES:
            quiet = measure(policy, threads, 0, args.repeats)
            loaded = measure(policy, threads, args.busy, args.repeats)
            print(f"| {policy} | {threads} | {quiet * 1000:.0f} ms | {loaded * 1000:.0f} ms | {loaded / quiet:.2f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
