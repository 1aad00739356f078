"""The interactive page's data for a model whose layers differ (Swin, PiT, LeViT, …): every layer at its own grid.

What it holds, per layer l and head choice k (head 1…H_l, mean, max, min; K_l = H_l + 3):
- the summary map at the layer's keys' grid (P_l = h_l · w_l keys): (K_l, P_l) levels, each between its
  own smallest and largest weight as :func:`attnviz.html.payload` stores them;
- while all layers' rows together fit :data:`attnviz.html.ALL_ROWS_BYTES`, every query's row inside its
  window: (K_l, W_l, Tq_l, Tk_l) levels, with the window's query tokens (W_l, Tq_l) and key tokens
  (W_l, Tk_l) as int32. The page lays a row on the keys' grid, zero outside the window. Each row is
  quantised between its smallest and largest weight over the whole keys' grid (0 is one of them where
  the window does not cover the grid), so a colour is the colour :func:`attnviz.render.overlay` draws
  for :meth:`Capture.query_map`, and the numbers are as exact as a plain page's.

A layer whose queries are only prefix tokens (class attention: CaiT, XCiT, VOLO's last blocks) has
no patch to click; the page says so in one sentence.
"""
from __future__ import annotations

import numpy as np
import torch

from .softmax import HEAD_FUSIONS, fuse_heads
from .capture import Capture
from .stages import LayerLayout, mean_received


def head_choices(num_heads: int) -> list:
    return [*HEAD_FUSIONS, *range(num_heads)]


def patch_queries(lay: LayerLayout) -> bool:
    """Whether any grid cell is a query at this layer (not only the class token)."""
    return bool((lay.windows >= lay.prefix).any())


def layer_rows_bytes(lay: LayerLayout) -> int:
    """Raw size of one layer's quantised window rows: K · W · Tq · Tk bytes (0 where no patch is a query)."""
    if not patch_queries(lay):
        return 0
    return (lay.num_heads + 3) * lay.windows.numel() * lay.keys.shape[1]


def all_rows_bytes(cap: Capture) -> int:
    return sum(layer_rows_bytes(lay) for lay in cap.layouts)


def summary_bytes(cap: Capture) -> int:
    return sum((lay.num_heads + 3) * lay.keys_grid[0] * lay.keys_grid[1] for lay in cap.layouts)


def summary_rows(cap: Capture, layer: int) -> torch.Tensor:
    """(K, P) float32: layer ``layer``'s summary map for every head choice."""
    heads = head_choices(cap.heads(layer))
    if cap.summary_kind(layer) == "cls":
        maps = [cap.summary_map(layer, h) for h in heads]
    else:  # Capture.mean_received_map, with the layer's window weights computed once, not once a head choice
        weights = cap.window_weights(layer).transpose(0, 1)  # (H, W, Tq, Tk)
        maps = [mean_received(cap.layout(layer), fuse_heads(weights, h)) for h in heads]
    return torch.stack([torch.from_numpy(np.ascontiguousarray(m)).reshape(-1).float() for m in maps])


def window_rows(cap: Capture, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(levels (K, W, Tq, Tk) uint8, lo (K, W, Tq), hi (K, W, Tq)): every query's row inside its window,
    quantised between the row's smallest and largest weight on the keys' grid."""
    lay = cap.layout(layer)
    weights = cap.window_weights(layer).transpose(0, 1).cpu()  # (H, W, Tq, Tk), on the CPU for the page
    rows = torch.stack([fuse_heads(weights, h) for h in head_choices(lay.num_heads)]).float()  # (K, W, Tq, Tk)
    cells = lay.keys - lay.num_key_prefix  # (W, Tk): the key-grid cell of each column; < 0: a prefix key
    on_grid = (cells >= 0)[None, :, None, :]
    kh, kw = lay.keys_grid
    covers = torch.tensor([int(c[c >= 0].unique().numel()) == kh * kw for c in cells])  # (W,)
    lo = torch.where(on_grid, rows, torch.inf).amin(-1)
    hi = torch.where(on_grid, rows, -torch.inf).amax(-1)
    outside = ~covers[None, :, None]  # the row is 0 on the cells outside its window
    lo = torch.where(outside, lo.clamp(max=0.0), lo)
    hi = torch.where(outside, hi.clamp(min=0.0), hi)
    lo, hi = lo.nan_to_num(0.0, 0.0, 0.0), hi.nan_to_num(0.0, 0.0, 0.0)  # a window with no grid key
    span = (hi - lo)[..., None]
    unit = torch.where(span > 0, (rows - lo[..., None]) / torch.where(span > 0, span, 1), 0.0)
    levels = (unit * 255).round().clamp(0, 255).to(torch.uint8)
    return levels.numpy(), lo.numpy(), hi.numpy()


def meta(cap: Capture, rows: bool) -> list[dict]:
    """Each layer's place and grids for the page's script (1-based stage and block, as a person counts)."""
    out = []
    for layer, lay in enumerate(cap.layouts):
        out.append({
            "stage": lay.stage + 1, "block": lay.block + 1, "grid": list(lay.grid), "keys": list(lay.keys_grid),
            "heads": lay.num_heads, "prefix": lay.prefix, "keyPrefix": lay.num_key_prefix,
            "tokens": lay.num_tokens, "summary": cap.summary_kind(layer),
            "patchQueries": patch_queries(lay), "rows": rows and patch_queries(lay),
        })
    return out

