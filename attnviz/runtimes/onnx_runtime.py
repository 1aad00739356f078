"""ONNX Runtime (Microsoft) on the CPU: one session per exported graph, safe to run from many threads."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

LABEL = "ONNX Runtime"  # as a person reads it
NAME = "onnxruntime"
PACKAGE = "onnxruntime"


def start(path: Path, threads: int, batches: bool = False) -> Callable[[np.ndarray], list[np.ndarray]]:
    """A function (1, 3, S, S) float32 → the graph's outputs, on ``threads`` CPU threads. ``batches``: a graph
    run on batches of sequences of many lengths (token removal), which keeps ONNX Runtime's memory arena."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Waiting threads sleep rather than spin, as PyTorch's OpenMP threads do here (docs/performance.md, "Beside other work"):
    # a spinning team collapses when another process wants a core.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Memory a server can hold for a class: ONNX Runtime's own arena grows to the peak of every concurrent call
    # and keeps it (+396 MB after 12 captures at once at 196 px, against +108 MB through malloc, which the
    # server trims), and pre-packed weights are a second copy of every matrix (+54 MB), for no measured speed.
    # Token removal's batches are another matter (all maps' curves took 8.4 s without either): they keep both.
    options.enable_cpu_mem_arena = batches
    options.add_session_config_entry("session.disable_prepacking", "0" if batches else "1")
    options.log_severity_level = 3  # errors only: its warnings about unused initializers are noise
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"input": x})
