"""The capture's forward pass as one ONNX graph: the network with every layer's q and k as outputs; and the
blocks alone (:class:`BlocksForward`), for the token-removal runs of :mod:`attnviz.faithfulness`.

:class:`CaptureForward` runs the network exactly as :func:`attnviz.capture_tensor` does — with the hooks
the model family's adapter installed (:mod:`attnviz.adapters`) writing into a recorder — and returns what
they read: the output, every layer's q and k (after ``q_norm`` / ``k_norm``, and after the adapter's
``finish``, e.g. the RoPE rotation) and every token's norm after every layer. Tracing it with
``torch.onnx.export`` therefore records the very operations the capture reads, and nothing is written
twice: the adapters stay the one place that knows where a family's q and k are.

The exported file depends only on the network's weights and the input size, so it is kept in a cache
folder (``$ATTNVIZ_CACHE/runtimes``, never the repository) under a digest of both and reused.
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
import time
import warnings
from pathlib import Path

import torch

from .._version import __version__
from ..adapters import Recorder

OPSET = 17  # LayerNormalization is an ONNX op from 17 on; both runtimes here run it
OUTPUTS = ("output", "query", "key", "norms")
log = logging.getLogger("attnviz.runtimes")


class CaptureForward(torch.nn.Module):
    """(1, 3, S, S) → (output (C,), query (L, H, N, d_k), key (L, H, N, d_k), norms (L, N))."""

    def __init__(self, model) -> None:
        super().__init__()
        self.network = model.network  # registered, so export finds its weights
        self.model = model
        # The exporter puts this module back in the mode it found it in, recursively: a new module is in
        # training mode, and would leave the shared network there (dropout, drop-path on in every capture).
        self.eval()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model, adapter = self.model, self.model.adapter
        shape = (adapter.depth, adapter.num_heads, model.num_tokens, adapter.head_dim)  # (L, H, N, d_k)
        recorder = Recorder(query=torch.zeros(shape), key=torch.zeros(shape),
                            norms=torch.zeros((adapter.depth, model.num_tokens)))  # (L, N)
        with model.tap.recording(recorder):
            output = adapter.forward(model.network, x)
        adapter.finish(recorder)
        return output, recorder.query, recorder.key, recorder.norms


class BlocksForward(torch.nn.Module):
    """(B, n, D) token sequences (positions already added, any batch and length) → (B, C) outputs: timm's
    blocks and head as :func:`attnviz.interventions.run_blocks` and ``readout`` run them (plain timm ViTs
    only, the models :func:`attnviz.interventions.refusal` lets through)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.network = model.network
        self.eval()  # as CaptureForward: the exporter restores the mode it found

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from .. import interventions

        return interventions.readout(self.network, interventions.run_blocks(self.network, tokens, for_readout=True))


class ClassRowsForward(torch.nn.Module):
    """(1, 3, S, S) → (L, H, N): every layer's class-token attention row (:func:`attnviz.interventions.class_rows`),
    the live camera's one need, without every token's q and k as outputs (plain timm ViTs with a class token)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.network = model.network
        self.eval()  # as CaptureForward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .. import interventions

        return interventions.class_rows(self.network, interventions.embed(self.network, x))[0]


GRAPHS = {  # kind → (module, example input, dynamic axes): what each exported file computes
    "capture": (CaptureForward, lambda model: torch.zeros(1, 3, model.size, model.size), None),
    "blocks": (BlocksForward, lambda model: torch.zeros(2, model.num_tokens, model.embed_dim),
               {"input": {0: "batch", 1: "tokens"}, "output": {0: "batch"}}),
    "rows": (ClassRowsForward, lambda model: torch.zeros(1, 3, model.size, model.size), None),
}


def weights_digest(network: torch.nn.Module) -> str:
    """sha256 of every parameter and buffer (names, shapes, bytes): two networks with one digest compute
    the same function."""
    h = hashlib.sha256()
    for name, tensor in sorted({**dict(network.named_parameters()), **dict(network.named_buffers())}.items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def exported(model, folder: Path, kind: str = "capture") -> Path:
    """The ONNX file of ``model``'s capture forward at its size (``kind`` "capture") or of its blocks and head
    ("blocks"), exported on first use (a few seconds)."""
    module, example, dynamic = GRAPHS[kind]
    code = [sys.modules[type(model.adapter).__module__].__file__, __file__]  # what decides the traced ops
    if kind in ("blocks", "rows"):
        code.append(str(Path(__file__).parents[1] / "interventions.py"))
    key = hashlib.sha256("|".join([
        kind, model.name, str(model.size), model.adapter.family, torch.__version__, __version__, str(OPSET),
        weights_digest(model.network), *(hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in code),
    ]).encode()).hexdigest()[:20]
    target = Path(folder) / f"{kind}-{key}.onnx"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(
                module(model), (example(model),), str(partial), dynamo=False, opset_version=OPSET,
                input_names=["input"], output_names=list(OUTPUTS) if kind == "capture" else ["output"],
                dynamic_axes=dynamic,
            )
        os.replace(partial, target)  # a half-written file never carries the final name
    finally:
        partial.unlink(missing_ok=True)
    log.info("exported %s's %s at %d px to %s in %.1f s", model.name, kind, model.size, target, time.perf_counter() - start)
    return target
