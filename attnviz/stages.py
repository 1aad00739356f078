"""Where each layer's tokens are and which attend to each other: a token grid per stage, attention inside
windows (Swin and its kind), or one window of every token (a plain ViT).

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
layer has a blend, its two parts are there on request (:meth:`attnviz.Capture.part_weights`).

Every model's capture is made of these layouts (:class:`~attnviz.capture.Capture`): a plain ViT's
layer is one stage's block with one window of every token (W = 1), the prefix tokens first; Swin's
are four stages of windows. What differs between families lives here and in the adapters, never in
the code that asks a capture for its weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .softmax import softmax_scores


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

    def attends(self) -> tuple[str, dict]:
        """How this layer's queries attend, as the key of its words in the catalogue (``view.place_<key>``,
        ``qkmap.how_<key>``) and their values: inside windows, over keys on another grid than the queries (pooled
        keys, sub-sampled queries), with only the class token or some tokens asking, over keys that are other
        tokens, or every token attending to every token (``global``)."""
        if self.num_windows > 1:
            return "windows", dict(n=self.num_windows, wh=self.window[0], ww=self.window[1])
        if self.keys_grid != self.grid:
            return "other_grid", dict(kh=self.keys_grid[0], kw=self.keys_grid[1], h=self.grid[0], w=self.grid[1])
        if self.windows.shape[1] < self.num_tokens:
            alone = self.windows.shape[1] == 1 and self.class_token
            return "class_asks" if alone else "some_queries", dict(n=self.windows.shape[1], total=self.num_tokens)
        if self.key_windows is not None:
            return "other_keys", {}
        return "global", {}

    @property
    def is_global(self) -> bool:
        """Every token attends to every token, in token order (a plain ViT's layer): the window is the matrix."""
        return (self.key_windows is None and self.num_windows == 1 and self.windows.shape[1] == self.num_tokens
                and bool((self.windows[0] == torch.arange(self.num_tokens, device=self.windows.device)).all()))

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


def mean_received(lay: LayerLayout, weights: torch.Tensor) -> np.ndarray:
    """(h, w) at the keys' grid: each key's attention averaged over the patch queries of its window (prefix
    tokens' rows left out; a layer whose only queries are prefix tokens, CaiT's class attention: over those),
    from one head choice's window weights (W, Tq, Tk)."""
    patch_rows = (lay.windows >= lay.prefix).to(weights.device, weights.dtype)  # (W, Tq)
    if not patch_rows.any():
        patch_rows = torch.ones_like(patch_rows)
    rows = patch_rows.sum(-1)  # (W,)
    received = (weights * patch_rows[..., None]).sum(-2) / rows.clamp(min=1)[:, None]  # (W, Tk)
    counted = (rows > 0).to(weights.dtype)[:, None].expand_as(received)  # a window with no patch query: not counted
    keys = lay.keys.reshape(-1).to(received.device)
    flat = received.new_zeros(lay.num_keys).index_add_(0, keys, (received * counted).reshape(-1))
    count = received.new_zeros(lay.num_keys).index_add_(0, keys, counted.reshape(-1))
    flat = flat / count.clamp(min=1)  # a key in several windows: the mean over them
    return flat[lay.num_key_prefix:].cpu().numpy().reshape(lay.keys_grid)


def global_layout(layer: int, grid: tuple[int, int], patch: int, num_heads: int, head_dim: int, scale: float,
                  prefix: int, class_token: bool, tokens: torch.Tensor | None = None) -> LayerLayout:
    """Layer ``layer`` of a plain ViT: block ``layer`` of its one stage, every token in one window (W = 1),
    ``prefix`` tokens (the class token first, then registers) before the grid's cells. ``tokens``: the (1, N)
    window table, shared by every layer of a capture."""
    if tokens is None:
        tokens = torch.arange(prefix + grid[0] * grid[1])[None]
    return LayerLayout(stage=0, block=layer, grid=grid, patch=patch, window=grid, shift=(0, 0), num_heads=num_heads,
                       head_dim=head_dim, scale=scale, windows=tokens, prefix=prefix, class_token=class_token)


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
