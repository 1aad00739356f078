"""Captures of hierarchical, windowed models (Swin and its kind): a different token grid per stage,
attention inside windows.

Layer ``l`` of such a model is block ``b`` of stage ``s`` (:class:`LayerLayout`): its tokens are the
cells of that stage's grid (each ``patch`` pixels of the photo), cut into windows of T tokens; the
window partition after the shift is ``windows`` (W, T), the raster index of every window row. Inside
window w the weights are exactly softmax(q · kᵀ · scale + bias[w]), with the relative-position bias
and the shifted-window mask in ``bias``; between windows they are zero, so over the whole image a
layer's matrix is block-diagonal (Liu et al. 2021, "Swin Transformer", Fig. 2).

A :class:`StagedCapture` keeps each layer's q and k per window, O(L · N · d), and answers what a
:class:`~attnviz.capture.Capture` answers, per layer at that layer's grid: the whole-image matrix, a
query token's row, a query's map (zero outside its window), and — as these models have no class
token — the summary map, the mean attention each patch receives from the queries of its window.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .adapters.tap import Recorder
from .errors import NoClassTokenError
from .softmax import Head, fuse_heads, softmax_scores, whole


@dataclass(frozen=True, eq=False)
class LayerLayout:
    """Where layer ``l``'s tokens are, and which of them attend to each other."""

    stage: int  # 0-based
    block: int  # 0-based, within the stage
    grid: tuple[int, int]  # (h, w) tokens at this stage
    patch: int  # pixels of the photo per token side at this stage
    window: tuple[int, int]  # (wh, ww) tokens per window side
    shift: tuple[int, int]  # the cyclic shift before partitioning (0, 0 for unshifted windows)
    num_heads: int
    head_dim: int
    scale: float
    windows: torch.Tensor = field(repr=False)  # (W, T) long: raster index of window w's row t

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_windows(self) -> int:
        return self.windows.shape[0]

    def window_of(self, token: int) -> tuple[int, int]:
        """(window, row in it) of raster token ``token``."""
        w, t = divmod(int((self.windows.reshape(-1) == token).nonzero()[0]), self.windows.shape[1])
        return w, t


def window_partition_index(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """(W, T): the raster index of each window row after the cyclic shift ``torch.roll(x, -shift)``,
    windows in row-major order, rows in row-major order inside a window (Swin's ``window_partition``)."""
    (h, w), (wh, ww) = grid, window
    index = torch.arange(h * w).reshape(h, w).roll(shifts=(-shift[0], -shift[1]), dims=(0, 1))
    return index.reshape(h // wh, wh, w // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)


@dataclass(frozen=True, eq=False)
class StagedCapture:
    """One image's attention in a windowed, hierarchical model, every layer and head (0-based)."""

    query: tuple[torch.Tensor, ...]  # per layer (H_l, W_l, T_l, d_k)
    key: tuple[torch.Tensor, ...]  # per layer (H_l, W_l, T_l, d_k)
    bias: tuple[torch.Tensor | None, ...]  # per layer (W_l, H_l, T_l, T_l): position bias + shift mask
    layouts: tuple[LayerLayout, ...]
    input: torch.Tensor  # (1, 3, S, S)
    output: torch.Tensor  # (C,)
    seconds: float
    token_norms: tuple[torch.Tensor, ...] = ()  # per layer (N_l,)
    prepared: object | None = None
    num_prefix_tokens: int = 0
    has_class_token: bool = False
    summary: str = "mean_received"

    @property
    def num_layers(self) -> int:
        return len(self.layouts)

    def layout(self, layer: int) -> LayerLayout:
        layer = whole(layer, "layer")
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} is outside 0…{self.num_layers - 1}")
        return self.layouts[layer]

    def grid(self, layer: int) -> tuple[int, int]:
        return self.layout(layer).grid

    def num_heads(self, layer: int) -> int:
        return self.layout(layer).num_heads

    @property
    def stages(self) -> tuple[tuple[int, ...], ...]:
        """The layers of each stage: ``stages[s]`` lists the layer indices of its blocks, in order."""
        out: dict[int, list[int]] = {}
        for layer, lay in enumerate(self.layouts):
            out.setdefault(lay.stage, []).append(layer)
        return tuple(tuple(v) for _, v in sorted(out.items()))

    def layer_of(self, stage: int, block: int) -> int:
        return self.stages[stage][block]

    @property
    def nbytes(self) -> int:
        own = [*self.query, *self.key, self.input, self.output, *self.token_norms]
        return sum(t.element_size() * t.nelement() for t in own)

    def window_weights(self, layer: int) -> torch.Tensor:
        """(W, H, T, T): every window's weights, as the model computes them."""
        lay = self.layout(layer)
        q, k = self.query[layer], self.key[layer]  # (H, W, T, d_k)
        bias = self.bias[layer]
        scores = softmax_scores(q, k, lay.scale, None if bias is None else bias.transpose(0, 1))  # (H, W, T, T)
        return scores.transpose(0, 1)

    def layer_weights(self, layer: int) -> torch.Tensor:
        """(H, N, N) over the whole image: each window's block, zero between windows."""
        lay = self.layout(layer)
        ww = self.window_weights(layer)  # (W, H, T, T)
        n, h = lay.num_tokens, lay.num_heads
        full = torch.zeros(h, n, n, dtype=ww.dtype)
        for w, idx in enumerate(lay.windows):
            full[:, idx[:, None], idx[None, :]] = ww[w]
        return full

    def layer_rows(self, layer: int, query: int = 0) -> torch.Tensor:
        """(H, N): token ``query``'s row in every head, zero outside its window. Costs O(H · T · d_k)."""
        lay = self.layout(layer)
        query = whole(query, "query token")
        if not 0 <= query < lay.num_tokens:
            raise IndexError(f"query token {query} is outside 0…{lay.num_tokens - 1}")
        w, t = lay.window_of(query)
        q = self.query[layer][:, w, t : t + 1]  # (H, 1, d_k)
        bias = self.bias[layer]
        row = softmax_scores(q, self.key[layer][:, w], lay.scale,
                             None if bias is None else bias[w][:, t : t + 1])[:, 0]  # (H, T)
        full = torch.zeros(lay.num_heads, lay.num_tokens, dtype=row.dtype)
        full[:, lay.windows[w]] = row
        return full

    def weights(self, layer: int, head: Head) -> np.ndarray:
        return fuse_heads(self.layer_weights(layer), head).cpu().numpy()

    def row(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        return fuse_heads(self.layer_rows(layer, query), head).cpu().numpy()

    def query_map(self, layer: int, head: Head, query: int = 0) -> np.ndarray:
        """(h, w) at this layer's grid: token ``query``'s attention, zero outside its window."""
        return self.row(layer, head, query).reshape(self.grid(layer))

    def cls_map(self, layer: int, head: Head) -> np.ndarray:
        raise NoClassTokenError(
            "this model has no class token, so there is no class-token row; use mean_received_map() "
            "(the attention each patch receives from the queries of its window) or query_map() for one patch")

    def mean_received_map(self, layer: int, head: Head) -> np.ndarray:
        """(h, w): the attention each patch receives, averaged over the T queries of its window."""
        lay = self.layout(layer)
        received = fuse_heads(self.window_weights(layer).transpose(0, 1), head).mean(-2)  # (W, T)
        flat = torch.zeros(lay.num_tokens, dtype=received.dtype)
        flat[lay.windows.reshape(-1)] = received.reshape(-1)
        return flat.cpu().numpy().reshape(lay.grid)

    def summary_map(self, layer: int, head: Head) -> np.ndarray:
        return self.mean_received_map(layer, head)

    def window_mask(self, layer: int, token: int) -> np.ndarray:
        """(h, w) bool: the patches of the window token ``token`` attends within at ``layer`` (after the shift)."""
        lay = self.layout(layer)
        inside = np.zeros(lay.num_tokens, bool)
        inside[lay.windows[lay.window_of(token)[0]].numpy()] = True
        return inside.reshape(lay.grid)

    def __repr__(self) -> str:
        stages = ", ".join(f"{self.layouts[s[0]].grid[0]}×{self.layouts[s[0]].grid[1]}" for s in self.stages)
        return (f"StagedCapture({self.num_layers} layers in {len(self.stages)} stages at grids {stages}, "
                f"{self.nbytes / 2**20:.1f} MB)")


@torch.inference_mode()
def capture_staged(model, x: torch.Tensor) -> StagedCapture:
    """Run ``model`` once on ``x`` and keep every layer's windowed q and k (``model.adapter.layouts``)."""
    adapter = model.adapter
    layouts = adapter.layouts
    shapes = [(lay.num_heads, lay.num_windows, lay.windows.shape[1], lay.head_dim) for lay in layouts]
    recorder = Recorder(
        query=[torch.empty(s, device=x.device, dtype=x.dtype) for s in shapes],
        key=[torch.empty(s, device=x.device, dtype=x.dtype) for s in shapes],
        norms=[torch.empty(lay.num_tokens, device=x.device, dtype=x.dtype) for lay in layouts],
    )
    start = time.perf_counter()
    with model.tap.recording(recorder):
        output = adapter.forward(model.network, x)
    seconds = time.perf_counter() - start
    adapter.finish(recorder)
    if len(recorder.seen) != 3 * adapter.depth:
        raise RuntimeError("the forward pass did not reach every attention layer")
    return StagedCapture(
        query=tuple(recorder.query), key=tuple(recorder.key), bias=tuple(adapter.window_bias),
        layouts=layouts, input=x, output=output, seconds=seconds, token_norms=tuple(recorder.norms),
    )
