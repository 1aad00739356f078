"""OpenVINO (Intel) on the CPU, in float32: one compiled model per exported graph, one inference
request per call (a request is not shared between threads).

OpenVINO runs at most one request per *stream* at a time ("num_streams limits the number of infer requests
that can be run in parallel"), and its latency hint makes one stream. A server runs one thread per forward
pass and many forward passes at once (a class's uploads, live frames): with one stream they would queue
behind each other on one core. So the cores are split into streams of ``threads`` threads each, and
concurrent calls run side by side, as PyTorch's do.

A compiled model is kept for the process's life (the last 8 started): released, it left a state in which the
next SIGINT — Ctrl-C — killed the process with a segmentation fault (seen with OpenVINO 2026.4 beside torch;
tests/test_runtimes.py). Keeping it also spares compiling the same graph twice."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from ..jobs import core_count

LABEL = "OpenVINO"  # as a person reads it
NAME = "openvino"
PACKAGE = "openvino"


@functools.lru_cache(maxsize=8)
def start(path: Path, threads: int, batches: bool = False) -> Callable[[np.ndarray], list[np.ndarray]]:
    """A function (1, 3, S, S) float32 → the graph's outputs, on ``threads`` CPU threads (``batches``: the
    token-removal graph; OpenVINO runs both kinds alike)."""
    import openvino as ov

    streams = max(1, core_count() // threads)  # one thread per forward pass on 2 cores: 2 streams of 1 thread
    compiled = ov.Core().compile_model(str(path), "CPU", {
        "NUM_STREAMS": streams,
        "INFERENCE_NUM_THREADS": streams * threads,
        # Without this OpenVINO computes in bfloat16 on CPUs that have it: fast, and not the same numbers.
        "INFERENCE_PRECISION_HINT": "f32",
        "ENABLE_CPU_PINNING": False,  # a shared machine: threads go where the OS finds a free core
    })
    outputs = compiled.outputs
    requests = threading.local()  # one inference request per calling thread, made on its first call

    def run(x: np.ndarray) -> list[np.ndarray]:
        request = getattr(requests, "request", None)
        if request is None:
            request = requests.request = compiled.create_infer_request()
        result = request.infer({0: x})
        return [np.array(result[o]) for o in outputs]  # copied: the request reuses its output memory

    return run
