"""Capture every layer's and head's attention in one forward pass, at the cost of a plain forward.

The attention weights of layer l are A = softmax(Q Kᵀ / √d_k) (Vaswani et al. 2017). Rather than
materialising all L × H × N × N weights (540 MB at 518 px), we keep what they are made of — each
layer's queries and keys, O(L · N · D) — by hooking the ``q_norm`` / ``k_norm`` modules that timm's
``Attention`` calls on both its fused (SDPA) and eager paths. Any row or matrix is then recomputed
on demand: softmax((q · scale) @ kᵀ), with the precision explained at ``_softmax_scores``.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Literal, Union

import numpy as np
import torch
from PIL import Image

from .models import Fit, Model
from .preparation import Preparation, preparation

Head = Union[int, Literal["mean", "max", "min"]]
HEAD_FUSIONS = ("mean", "max", "min")


@dataclass(frozen=True, eq=False)
class Capture:
    """One image's attention, every layer and head. Layers and heads are 0-based.

    ``query`` and ``key`` are (L, H, N, d_k): the per-head vectors after timm's ``q_norm`` /
    ``k_norm``, i.e. exactly what entered softmax(Q Kᵀ · scale).
    """

    query: torch.Tensor  # (L, H, N, d_k)
    key: torch.Tensor  # (L, H, N, d_k)
    scale: float  # 1 / √d_k
    grid: tuple[int, int]  # (h, w) patches
    num_prefix_tokens: int
    input: torch.Tensor  # (1, 3, S, S): the exact tensor the model received
    output: torch.Tensor  # (C,): logits for a classifier, pooled features otherwise
    seconds: float  # wall time of the forward pass with capture
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
        """Memory held by this capture's tensors."""
        return sum(t.element_size() * t.nelement() for t in (self.query, self.key, self.input, self.output))

    def _check(self, layer: int, query: int | None = None) -> None:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0…{self.num_layers - 1}")
        if query is not None and not 0 <= query < self.num_tokens:
            raise IndexError(f"query token {query} is outside 0…{self.num_tokens - 1}")

    def layer_weights(self, layer: int) -> torch.Tensor:
        """All heads of one layer: softmax(Q Kᵀ · scale), (H, N, N) float32 tensor."""
        self._check(layer)
        return _softmax_scores(self.query[layer], self.key[layer], self.scale)  # (H, N, N)

    def layer_rows(self, layer: int, query: int = 0) -> torch.Tensor:
        """One query token's attention row in every head: (H, N). Costs O(H · N · d_k)."""
        self._check(layer, query)
        q = self.query[layer, :, query : query + 1]  # (H, 1, d_k)
        return _softmax_scores(q, self.key[layer], self.scale)[:, 0]  # (H, N)

    def weights(self, layer: int, head: Head) -> np.ndarray:
        """The (N, N) attention matrix of one head, or its mean / max / min over heads."""
        return fuse_heads(self.layer_weights(layer), head).cpu().numpy()

    def row(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        """(N,) attention of token ``query`` (0 = CLS) over all keys; sums to 1 for a single head."""
        return fuse_heads(self.layer_rows(layer, query), head).cpu().numpy()

    def query_map(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        """(h, w): token ``query``'s attention to the patch tokens, laid on the patch grid."""
        return patch_grid(self.row(layer, head, query), self.grid, self.num_prefix_tokens)

    def cls_map(self, layer: int, head: Head) -> np.ndarray:
        """(h, w): the class token's attention to the patches (prefix tokens left out)."""
        return self.query_map(layer, head, 0)

    def all_weights(self) -> np.ndarray:
        """(L, H, N, N) float32: every weight. Large: 540 MB at 518 px for ViT-S."""
        return np.stack([self.layer_weights(i).cpu().numpy() for i in range(self.num_layers)])

    def __repr__(self) -> str:
        model = f"{self.prepared.model}, " if self.prepared is not None else ""
        h, w = self.grid
        return (f"Capture({model}{self.num_layers} layers × {self.num_heads} heads, N = {self.num_tokens} "
                f"({self.num_prefix_tokens} prefix + {h}×{w} patches), d_k = {self.query.shape[-1]}, "
                f"{self.nbytes / 2**20:.1f} MB)")

    def _repr_html_(self) -> str:
        """Jupyter shows a capture as the interactive page :func:`attnviz.show` gives."""
        from .html import notebook_html

        return notebook_html(self)


def _softmax_scores(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q · kᵀ · scale) over the last axis: (H, M, d_k), (H, N, d_k) → (H, M, N), in q's dtype.

    The logits reach ~300 in this model, where float32 dot products are off by ~1e-5 and softmax
    passes that error on. So the dot products are taken in float64 and the row maximum subtracted
    there; the (now small) logits then go through softmax in the input's precision. Against a
    float64 recomputation this is within ~2e-6, at about twice the cost of plain float32.
    """
    scores = (query.double() * scale) @ key.double().transpose(-2, -1)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    return scores.to(query.dtype).softmax(dim=-1)


def fuse_heads(weights: torch.Tensor, head: Head) -> torch.Tensor:
    """Pick head ``head`` from a (H, ...) tensor, or reduce over heads with mean / max / min."""
    if head == "mean":
        return weights.mean(0)
    if head == "max":
        return weights.amax(0)
    if head == "min":
        return weights.amin(0)
    if isinstance(head, (int, np.integer)) and 0 <= head < weights.shape[0]:
        return weights[int(head)]
    raise ValueError(f"head must be 0…{weights.shape[0] - 1} or one of {HEAD_FUSIONS}, not {head!r}")


def patch_grid(row: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int) -> np.ndarray:
    """(N,) row over all tokens → (h, w) over the patch tokens, in raster order."""
    h, w = grid
    patches = row[num_prefix_tokens:]
    if patches.shape[0] != h * w:
        raise ValueError(f"{patches.shape[0]} patch tokens do not fill a {h} × {w} grid")
    return patches.reshape(h, w)


def _attention_modules(network: torch.nn.Module) -> list[torch.nn.Module]:
    blocks = getattr(network, "blocks", None)
    attns = [getattr(b, "attn", None) for b in blocks] if blocks is not None else []
    if not attns or not all(hasattr(a, "q_norm") and hasattr(a, "k_norm") for a in attns):
        raise TypeError(f"{type(network).__name__} has no timm ViT attention blocks to capture")
    return attns


@torch.inference_mode()
def capture_tensor(model: Model, x: torch.Tensor) -> Capture:
    """Run ``model`` once on the (1, 3, S, S) tensor ``x`` and keep every layer's queries and keys."""
    attns = _attention_modules(model.network)
    owner = threading.get_ident()
    shape = (len(attns), attns[0].num_heads, model.num_tokens, attns[0].head_dim)  # (L, H, N, d_k)
    query = torch.empty(shape, device=x.device, dtype=x.dtype)
    key = torch.empty(shape, device=x.device, dtype=x.dtype)
    seen: set[tuple[str, int]] = set()

    def keep(store: torch.Tensor, name: str, layer: int):
        def hook(_module, _inputs, output: torch.Tensor) -> None:
            # The model object is shared by every browser session; only record our own thread's pass.
            if threading.get_ident() == owner:
                store[layer].copy_(output[0])  # (H, N, d_k), copied out of the fused qkv buffer
                seen.add((name, layer))
        return hook

    handles = []
    try:
        for i, attn in enumerate(attns):
            handles.append(attn.q_norm.register_forward_hook(keep(query, "q", i)))
            handles.append(attn.k_norm.register_forward_hook(keep(key, "k", i)))
        start = time.perf_counter()
        output = model.network(x)
        seconds = time.perf_counter() - start
    finally:
        for h in handles:
            h.remove()
    if len(seen) != 2 * len(attns):
        raise RuntimeError("the forward pass did not reach every attention layer")
    return Capture(
        query=query,
        key=key,
        scale=float(attns[0].scale),
        grid=model.grid,
        num_prefix_tokens=model.num_prefix_tokens,
        input=x,
        output=output[0],
        seconds=seconds,
        prepared=preparation(model, None),
    )


def capture(model: Model, image: Image.Image, fit: Fit = "crop") -> Capture:
    """Preprocess ``image`` as ``model`` expects and capture its attention (see :class:`Capture`)."""
    cap = capture_tensor(model, model.to_input(model.view(image, fit)))
    return dataclasses.replace(cap, prepared=preparation(model, fit))
