"""Captures of hierarchical, windowed models (Swin and its kind): a different token grid per stage,
attention inside windows.

Layer ``l`` of such a model is block ``b`` of stage ``s`` (:class:`LayerLayout`): its tokens are the
cells of that stage's grid (each ``patch`` pixels of the photo), cut into windows of T tokens; the
window partition after the shift is ``windows`` (W, T), the raster index of every window row. Inside
window w the weights are exactly softmax(q · kᵀ · scale + bias[w]), with the relative-position bias
and the shifted-window mask in ``bias``; between windows they are zero, so over the whole image a
layer's matrix is block-diagonal (Liu et al. 2021, "Swin Transformer", Fig. 2).

The same layout describes the other shapes timm's hierarchical families have: keys on another grid
than the queries (pooled or sub-sampled keys: ``key_grid``, ``key_windows``), prefix tokens before the
grid cells (a class token: ``prefix``, ``key_prefix``), queries that are only some tokens (CaiT's
class attention: the class token alone), one window of every token (global attention, W = 1), a bias
computed from the image (put by the adapter after the pass), talking heads (an (H, H) mix of the
heads' logits before the softmax) and a gated blend with weights fixed by the model (ConViT's gated
positional self-attention: per head h, normalise((1 − g_h) · softmax(content logits) + g_h · P_h), the
gate g (H,) and the positional weights P (W, H, Tq, Tk) computed once at wrap time, ``blend``). Where a
layer has a blend, its two parts are there on request (:meth:`StagedCapture.part_weights`).

A :class:`StagedCapture` keeps each layer's q and k per window, O(L · N · d), and answers what a
:class:`~attnviz.capture.Capture` answers, per layer at that layer's grid: the whole-image matrix, a
query token's row, a query's map (zero outside its window), and the summary map: the class token's
row where the layer has one, otherwise the mean attention each patch receives from the queries of
its window.
"""
from __future__ import annotations

import time
from collections.abc import Callable
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
    windows: torch.Tensor = field(repr=False)  # (W, Tq) long: query token of window w's row t
    # Keys, when they are not the queries' tokens: (W, Tk) long, the key token of window w's column
    # (pooled keys, a class token among them); None: the same tokens as ``windows``.
    key_windows: torch.Tensor | None = field(default=None, repr=False)
    key_grid: tuple[int, int] | None = None  # the keys' grid when it is not ``grid`` (pooled keys)
    prefix: int = 0  # query tokens before the grid cells: token i < prefix is a prefix token, then raster order
    key_prefix: int | None = None  # the same for the keys; None: ``prefix``
    class_token: bool = False  # token 0 (of queries and keys) is a class token

    @property
    def num_tokens(self) -> int:
        """Query tokens: the prefix tokens, then the grid's cells."""
        return self.prefix + self.grid[0] * self.grid[1]

    @property
    def keys_grid(self) -> tuple[int, int]:
        return self.grid if self.key_grid is None else self.key_grid

    @property
    def num_key_prefix(self) -> int:
        return self.prefix if self.key_prefix is None else self.key_prefix

    @property
    def num_keys(self) -> int:
        h, w = self.keys_grid
        return self.num_key_prefix + h * w

    @property
    def keys(self) -> torch.Tensor:
        """(W, Tk): the key token of every window column."""
        return self.windows if self.key_windows is None else self.key_windows

    @property
    def num_windows(self) -> int:
        return self.windows.shape[0]

    @property
    def class_row(self) -> bool:
        """Whether the class token is among this layer's queries (its row is the summary map)."""
        return self.class_token and bool((self.windows == 0).any())

    def window_of(self, token: int) -> tuple[int, int]:
        """(window, row in it) of query token ``token``; a ValueError when that token does not attend here."""
        found = (self.windows.reshape(-1) == token).nonzero()
        if not len(found):
            raise ValueError(f"token {token} is not a query at this layer (only {self.windows.numel()} of its "
                             f"{self.num_tokens} tokens attend)")
        w, t = divmod(int(found[0]), self.windows.shape[1])
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

    query: tuple[torch.Tensor, ...]  # per layer (H_l, W_l, Tq_l, d_k)
    key: tuple[torch.Tensor, ...]  # per layer (H_l, W_l, Tk_l, d_k)
    bias: tuple[torch.Tensor | None, ...]  # per layer (W_l, H_l, Tq_l, Tk_l) or broadcastable: position bias + shift mask
    layouts: tuple[LayerLayout, ...]
    input: torch.Tensor  # (1, 3, S, S)
    output: torch.Tensor  # (C,)
    seconds: float
    token_norms: tuple[torch.Tensor, ...] = ()  # per layer (N_l,)
    prepared: object | None = None
    num_prefix_tokens: int = 0
    has_class_token: bool = False
    summary: str = "mean_received"
    mix: tuple[torch.Tensor | None, ...] = ()  # per layer (H, H): talking heads' mix of the logits, or None
    # per layer None or (gate (H,), positional weights (W, H, Tq, Tk)): the weights are
    # normalise((1 − gate) · content + gate · positional), content the softmax of the logits (ConViT's GPSA)
    blend: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...] = ()
    note: str | None = None  # the adapter's ``unread``: locale key of why some of the model's layers are not read

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

    def _mix(self, layer: int) -> torch.Tensor | None:
        return self.mix[layer] if self.mix else None

    def _blend(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.blend[layer] if self.blend else None

    def gate(self, layer: int) -> torch.Tensor | None:
        """(H,): the weight of the positional part in each head of a blended layer (None: no blend)."""
        self.layout(layer)
        blend = self._blend(layer)
        return None if blend is None else blend[0]

    def _part(self, layer: int, part: str | None) -> str | None:
        if part not in PARTS:
            raise ValueError(f"part must be one of {', '.join(repr(p) for p in PARTS)}, not {part!r}")
        if part == "positional" and self._blend(layer) is None:
            raise ValueError(f"layer {layer} has no positional part: its weights are the softmax of q · kᵀ alone")
        return part

    def window_weights(self, layer: int, part: str | None = None) -> torch.Tensor:
        """(W, H, Tq, Tk): every window's weights, as the model computes them; ``part`` ``"content"`` or
        ``"positional"``: that part of a blended layer's weights (``"content"`` of any other layer: its weights)."""
        lay = self.layout(layer)
        part = self._part(layer, part)
        blend = self._blend(layer)
        if part == "positional":
            return blend[1].expand(lay.num_windows, lay.num_heads, -1, -1)
        q, k = self.query[layer], self.key[layer]  # (H, W, Tq, d_k), (H, W, Tk, d_k)
        bias = self.bias[layer]
        scores = mixed_softmax(q, k, lay.scale, None if bias is None else bias.transpose(0, 1), self._mix(layer))
        scores = scores.transpose(0, 1)
        if blend is None or part == "content":
            return scores
        return blended(scores, *blend)

    def part_weights(self, layer: int, part: str) -> torch.Tensor:
        """(H, Nq, Nk): ``"content"`` (softmax of q · kᵀ) or ``"positional"`` part of a blended layer's weights."""
        return self.layer_weights(layer, part)

    def layer_weights(self, layer: int, part: str | None = None) -> torch.Tensor:
        """(H, Nq, Nk) over the whole image: each window's block, zero between windows (and in the rows of
        tokens that are not queries at this layer)."""
        lay = self.layout(layer)
        ww = self.window_weights(layer, part)  # (W, H, Tq, Tk)
        full = ww.new_zeros(lay.num_heads, lay.num_tokens, lay.num_keys)  # where the capture is (CPU or GPU)
        for w, (rows, cols) in enumerate(zip(lay.windows.to(ww.device), lay.keys.to(ww.device))):
            full[:, rows[:, None], cols[None, :]] = ww[w]
        return full

    def layer_rows(self, layer: int, query: int = 0, part: str | None = None) -> torch.Tensor:
        """(H, Nk): token ``query``'s row in every head, zero outside its window. Costs O(H · Tk · d_k)."""
        lay = self.layout(layer)
        query = whole(query, "query token")
        if not 0 <= query < lay.num_tokens:
            raise IndexError(f"query token {query} is outside 0…{lay.num_tokens - 1}")
        part = self._part(layer, part)
        w, t = lay.window_of(query)
        blend = self._blend(layer)
        if blend is not None:
            positional = blend[1]
            positional = positional[min(w, positional.shape[0] - 1)][:, min(t, positional.shape[2] - 1)]  # (H, Tk)
        if part == "positional":
            row = positional.expand(lay.num_heads, -1)
        else:
            q = self.query[layer][:, w, t : t + 1]  # (H, 1, d_k)
            bias = self.bias[layer]
            if bias is not None:  # (W, H, Tq, Tk), or 1 where it is the same for every window, head or query
                bias = bias[min(w, bias.shape[0] - 1)]
                bias = bias[:, min(t, bias.shape[1] - 1)][:, None]  # (H, 1, Tk)
            row = mixed_softmax(q, self.key[layer][:, w], lay.scale, bias, self._mix(layer))[:, 0]  # (H, Tk)
            if blend is not None and part is None:
                row = blended(row, blend[0], positional)
        full = row.new_zeros(lay.num_heads, lay.num_keys)
        full[:, lay.keys[w].to(row.device)] = row
        return full

    def weights(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        return fuse_heads(self.layer_weights(layer, part), head).cpu().numpy()

    def row(self, layer: int, head: Head, query: int = 0, part: str | None = None) -> np.ndarray:
        return fuse_heads(self.layer_rows(layer, query, part), head).cpu().numpy()

    def query_map(self, layer: int, head: Head, query: int = 0, part: str | None = None) -> np.ndarray:
        """(h, w) at the keys' grid of this layer: token ``query``'s attention, zero outside its window."""
        lay = self.layout(layer)
        return self.row(layer, head, query, part)[lay.num_key_prefix:].reshape(lay.keys_grid)

    def cls_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """(h, w): the class token's attention over the patches at ``layer``, where it is a query there."""
        if not self.layout(layer).class_row:
            raise NoClassTokenError(
                "this layer has no class-token row (the model has no class token, or it does not attend here); "
                "use mean_received_map() (the attention each patch receives from the queries of its window) "
                "or query_map() for one patch")
        return self.query_map(layer, head, 0, part)

    def mean_received_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        """(h, w) at the keys' grid: the attention each patch receives, averaged over the queries of its window."""
        lay = self.layout(layer)
        return mean_received(lay, fuse_heads(self.window_weights(layer, part).transpose(0, 1), head))

    def summary_kind(self, layer: int) -> str:
        """``"cls"`` where the class token attends at ``layer`` (its row is the summary), else ``"mean_received"``."""
        return "cls" if self.layout(layer).class_row else "mean_received"

    def summary_map(self, layer: int, head: Head, part: str | None = None) -> np.ndarray:
        if self.summary_kind(layer) == "cls":
            return self.cls_map(layer, head, part)
        return self.mean_received_map(layer, head, part)

    def window_order(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query tokens, key tokens) of ``layer`` listed window by window (window 0's rows, then window 1's,
        …; each key once): in this order a windowed layer's matrix is block-diagonal (Liu et al. 2021, Fig. 2)."""
        lay = self.layout(layer)
        keys = list(dict.fromkeys(lay.keys.reshape(-1).tolist()))  # a key shared by windows: where first seen
        return lay.windows.reshape(-1), torch.tensor(keys, dtype=torch.long)

    def ordered_weights(self, layer: int, head: Head) -> np.ndarray:
        """(Tq · W, keys): :meth:`weights` of the tokens that are queries at ``layer``, rows and columns in
        :meth:`window_order`."""
        rows, cols = self.window_order(layer)
        return fuse_heads(self.layer_weights(layer)[:, rows][:, :, cols], head).cpu().numpy()

    def window_mask(self, layer: int, token: int) -> np.ndarray:
        """(h, w) bool at the keys' grid: the patches query ``token`` attends within at ``layer`` (after the shift)."""
        lay = self.layout(layer)
        inside = np.zeros(lay.num_keys, bool)
        inside[lay.keys[lay.window_of(token)[0]].cpu().numpy()] = True
        return inside[lay.num_key_prefix:].reshape(lay.keys_grid)

    def __repr__(self) -> str:
        stages = ", ".join(f"{self.layouts[s[0]].grid[0]}×{self.layouts[s[0]].grid[1]}" for s in self.stages)
        return (f"StagedCapture({self.num_layers} layers in {len(self.stages)} stages at grids {stages}, "
                f"{self.nbytes / 2**20:.1f} MB)")


def mean_received(lay: LayerLayout, weights: torch.Tensor) -> np.ndarray:
    """(h, w) at the keys' grid: each key's attention averaged over the queries of its window, from one
    head choice's window weights (W, Tq, Tk)."""
    received = weights.mean(-2)  # (W, Tk)
    keys = lay.keys.reshape(-1).to(received.device)
    flat = received.new_zeros(lay.num_keys).index_add_(0, keys, received.reshape(-1))
    count = received.new_zeros(lay.num_keys).index_add_(0, keys, torch.ones_like(received.reshape(-1)))
    flat = flat / count.clamp(min=1)  # a key in several windows: the mean over them
    return flat[lay.num_key_prefix:].cpu().numpy().reshape(lay.keys_grid)


PARTS = (None, "content", "positional")  # None: the weights the model uses (a blended layer's mix)


def blended(content: torch.Tensor, gate: torch.Tensor, positional: torch.Tensor) -> torch.Tensor:
    """normalise((1 − gate) · content + gate · positional) over the last axis, in ConViT's order of
    operations: ``content`` (..., H, Tq, Tk) or (H, Tk), ``gate`` (H,), ``positional`` broadcastable to content."""
    g = gate.to(content.dtype).reshape(-1, *([1] * (2 if content.ndim > 2 else 1)))  # heads: axis −3 (a row: −2)
    out = (1.0 - g) * content + g * positional.to(content.dtype)
    return out / out.sum(dim=-1, keepdim=True)


def mixed_softmax(query: torch.Tensor, key: torch.Tensor, scale: float, bias: torch.Tensor | None = None,
                  mix: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(mix(q · kᵀ · scale) + bias) over the last axis: (H, ..., M, d_k), (H, ..., N, d_k) → (H, ..., M, N).

    ``mix`` (H, H), talking heads: head h's logits are Σ_g mix[h, g] · logits[g]. Without it this is
    :func:`attnviz.softmax.softmax_scores` (float64 logits, softmax in the input's precision)."""
    if mix is None:
        return softmax_scores(query, key, scale, bias)
    scores = (query.double() * scale) @ key.double().transpose(-2, -1)
    scores = torch.einsum("hg,g...->h...", mix.double(), scores)
    if bias is not None:
        scores = scores + bias.double()
    scores = scores - scores.amax(dim=-1, keepdim=True)
    return scores.to(query.dtype).softmax(dim=-1)


@torch.inference_mode()
def capture_staged(model, x: torch.Tensor, between_layers: Callable[[], None] | None = None) -> StagedCapture:
    """Run ``model`` once on ``x`` and keep every layer's windowed q and k (``model.adapter.layouts``);
    ``between_layers()`` after each block, as in :func:`attnviz.capture_tensor`."""
    adapter = model.adapter
    layouts = adapter.layouts
    queries = [(lay.num_heads, lay.num_windows, lay.windows.shape[1], lay.head_dim) for lay in layouts]
    keys = [(lay.num_heads, lay.num_windows, lay.keys.shape[1], lay.head_dim) for lay in layouts]
    recorder = Recorder(
        query=[torch.empty(s, device=x.device, dtype=x.dtype) for s in queries],
        key=[torch.empty(s, device=x.device, dtype=x.dtype) for s in keys],
        norms=[None] * len(layouts),  # each block's output tokens, whatever their count
        between_layers=between_layers,
    )
    start = time.perf_counter()
    with model.tap.recording(recorder):
        output = adapter.forward(model.network, x)
    seconds = time.perf_counter() - start
    adapter.finish(recorder)
    if len(recorder.seen) != 3 * adapter.depth:
        raise RuntimeError("the forward pass did not reach every attention layer")
    static = adapter.window_bias or (None,) * len(layouts)
    bias = tuple(recorder.bias.get(layer, static[layer]) for layer in range(len(layouts)))
    has_class_token = bool(layouts) and all(lay.class_row for lay in layouts)
    return StagedCapture(
        query=tuple(recorder.query), key=tuple(recorder.key), bias=bias, layouts=layouts, input=x, output=output,
        seconds=seconds, token_norms=tuple(recorder.norms), num_prefix_tokens=layouts[-1].prefix,
        has_class_token=has_class_token, summary="cls" if has_class_token else "mean_received",
        mix=tuple(adapter.window_mix) if adapter.window_mix is not None else (),
        blend=tuple(adapter.window_blend) if adapter.window_blend is not None else (), note=adapter.unread,
    )
