"""Capture every layer's and head's attention in one forward pass, at the cost of a plain forward.

The attention weights of layer l are A = softmax(Q Kᵀ / √d_k + B) (Vaswani et al. 2017), with B a
relative-position bias in the models that have one (zero otherwise). Rather than materialising all
L × H × N × N weights (540 MB at 518 px), we keep what they are made of — each layer's queries and
keys, O(L · N · D) — read through the model family's adapter (:mod:`attnviz.adapters`) while the
model runs its normal fused forward. The adapter makes q and k exactly the ones that enter the
softmax (after q_norm / k_norm and, for RoPE models, after the rotation). Any row or matrix is then
recomputed on demand: softmax((q · scale) @ kᵀ + B), with the precision explained at
``_softmax_scores``.

Alongside, each token's L2 norm after every layer is kept, O(L · N): Darcet et al. 2024 ("Vision
Transformers Need Registers") show that some models repurpose a few background patches as
high-norm tokens that soak up attention; :meth:`Capture.high_norm` says whether this capture has any.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from PIL import Image

from .adapters import Recorder
from .errors import ImageError, NoClassTokenError
from .images import as_rgb
from .models import FITS, Fit, Model
from .preparation import Preparation, preparation
from .softmax import Head, fuse_heads, patch_grid, softmax_scores, whole
from .stages import StagedCapture, capture_staged

_softmax_scores, _whole = softmax_scores, whole  # the names this module used before #22

# A patch token is "high-norm" when its norm after a layer exceeds this multiple of that layer's median
# patch-token norm. Darcet et al. 2024 (Fig. 3) find such tokens an order of magnitude above the rest
# (a bimodal histogram); on the sample photos no patch of the offline ViT-S/14 reaches 2× the median
# at 196 px (largest 1.91×, astronaut.jpg, layer 11). 3× sits clear of both.
HIGH_NORM_RATIO = 3.0
Summary = Literal["cls", "mean_received"]


@dataclass(frozen=True, eq=False)
class Capture:
    """One image's attention, every layer and head. Layers, heads and tokens are 0-based.

    ``query`` and ``key`` are (L, H, N, d_k): per head, exactly the vectors that entered
    softmax(Q Kᵀ · scale + bias) — after timm's ``q_norm`` / ``k_norm`` and, for RoPE models, after
    the rotation. ``bias`` is the additive logit bias of relative-position models, (L, H, N, N),
    shared by every capture of the same model; ``None`` when the model has none.
    """

    query: torch.Tensor  # (L, H, N, d_k)
    key: torch.Tensor  # (L, H, N, d_k)
    scale: float  # 1 / √d_k
    grid: tuple[int, int]  # (h, w) patches
    num_prefix_tokens: int
    input: torch.Tensor  # (1, 3, S, S): the exact tensor the model received
    output: torch.Tensor  # (C,): logits for a classifier, pooled features otherwise
    seconds: float  # wall time of the forward pass with capture
    bias: torch.Tensor | None = None  # (L, H, N, N) additive logit bias, or None
    has_class_token: bool = True  # whether token 0 is a class token
    token_norms: torch.Tensor | None = None  # (L, N): ‖x_i‖ of every token after every layer
    prepared: Preparation | None = None  # model name and how the photo became ``input``

    @property
    def num_layers(self) -> int:
        return self.query.shape[0]

    @property
    def num_heads(self) -> int:
        return self.query.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.query.shape[2]

    @property
    def nbytes(self) -> int:
        """Memory held by this capture's own tensors (a relative-position bias is the model's, shared)."""
        own = [self.query, self.key, self.input, self.output]
        if self.token_norms is not None:
            own.append(self.token_norms)
        return sum(t.element_size() * t.nelement() for t in own)

    def _check(self, layer: int, query: int | None = None) -> None:
        layer = _whole(layer, "layer")
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0…{self.num_layers - 1}")
        if query is not None:
            query = _whole(query, "query token")
            if not 0 <= query < self.num_tokens:
                raise IndexError(f"query token {query} is outside 0…{self.num_tokens - 1}")

    def _bias(self, layer: int, rows: slice = slice(None)) -> torch.Tensor | None:
        return None if self.bias is None else self.bias[layer][:, rows]  # (H, M, N)

    def layer_weights(self, layer: int) -> torch.Tensor:
        """All heads of one layer: softmax(Q Kᵀ · scale + bias), (H, N, N) float32 tensor."""
        self._check(layer)
        return _softmax_scores(self.query[layer], self.key[layer], self.scale, self._bias(layer))  # (H, N, N)

    def layer_rows(self, layer: int, query: int = 0) -> torch.Tensor:
        """One query token's attention row in every head: (H, N). Costs O(H · N · d_k)."""
        self._check(layer, query)
        rows = slice(query, query + 1)
        q = self.query[layer, :, rows]  # (H, 1, d_k)
        return _softmax_scores(q, self.key[layer], self.scale, self._bias(layer, rows))[:, 0]  # (H, N)

    def weights(self, layer: int, head: Head) -> np.ndarray:
        """The (N, N) attention matrix of one head, or its mean / max / min over heads."""
        return fuse_heads(self.layer_weights(layer), head).cpu().numpy()

    def row(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        """(N,) attention of token ``query`` over all keys; sums to 1 for a single head.

        Token 0 is the class token only when ``has_class_token``; otherwise it is a register or the
        first patch (see :meth:`cls_map`)."""
        return fuse_heads(self.layer_rows(layer, query), head).cpu().numpy()

    def query_map(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        """(h, w): token ``query``'s attention to the patch tokens, laid on the patch grid."""
        return patch_grid(self.row(layer, head, query), self.grid, self.num_prefix_tokens)

    def cls_map(self, layer: int, head: Head) -> np.ndarray:
        """(h, w): the class token's attention to the patches (prefix tokens left out).

        Raises :class:`NoClassTokenError` for a model without a class token, rather than show
        token 0's row as if it were one; :meth:`summary_map` picks a stated alternative.
        """
        if not self.has_class_token:
            raise NoClassTokenError(
                "this model has no class token, so there is no class-token row; use mean_received_map() "
                "(the attention each patch receives, averaged over all patch queries) or query_map() for one patch"
            )
        return self.query_map(layer, head, 0)

    def mean_received_map(self, layer: int, head: Head) -> np.ndarray:
        """(h, w): the attention each patch receives, averaged over all patch queries.

        (1 / P) Σ_q A[q, patches] over the P patch query tokens: a summary that needs no class token.
        """
        p = self.num_prefix_tokens
        received = fuse_heads(self.layer_weights(layer), head)[p:].mean(0)  # (N,): mean over patch query rows
        return patch_grid(received.cpu().numpy(), self.grid, p)

    @property
    def summary(self) -> Summary:
        """What :meth:`summary_map` shows: ``"cls"`` (the class token's row) or ``"mean_received"``."""
        return "cls" if self.has_class_token else "mean_received"

    def summary_map(self, layer: int, head: Head) -> np.ndarray:
        """(h, w): the one-picture summary of a layer — the class token's row when the model has a
        class token, else the mean attention each patch receives; :attr:`summary` says which."""
        return self.cls_map(layer, head) if self.has_class_token else self.mean_received_map(layer, head)

    def all_weights(self) -> np.ndarray:
        """(L, H, N, N) float32: every weight. Large: 540 MB at 518 px for ViT-S."""
        return np.stack([self.layer_weights(i).cpu().numpy() for i in range(self.num_layers)])

    def __repr__(self) -> str:
        model = f"{self.prepared.model}, " if self.prepared is not None else ""
        h, w = self.grid
        return (f"Capture({model}{self.num_layers} layers × {self.num_heads} heads, N = {self.num_tokens} "
                f"({self.num_prefix_tokens} prefix + {h}×{w} patches), d_k = {self.query.shape[-1]}, "
                f"{self.nbytes / 2**20:.1f} MB)")

    # ---- token norms (Darcet et al. 2024) ----

    def norm_ratio(self, layer: int) -> np.ndarray:
        """(h, w): each patch token's norm after ``layer`` divided by that layer's median patch norm."""
        self._check(layer)
        if self.token_norms is None:
            raise ValueError("this capture has no token norms (it was made before attnviz recorded them)")
        norms = self.token_norms[layer, self.num_prefix_tokens :].double()  # (P,)
        return patch_grid((norms / norms.median()).cpu().numpy(), self.grid, 0)

    def high_norm(self, layer: int, ratio: float = HIGH_NORM_RATIO) -> np.ndarray:
        """(h, w) bool: patches whose norm after ``layer`` exceeds ``ratio`` × the median patch norm."""
        return self.norm_ratio(layer) > ratio

    def high_norm_layers(self, ratio: float = HIGH_NORM_RATIO) -> list[int]:
        """The layers (0-based) after which at least one patch token is high-norm."""
        if self.token_norms is None:
            return []
        return [layer for layer in range(self.num_layers) if self.high_norm(layer, ratio).any()]


def _check_input(model: Model, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"capture_tensor() takes a (1, 3, S, S) torch tensor, not {type(x).__name__}")
    s = model.size
    channels = len(model.data_config["mean"])  # the colour channels the model normalises (3: RGB)
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(
            f"capture_tensor() takes a (1, {channels}, {s}, {s}) tensor, not one of shape {tuple(x.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"capture_tensor() takes one image, not a batch of {x.shape[0]}: capture each image on its own")
    if tuple(x.shape[-2:]) != (s, s):
        raise ValueError(
            f"the input is {x.shape[-2]} × {x.shape[-1]} px but {model.name} is set up for {s} × {s} px; "
            f"load the model with size={x.shape[-1]} or prepare the photo with model.to_input(model.view(image))"
        )
    if not x.is_floating_point():
        raise TypeError(f"capture_tensor() takes a floating-point tensor, not {x.dtype}")
    weights = next(model.network.parameters()).dtype
    if x.dtype != weights:  # else a conv error 17 frames deep
        raise TypeError(f"the input is {x.dtype} but {model.name}'s weights are {weights}: pass x.to({weights})")
    if x.device.type != model.device.type:
        raise ValueError(f"the input is on {x.device} but the model is on {model.device}")
    if not (torch.isfinite(x.amax()) and torch.isfinite(x.amin())):  # NaN propagates; NaN maps otherwise
        raise ImageError("the input holds values that are not numbers (NaN or infinite), so it cannot be shown "
                         "to the model.", "not_finite", name="the input")


@torch.inference_mode()
def capture_tensor(model: Model, x: torch.Tensor,
                   between_layers: Callable[[], None] | None = None) -> Capture | StagedCapture:
    """Run ``model`` once on the (1, 3, S, S) tensor ``x`` and keep every layer's queries and keys
    (a :class:`~attnviz.stages.StagedCapture` for a model with stages and windows, such as Swin).

    ``between_layers()`` is called after each block on this thread: a pause point, where a live-camera
    frame waits while a visitor's photo is captured (:meth:`attnviz.live_sharing.Priority.give_way`)."""
    _check_input(model, x)
    adapter = model.adapter
    if adapter.layouts is not None:  # stages and windows (Swin): per-layer grids, attention inside windows
        return dataclasses.replace(capture_staged(model, x, between_layers), prepared=preparation(model, None))
    if model.runtime is not None:  # checked exact for this model when attnviz.fast() switched it on
        start = time.perf_counter()
        output, query, key, norms = model.runtime.forward(x)
        return Capture(query=query, key=key, scale=adapter.scale, grid=model.grid,
                       num_prefix_tokens=model.num_prefix_tokens, input=x, output=output,
                       seconds=time.perf_counter() - start, bias=adapter.bias,
                       has_class_token=adapter.has_class_token, token_norms=norms, prepared=preparation(model, None))
    shape = (adapter.depth, adapter.num_heads, model.num_tokens, adapter.head_dim)  # (L, H, N, d_k)
    recorder = Recorder(
        query=torch.empty(shape, device=x.device, dtype=x.dtype),
        key=torch.empty(shape, device=x.device, dtype=x.dtype),
        norms=torch.empty((adapter.depth, model.num_tokens), device=x.device, dtype=x.dtype),  # (L, N)
        between_layers=between_layers,
    )
    start = time.perf_counter()
    with model.tap.recording(recorder):  # the hooks installed at wrap time write into this capture only
        output = adapter.forward(model.network, x)
    seconds = time.perf_counter() - start
    adapter.finish(recorder)  # e.g. rotate q and k by RoPE, as the model did inside its attention
    if len(recorder.seen) != 3 * adapter.depth:
        raise RuntimeError("the forward pass did not reach every attention layer")
    return Capture(
        query=recorder.query,
        key=recorder.key,
        scale=adapter.scale,
        grid=model.grid,
        num_prefix_tokens=model.num_prefix_tokens,
        input=x,
        output=output,
        seconds=seconds,
        bias=adapter.bias,
        has_class_token=adapter.has_class_token,
        token_norms=recorder.norms,
        prepared=preparation(model, None),
    )


def capture(model: Model, image: Image.Image, fit: Fit = "crop") -> Capture | StagedCapture:
    """Preprocess ``image`` as ``model`` expects and capture its attention (see :class:`Capture`).

    Any PIL image is first made the upright RGB picture the page and the CLI make of the same pixels
    (:func:`attnviz.images.as_rgb`), so ``capture(model, Image.open(path))`` feeds the model what
    ``capture(model, load_photo(path, model).image)`` does for any picture that is not shrunk on decoding.
    """
    if isinstance(image, (str, Path)):
        raise TypeError(f"capture() takes a PIL image, not the path {str(image)!r}: open it first, capture(model, Image.open(path))")
    if not isinstance(image, Image.Image):
        hint = " (for an array use Image.fromarray(array); for a tensor use capture_tensor)" if hasattr(image, "shape") else ""
        raise TypeError(f"capture() takes a PIL image, not {type(image).__name__}{hint}")
    if fit not in FITS:
        raise ValueError(f"fit must be one of {FITS}, not {fit!r}")
    image = as_rgb(image)  # the picture read_photo makes of the same pixels (16-bit, float, alpha, EXIF)
    cap = capture_tensor(model, model.to_input(model.view(image, fit)))
    return dataclasses.replace(cap, prepared=preparation(model, fit))
