"""A shared server's guards, measured: the parameter budget and the heavy-job queue.

    python -m bench.server            # ~30 s on a 2-core CPU

Prints: how fast (and with how much memory) a giant architecture is refused; thirty identical requests
for the 518 px rollout through the queue against one run alone; four different ones against running
them one after another; the queue's own cost per job.
"""
from __future__ import annotations

import statistics
import threading
import time

from attnviz import capture, load_model, serving
from attnviz.jobs import JobQueue, core_count
from attnviz.rollout import rollout_map


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def budget() -> None:
    serving.architecture_parameters("vit_tiny_patch16_224")  # imports and warms timm
    print("Parameter budget (default 100 M), counted on the meta device:")
    for arch in ("vit_base_patch16_224", "vit_large_patch16_224", "vit_giant_patch14_224", "vit_7b_patch16_dinov3"):
        before, start = rss_mb(), time.perf_counter()
        params = serving.architecture_parameters(arch)
        seconds = time.perf_counter() - start
        verdict = "refused" if params > serving.DEFAULT_MAX_PARAMS else "allowed"
        print(f"  {arch:<26} {params / 1e6:>7,.0f} M  {verdict:<8} in {seconds:.3f} s, "
              f"resident memory {rss_mb() - before:+.1f} MB")


def clicks(queue: JobQueue, requests: list[tuple], compute) -> float:
    """Every request from its own thread (one owner each) at the same moment; seconds until all are answered."""
    start = threading.Barrier(len(requests) + 1)
    answered = []

    def click(i, key):
        start.wait()
        job = queue.submit(key, lambda: compute(*key), owner=f"session{i}")
        queue.wait(job)
        answered.append(job.result())

    threads = [threading.Thread(target=click, args=(i, key)) for i, key in enumerate(requests)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    assert len(answered) == len(requests)
    return time.perf_counter() - began


def main() -> None:
    budget()
    import PIL.Image

    from attnviz.photos import sample

    model = load_model(size=518, device="cpu")
    cap = capture(model, PIL.Image.open(sample("cat")))
    roll = lambda discard: rollout_map(cap, 0, cap.num_layers - 1, "mean", discard)  # noqa: E731
    start = time.perf_counter()
    roll(0.0)
    alone = time.perf_counter() - start
    cores = core_count()
    print(f"\nHeavy-job queue ({cores} workers = cores), 518 px rollout of all layers ({alone:.2f} s alone):")

    queue = JobQueue(cores)
    seconds = clicks(queue, [(0.0,)] * 30, roll)
    print(f"  30 identical clicks at once: all answered in {seconds:.2f} s with {queue.runs} run "
          f"(one after another: {30 * alone:.0f} s)")
    start = time.perf_counter()
    again = queue.submit((0.0,), lambda: roll(0.0), owner="later")
    print(f"  a later identical click: from the cache in {1000 * (time.perf_counter() - start):.2f} ms "
          f"(done at once: {again.done()})")

    queue = JobQueue(cores)
    discards = [0.05 * i for i in range(1, 5)]
    serial = 0.0
    for d in discards[:2]:
        start = time.perf_counter()
        roll(d)
        serial += time.perf_counter() - start
    serial *= len(discards) / 2
    seconds = clicks(queue, [(d,) for d in discards], roll)
    print(f"  4 different clicks at once: {seconds:.2f} s, {queue.runs} runs, at most {queue.peak_running} "
          f"together (one after another: ~{serial:.1f} s)")

    queue = JobQueue(cores)
    costs = []
    for i in range(500):
        start = time.perf_counter()
        job = queue.submit(("trivial", i), lambda: None, owner="bench")
        queue.wait(job)
        costs.append(time.perf_counter() - start)
    print(f"  the queue's own cost per job (submit → answer, trivial job): median "
          f"{1000 * statistics.median(costs):.2f} ms")


if __name__ == "__main__":
    main()
