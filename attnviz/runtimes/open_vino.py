"""OpenVINO (Intel) on the CPU, in float32: one compiled model per exported graph, one inference
request per call (a request is not shared between threads)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

NAME = "openvino"
PACKAGE = "openvino"


def start(path: Path, threads: int) -> Callable[[np.ndarray], list[np.ndarray]]:
    """A function (1, 3, S, S) float32 → the graph's outputs, on ``threads`` CPU threads."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {
        "INFERENCE_NUM_THREADS": threads,
        # Without this OpenVINO computes in bfloat16 on CPUs that have it: fast, and not the same numbers.
        "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,  # a shared machine: threads go where the OS finds a free core
    })
    outputs = compiled.outputs

    def run(x: np.ndarray) -> list[np.ndarray]:
        result = compiled.create_infer_request().infer({0: x})
        return [result[o] for o in outputs]

    return run
