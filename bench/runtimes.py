"""``python -m bench.runtimes``: the capture's forward on PyTorch eager, ``torch.compile``, ONNX Runtime
and OpenVINO, side by side in one run.

What is timed is the capture's forward pass: the real offline model on the sample photo, with every
layer's q and k (and token norms) as outputs — :func:`attnviz.capture_tensor` on PyTorch (the hooks) and
on each runtime that :func:`attnviz.fast` switched on after checking it exact; for ``torch.compile``, the
same :class:`attnviz.runtimes.graph.CaptureForward` module compiled. Each (size, threads, load) row runs
in a fresh Python process (thread pools are set once per process), the median of ``--repeats`` runs of
each method, interleaved so drift hits them alike; "contended" runs beside ``--busy`` processes of normal
priority spinning on a core (``python -c "while True: pass"``), as ``bench.contention`` does. Every time
is printed with its ratio to PyTorch eager in the same row.
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
METHODS = ("pytorch", "torch.compile", "onnxruntime", "openvino")


def child(size: int, threads: int, repeats: int, compile_budget: float) -> dict[str, float | str]:
    """In this process: median seconds of each method, or why it was left out."""
    import attnviz
    import torch
    from attnviz import runtimes
    from attnviz.capture import capture_tensor

    torch.set_num_threads(threads)
    model = attnviz.load_model(size=size)
    x = runtimes.probe(model)
    runs: dict[str, object] = {"pytorch": lambda: capture_tensor(model, x)}
    result: dict[str, float | str] = {}
    for name in ("onnxruntime", "openvino"):
        try:
            fast = attnviz.fast(model, name, threads=threads)
        except attnviz.ModelError as e:
            result[name] = str(e)
            continue
        if fast.runtime is None:
            result[name] = "not exact here (see the log line)"
        else:
            runs[name] = lambda fast=fast: capture_tensor(fast, x)
    if compile_budget > 0:
        try:
            start = time.perf_counter()
            compiled = torch.compile(runtimes.graph.CaptureForward(model))
            with torch.inference_mode():
                compiled(x)
            took = time.perf_counter() - start
            if took > compile_budget:
                result["torch.compile"] = f"compiling took {took:.0f} s (budget {compile_budget:.0f} s)"
            else:
                def run_compiled() -> None:
                    with torch.inference_mode():
                        compiled(x)
                runs["torch.compile"] = run_compiled
        except Exception as e:  # noqa: BLE001 — inductor fails in many ways; the row says which
            result["torch.compile"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    else:
        result["torch.compile"] = "skipped (--compile-budget 0)"
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():  # warm-up: first-call allocations, thread pools
        fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    result.update({name: statistics.median(t) for name, t in times.items()})
    return result


def measure(size: int, threads: int, busy: int, repeats: int, compile_budget: float, timeout: float) -> dict:
    # PASSIVE as `import attnviz` sets it (the child imports attnviz first too): PyTorch as users get it
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    spinners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "bench.runtimes", "--child", f"{size},{threads},{repeats},{compile_budget}"],
            env=env, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {m: f"the run took over {timeout:.0f} s" for m in METHODS}
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if out.returncode:
        return {m: f"the run failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:80]}" for m in METHODS}
    return json.loads(out.stdout.strip().splitlines()[-1])


def live() -> None:
    """The live camera's newest-frame worker at 196 px (``bench.live.processor_speed``) on each runtime."""
    import psutil

    from bench.live import processor_speed

    print(f"live camera worker, 196 px, 1 worker × 1 thread, frames at 20/s for 8 s; load average "
          f"{' '.join(f'{x:.1f}' for x in psutil.getloadavg())} before the run\n")
    print("| runtime | heatmaps/s | frame → heatmap sent | compute per frame | frames dropped |")
    print("|---|---|---|---|---|")
    for runtime in (None, "onnxruntime", "openvino"):
        r = processor_speed(1, 1, runtime=runtime)
        print(f"| {r['runtime']} | {r['fps']:.1f} | {r['latency_ms']:.0f} ms | {r['compute_ms']:.0f} ms | "
              f"{r['dropped']:.0%} |", flush=True)


def server(rounds: int = 3, per_caller: int = 10) -> None:
    """The server's setting: one thread per forward pass, 196 px, one caller and then as many callers at once
    as cores (a class's uploads, live frames). Captures per second on each runtime, rounds interleaved."""
    import threading

    import psutil
    import torch

    import attnviz
    from attnviz import runtimes
    from attnviz.capture import capture_tensor
    from attnviz.jobs import core_count

    torch.set_num_threads(1)
    model = attnviz.load_model(size=196)
    x = runtimes.probe(model)
    models = {"pytorch": model, **{name: runtimes.on_runtime(model, name, threads=1) for name in runtimes.installed()}}
    callers = core_count()

    def rate(m, n: int) -> float:
        def work() -> None:
            torch.set_num_threads(1)  # per thread: what tuning.serve() gives every Streamlit thread
            for _ in range(per_caller):
                capture_tensor(m, x)
        threads = [threading.Thread(target=work) for _ in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return n * per_caller / (time.perf_counter() - start)

    for m in models.values():
        rate(m, 1)  # warm-up
    rates: dict[str, dict[int, list[float]]] = {name: {1: [], callers: []} for name in models}
    for _ in range(rounds):
        for name, m in models.items():
            for n in (1, callers):
                rates[name][n].append(rate(m, n))
    print(f"the server's setting: 1 thread per forward pass, 196 px, {per_caller} captures per caller, median of "
          f"{rounds} interleaved rounds; load average {psutil.getloadavg()[0]:.1f} after\n")
    print(f"| runtime | 1 caller: captures/s | {callers} callers at once: captures/s | gain |")
    print("|---|---|---|---|")
    for name, by in rates.items():
        one, many = statistics.median(by[1]), statistics.median(by[callers])
        kept = "" if name == "pytorch" or models[name].runtime is not None else " (not exact: stayed on PyTorch)"
        print(f"| {name}{kept} | {one:.1f} | {many:.1f} | {many / one:.2f}× |")


def cell(value: float | str, eager: float | str) -> str:
    if isinstance(value, str):
        return value
    ratio = f" ({value / eager:.2f}×)" if isinstance(eager, float) else ""
    return f"{value * 1000:.0f} ms{ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.runtimes")
    parser.add_argument("--sizes", default="196,224,518", help="input sizes in px, comma-separated")
    parser.add_argument("--threads", default="1,2", help="threads per forward pass, comma-separated")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the contended rows")
    parser.add_argument("--compile-budget", type=float, default=300.0,
                        help="seconds torch.compile may take to compile before its column says so (0: skip)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one row may take in all")
    parser.add_argument("--live", action="store_true",
                        help="instead: the live camera's worker (bench.live, no browser) on each runtime, 1 thread")
    parser.add_argument("--server", action="store_true",
                        help="instead: captures per second at the server's one thread per forward pass, 1 and "
                             "as many callers at once as cores, on each runtime")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        size, threads, repeats, budget = args.child.split(",")
        print(json.dumps(child(int(size), int(threads), int(repeats), float(budget))))
        return
    import psutil

    if args.live or args.server:
        print(f"machine: {machine.describe()}")
    if args.live:
        live()
        return
    if args.server:
        server()
        return

    print(f"attnviz runtimes benchmark — {psutil.cpu_count()} CPUs, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset (torch: spinning)')}, load average "
          f"{' '.join(f'{x:.1f}' for x in psutil.getloadavg())} before the run (other work on a shared "
          f"machine counts in every time); real offline model on cat.jpg, the capture's forward (q and k of "
          f"every layer as outputs), median of {args.repeats}; contended: beside {args.busy} process(es) "
          f"spinning on a core")
    print(f"machine: {machine.describe()}\n")
    print("| size | threads | load | PyTorch eager | torch.compile | ONNX Runtime | OpenVINO | load average |")
    print("|---|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        for threads in (int(n) for n in args.threads.split(",")):
            for busy in (0, args.busy):
                row = measure(size, threads, busy, args.repeats, args.compile_budget, args.timeout)
                eager = row.get("pytorch", "?")
                cells = " | ".join(cell(row.get(m, "?"), eager) for m in METHODS)
                load = "quiet" if busy == 0 else "contended"
                print(f"| {size} px | {threads} | {load} | {cells} | {psutil.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
