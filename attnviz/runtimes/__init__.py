"""A faster forward where it is exact: the capture's forward pass on ONNX Runtime or OpenVINO.

    import attnviz
    model = attnviz.fast(attnviz.load_model(), "openvino")   # or "onnxruntime"
    cap = attnviz.capture(model, photo)                     # the same Capture, computed faster
    model.runtime                                           # Runtime('openvino', 1 thread) — or None

PyTorch stays the reference and the default. :func:`fast` exports the capture's forward — the network
with every layer's q and k as extra outputs (:mod:`.graph`) — to ONNX, starts it on the runtime, and
runs both on its certification set (:func:`probes`: the four sample photos, uniform noise over the whole
pixel range, all black, all white and a black-and-white checkerboard of patches, each as this model sees
it). It keeps the runtime only if on every one of them, on every layer, the runtime's q and k, token
norms and output equal PyTorch's within 1e-5 of that layer's largest value, and every attention weight
softmax(q · kᵀ · scale + bias) within 1e-5; ``Runtime.certified`` states that bound, the set and the
largest weight difference found on it. Otherwise it logs one line (logger ``attnviz.runtimes``) naming
the input that differed, and returns the model as it was. The bound is certified on that set, not proven
for every photo: a model whose runtime rounds close to the bound on some photos (a DeiT with sharpened q
and k was 1.0–1.8e-5 off on four photos of five, 7.8e-5 on noise) is refused by the set's noise and
extremes rather than certified on one easy photo.

The weights themselves are always recomputed from q and k by :class:`attnviz.Capture`, exactly as on
the PyTorch path. A runtime needs the optional extra: ``pip install 'attnviz[fast]'``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
from PIL import Image

import attnviz.offline as offline
from ..capture import capture_tensor
from ..errors import ModelError
from ..models import Model
from . import graph, onnx_runtime, open_vino

RUNTIMES = {backend.NAME: backend for backend in (onnx_runtime, open_vino)}
DEFAULT = "openvino"
# "auto" (a server's default) takes the first installed: the most captures per second at the server's one
# thread per forward pass with as many at once as cores (python -m bench.runtimes --server, docs/performance.md).
PREFERENCE = ("onnxruntime", "openvino")
# ... and token removal's graph, started only when the curves are asked for, on the runtime that runs its batches
# fastest: OpenVINO took 3.87 s for all maps' curves against ONNX Runtime's 4.57 s (4.60 s against 5.58 s in a
# slower hour), for 0.48 GB against 0.27 GB once it has run (docs/faithfulness.md).
REMOVAL_PREFERENCE = ("openvino", "onnxruntime")
# ... and the live camera's class-rows graph, started on the first live frame: one frame at one thread took 54 ms on
# OpenVINO against 69 ms on ONNX Runtime (bench.runtimes --live, December 3), for 0.19 GB more once started
# (+271 MB against +81 MB; docs/live-camera.md).
ROWS_PREFERENCE = ("openvino", "onnxruntime")
TOLERANCE = 1e-5
INSTALL = "pip install 'attnviz[fast]'"
log = logging.getLogger("attnviz.runtimes")

__all__ = ["Outputs", "Runtime", "fast", "installed", "mismatch", "on_runtime", "probes", "RUNTIMES", "TOLERANCE"]


class Outputs(NamedTuple):
    """What one forward pass gives the capture, as torch tensors."""

    output: torch.Tensor  # (C,)
    query: torch.Tensor  # (L, H, N, d_k)
    key: torch.Tensor  # (L, H, N, d_k)
    norms: torch.Tensor  # (L, N)


@dataclass(frozen=True, eq=False)
class Runtime:
    """The capture's forward pass of one model at one size, on a runtime other than PyTorch."""

    name: str  # a key of RUNTIMES
    path: Path  # the exported ONNX graph
    threads: int
    run: Callable[[np.ndarray], list[np.ndarray]] = dataclasses.field(repr=False)
    # The blocks and head alone, on token sequences of any batch and length (the token-removal runs of
    # attnviz.faithfulness), and every layer's class-token row (the live camera's), each started on first use;
    # None where the model is not a plain timm ViT (or, for the rows, has no class token).
    blocks: OnFirstUse | None = dataclasses.field(default=None, repr=False)
    rows: OnFirstUse | None = dataclasses.field(default=None, repr=False)
    certified: str = ""  # the promise checked at load: the bound, the set it held on, the largest difference

    def forward(self, x: torch.Tensor) -> Outputs:
        """(1, 3, S, S) float32 → the capture's output, q, k and token norms."""
        out = self.run(np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32))
        output, query, key, norms = (torch.from_numpy(np.asarray(a)) for a in out)
        return Outputs(output, query, key, norms)

    def removal(self) -> Callable[[np.ndarray], list[np.ndarray]] | None:
        """The blocks-and-head graph, started (and checked exact) on the first call; None where it is not exact
        or this model has none: token removal then runs on PyTorch."""
        return self.blocks.start() if self.blocks is not None else None

    def class_rows(self, x: torch.Tensor) -> torch.Tensor | None:
        """(1, 3, S, S) float32 → (L, H, N): every layer's class-token row through the class-rows graph, started
        (and checked exact) on the first call; None where it is not exact or this model has none."""
        run = self.rows.start() if self.rows is not None else None
        return class_rows(run, x) if run is not None else None

    def blocks_output(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, n, D) float32 token sequences → (B, C): what ``readout(run_blocks(tokens))`` gives in PyTorch (on
        a runtime whose :meth:`removal` is not None)."""
        return blocks_output(self.removal(), tokens)

    def __repr__(self) -> str:
        return f"Runtime({self.name!r}, {self.threads} thread{'s' if self.threads != 1 else ''})"


def fast(
    model: Model, runtime: str = DEFAULT, *, threads: int | None = None, cache: str | Path | None = None,
    removal: str | None = None, rows: str | None = None,
) -> Model:
    """``model`` with its captures computed on ``runtime`` ("openvino" or "onnxruntime") where that is
    exact, else ``model`` itself with one line in the log saying why.

    Args:
        threads: CPU threads per forward pass; PyTorch's current setting by default.
        cache: where exported graphs are kept; ``$ATTNVIZ_CACHE/runtimes`` by default.
        removal: the installed runtime that runs token removal's graph (:class:`OnFirstUse`); ``runtime`` by default.
        rows: the installed runtime that runs the live camera's class-rows graph (:class:`OnFirstUse`); ``runtime``
            by default.

    Raises :class:`ModelError` (one sentence) for a runtime attnviz does not know or whose package is
    not installed.
    """
    if runtime not in RUNTIMES:
        raise ModelError(f"attnviz knows the runtimes {', '.join(sorted(RUNTIMES))}, not {runtime!r}.")
    backend = RUNTIMES[runtime]
    try:
        __import__(backend.PACKAGE)
    except ImportError as e:
        raise ModelError(f"The {runtime} runtime is not installed; install it with {INSTALL}.") from e
    base = dataclasses.replace(model, runtime=None)
    if model.adapter.layouts is not None:  # stages and windows: capture_staged's per-layer layout is not exported
        log.warning("%s stays on PyTorch: the %s runtime runs models without stages and windows only", model.name, runtime)
        return base
    if model.device.type != "cpu" or next(model.network.parameters()).dtype != torch.float32:
        log.warning("%s stays on PyTorch: the %s runtime runs float32 models on the CPU only", model.name, runtime)
        return base
    threads = torch.get_num_threads() if threads is None else threads
    start = time.perf_counter()
    try:
        path = graph.exported(model, Path(cache) if cache is not None else default_cache())
        candidate = Runtime(runtime, path, threads, backend.start(path, threads))
        why, largest = certify(base, candidate)
    except Exception as e:  # noqa: BLE001 — the exporter and the runtimes raise many kinds; PyTorch still works
        why = failed(e)
    if why is not None:
        log.warning("%s stays on PyTorch: on %s %s", model.name, runtime, why)
        return base
    from .. import interventions

    if interventions.refusal(base) is None:  # a plain timm ViT: token removal and live rows can run on the runtime too
        folder = Path(cache) if cache is not None else default_cache()
        candidate = dataclasses.replace(
            candidate, blocks=OnFirstUse(base, removal or runtime, folder, "blocks"),
            rows=OnFirstUse(base, rows or runtime, folder, "rows", threads) if base.has_class_token else None)
    candidate = dataclasses.replace(candidate, certified=(
        f"attention weights within {TOLERANCE:.0e} of PyTorch's (q, k, token norms and output within {TOLERANCE:.0e} "
        f"of their largest value) on {len(PROBES)} inputs: {', '.join(PROBES)}; largest weight difference "
        f"{largest:.1e}"))
    log.info("%s captures on %s (%s; checked in %.1f s)%s", model.name, runtime, candidate.certified,
             time.perf_counter() - start,
             f"; token removal on {removal or runtime} and live frames on {rows or runtime}, each checked on first use"
             if candidate.blocks is not None else "")
    return dataclasses.replace(model, runtime=candidate)


class OnFirstUse:
    """One more graph of the model, exported, started and checked exact against PyTorch the first time it is
    asked for, so that a server pays its memory only once a visitor needs it:

    - ``"blocks"``: the blocks and head alone, on token sequences of any batch and length — the token-removal runs
      of :mod:`attnviz.faithfulness`; it holds 0.27 GB (ONNX Runtime) to 0.48 GB (OpenVINO) once it has run its
      batches. It runs one thread per call, and :func:`attnviz.faithfulness.outputs` makes as many calls at once
      as there are cores (on 2 cores two 1-thread calls beat one 2-thread call).
    - ``"rows"``: every layer's class-token attention row — all the live camera draws — without every token's q
      and k as outputs (a tenth less time per frame than the capture's graph, docs/live-camera.md).
    """

    FALLBACK = {"blocks": "removes tokens on PyTorch", "rows": "draws live frames from the whole capture"}

    def __init__(self, model: Model, name: str, cache: Path, kind: str, threads: int = 1) -> None:
        self.runtime, self.kind = name, kind  # a key of RUNTIMES, and of graph.GRAPHS
        self._model, self._cache, self._threads = model, cache, threads
        self._lock = threading.Lock()
        self._run: Callable[[np.ndarray], list[np.ndarray]] | None = None
        self._why: str | None = None

    def start(self) -> Callable[[np.ndarray], list[np.ndarray]] | None:
        """The graph's function where it equals PyTorch on the certification set (:func:`probes`), else None (with
        one line in the log, once)."""
        with self._lock:
            if self._run is None and self._why is None:
                check = blocks_mismatch if self.kind == "blocks" else rows_mismatch
                try:
                    path = graph.exported(self._model, self._cache, self.kind)
                    run = RUNTIMES[self.runtime].start(path, self._threads, batches=self.kind == "blocks")
                    self._why = check(self._model, run)
                except Exception as e:  # noqa: BLE001 — as in fast(): PyTorch (or the capture) still does it
                    self._why = failed(e)
                if self._why is None:
                    self._run = run
                else:
                    log.warning("%s %s: on %s %s", self._model.name, self.FALLBACK[self.kind], self.runtime, self._why)
            return self._run


def first_output(run: Callable[[np.ndarray], list[np.ndarray]], x: torch.Tensor) -> torch.Tensor:
    """A graph's function ``run`` on ``x`` (float32, contiguous), its first output as a tensor."""
    return torch.from_numpy(np.asarray(run(np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32))[0]))


def class_rows(run: Callable[[np.ndarray], list[np.ndarray]], x: torch.Tensor) -> torch.Tensor:
    """(1, 3, S, S) float32 → (L, H, N) through the class-rows graph's function ``run``."""
    return first_output(run, x)


@torch.inference_mode()
def rows_mismatch(model: Model, run: Callable[[np.ndarray], list[np.ndarray]]) -> str | None:
    """Why the class-rows graph's function ``run`` is not the PyTorch capture's class-token rows on the
    certification set (each weight within ``TOLERANCE``), or None when it is."""
    for name, x in probes(model).items():  # the capture's certification set
        reference = capture_tensor(model, x)
        got = class_rows(run, x)
        if got.shape != (reference.num_layers, reference.num_heads, reference.num_tokens):
            return f"the class-token rows differ in shape: {tuple(got.shape)}"
        for layer in range(reference.num_layers):
            off = float((reference.layer_rows(layer, 0) - got[layer]).abs().max())
            if not off <= TOLERANCE:
                return (f"on {name}: layer {layer}'s class-token row differs from PyTorch's by {off:.1e} "
                        f"(allowed {TOLERANCE:.0e})")
    return None


def blocks_output(run: Callable[[np.ndarray], list[np.ndarray]], tokens: torch.Tensor) -> torch.Tensor:
    """(B, n, D) float32 token sequences → (B, C) through the blocks-and-head graph's function ``run``."""
    return first_output(run, tokens)


@torch.inference_mode()
def blocks_mismatch(model: Model, run: Callable[[np.ndarray], list[np.ndarray]]) -> str | None:
    """Why the blocks-and-head graph's function ``run`` is not PyTorch's blocks and head on the certification set
    (:func:`probes`), naming the input, or None when it is: on each, the whole sequence and a batch of two
    sequences that keep the prefix and every other patch (another length)."""
    from .. import interventions

    network, prefix = model.network, model.num_prefix_tokens
    for name, x in probes(model).items():  # the capture's certification set, not one easy photo
        tokens = interventions.embed(network, x)  # (1, N, D)
        half = (tokens.shape[1] - prefix) // 2
        kept = torch.stack([torch.arange(0, 2 * half, 2), torch.arange(1, 2 * half, 2)])  # (2, half): even, odd
        for t in (tokens, interventions.keep_tokens(tokens.expand(2, -1, -1), prefix, kept)):
            reference = interventions.readout(network, interventions.run_blocks(network, t))
            why = differs(f"on {name}: the blocks' output on {t.shape[1]} tokens differs", reference, blocks_output(run, t))
            if why is not None:
                return why
    return None


def differs(what: str, reference: torch.Tensor, got: torch.Tensor) -> str | None:
    """``what`` (e.g. "layer 0's queries differ") and by how much, when ``got`` is not ``reference`` in shape or
    within ``TOLERANCE`` of its largest magnitude (at least 1); None when it is."""
    if got.shape != reference.shape:
        return f"{what} in shape: {tuple(got.shape)}, not {tuple(reference.shape)}"
    off = float((reference.double() - got.double()).abs().max())
    scale = max(float(reference.abs().max()), 1.0)
    if not off <= TOLERANCE * scale:  # also refuses NaN
        return f"{what} from PyTorch's by {off:.1e} (allowed {TOLERANCE * scale:.1e})"
    return None


def failed(error: Exception) -> str:
    """Why a graph is not used, when exporting or running it raised: the error's kind and first line."""
    first = str(error).splitlines()[0][:160] if str(error) else ""
    return f"it could not be exported or run ({type(error).__name__}: {first})"


def installed() -> tuple[str, ...]:
    """The runtimes whose package is installed, in :data:`PREFERENCE` order."""
    return tuple(name for name in PREFERENCE if importlib.util.find_spec(RUNTIMES[name].PACKAGE) is not None)


def on_runtime(model: Model, wanted: str = "auto", *, threads: int | None = None,
               cache: str | Path | None = None) -> Model:
    """``model`` on the runtime a server's owner asked for (``ATTNVIZ_RUNTIME``): ``"pytorch"`` leaves it as it
    is; a name of :data:`RUNTIMES` is :func:`fast`; ``"auto"`` is :func:`fast` on the first installed runtime,
    or PyTorch when none is (the extra is optional). Never raises: a runtime that is not installed, or not
    exact for this model, leaves the model on PyTorch with one line in the log."""
    if wanted == "pytorch":
        return model
    if wanted not in ("auto", *RUNTIMES):
        raise ValueError(f"the runtime must be auto, pytorch or one of {', '.join(sorted(RUNTIMES))}, not {wanted!r}")
    names = installed() if wanted == "auto" else (wanted,)
    if not names:
        return model
    if names[0] not in installed():
        log.warning("%s stays on PyTorch: the %s runtime is not installed (%s)", model.name, names[0], INSTALL)
        return model
    # auto: token removal and live frames each on the installed runtime fastest at it (bench.faithfulness,
    # bench.runtimes --live), their graphs started on first use
    def fastest(preference: tuple[str, ...]) -> str | None:
        return next((name for name in preference if name in installed()), None) if wanted == "auto" else None

    return fast(model, names[0], threads=threads, cache=cache, removal=fastest(REMOVAL_PREFERENCE),
                rows=fastest(ROWS_PREFERENCE))


def default_cache() -> Path:
    """Where exported graphs are kept: ``$ATTNVIZ_CACHE/runtimes`` (``~/.cache/attnviz/runtimes``)."""
    return offline.cache_dir() / "runtimes"


def probe(model: Model) -> torch.Tensor:
    """The probe input: the sample photo ``cat.jpg`` as ``model`` sees it, (1, 3, S, S)."""
    with resources.files("attnviz").joinpath("assets", "cat.jpg").open("rb") as f:
        photo = Image.open(f).convert("RGB")
    return model.to_input(model.view(photo))


PHOTOS = ("cat.jpg", "astronaut.jpg", "coffee.jpg", "rocket.jpg")
PROBES = (*PHOTOS, "noise", "black", "white", "checkerboard")


def probes(model: Model) -> dict[str, torch.Tensor]:
    """The certification set, each (1, 3, S, S) as ``model`` sees it: the four sample photos, uniform noise
    over the whole pixel range (seeded), and the extremes of the input range — all black, all white, and
    black and white patches alternating (the largest difference between neighbouring tokens)."""
    pictures = {}
    for name in PHOTOS:
        with resources.files("attnviz").joinpath("assets", name).open("rb") as f:
            pictures[name] = model.view(Image.open(f).convert("RGB"))
    s, patch = model.size, model.patch
    noise = np.random.default_rng(0).integers(0, 256, (s, s, 3), dtype=np.uint8)
    y, x = np.mgrid[0:s, 0:s]
    board = (((y // patch) + (x // patch)) % 2 * 255).astype(np.uint8)  # (S, S)
    pictures |= {"noise": Image.fromarray(noise), "black": Image.new("RGB", (s, s)),
                 "white": Image.new("RGB", (s, s), (255, 255, 255)),
                 "checkerboard": Image.fromarray(np.stack([board] * 3, axis=-1))}
    return {name: model.to_input(picture) for name, picture in pictures.items()}


def certify(model: Model, runtime: Runtime) -> tuple[str | None, float]:
    """Why ``runtime`` is not exact for ``model`` on one input of :func:`probes` (naming it), or None; and the
    largest attention-weight difference found over the whole set."""
    largest = 0.0
    for name, x in probes(model).items():
        why, off = compare(model, runtime, x)
        if why is not None:
            return f"on {name}: {why}", max(largest, off)
        largest = max(largest, off)
    return None, largest


def mismatch(model: Model, runtime: Runtime, x: torch.Tensor | None = None) -> str | None:
    """Why ``runtime`` is not exact for ``model`` on input ``x`` (the probe by default), or None when it is.

    Exact means: every layer's q and k, token norms and the output within ``TOLERANCE`` × that tensor's
    largest magnitude of PyTorch's, and every attention weight within ``TOLERANCE``. (float32 PyTorch is
    itself ~2e-5 from a float64 computation on q and k of magnitude ~40, so an absolute 1e-5 on q and k
    would refuse a runtime for differences below PyTorch's own rounding; the weights, which the page
    shows, are held to an absolute 1e-5.)
    """
    return compare(model, runtime, x)[0]


def compare(model: Model, runtime: Runtime, x: torch.Tensor | None = None) -> tuple[str | None, float]:
    """:func:`mismatch`'s reason (or None), and the largest attention-weight difference it saw (0 when it
    stopped before the weights)."""
    x = probe(model) if x is None else x
    reference = capture_tensor(model, x)
    got = runtime.forward(x)
    fast_cap = capture_tensor(dataclasses.replace(model, runtime=runtime), x)
    pairs = [(f"layer {i}'s {what} differ", mine, getattr(got, out)[i])
             for i in range(reference.num_layers)
             for what, mine, out in (("queries", reference.query[i][:, 0], "query"),  # (H, N, d_k): one window
                                     ("keys", reference.key[i][:, 0], "key"),
                                     ("token norms", reference.token_norms[i], "norms"))]
    pairs.append(("the output differs", reference.output[None], got.output[None]))
    for what, ref, val in pairs:
        why = differs(what, ref, val)
        if why is not None:
            return why, 0.0
    largest = 0.0
    for layer in range(reference.num_layers):
        off = float((reference.layer_weights(layer) - fast_cap.layer_weights(layer)).abs().max())
        if not off <= TOLERANCE:
            return f"layer {layer}'s attention weights differ from PyTorch's by {off:.1e} (allowed {TOLERANCE:.0e})", off
        largest = max(largest, off)
    return None, largest
