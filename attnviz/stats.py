"""Per-head statistics that show how attention changes with depth.

- **Entropy of the CLS row** H(p) = −Σ_j p_j ln p_j in nats: 0 when the class token looks at one
  token, ln N when it spreads evenly over all N tokens.
- **Mean attention distance** in input pixels (Dosovitskiy et al. 2021, "An Image is Worth 16x16
  Words", Fig. 7): for every patch query, the attention-weighted distance between its patch centre and
  the key patch centres, averaged over the patch queries. Only patch → patch weights have a
  geometry, so each query's weights over the patch keys are re-normalised to sum to 1 first; the
  part of the attention that goes to prefix tokens is reported separately as:
- **Prefix share**: the fraction of the CLS row that goes to the prefix tokens (CLS itself and
  registers) rather than to patches.

A model without a class token has no CLS row. There, entropy and prefix share are the mean over the
patch query rows of each row's value, and ``HeadStats.rows`` says ``"patch_mean"`` instead of ``"cls"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .capture import Capture
from .errors import LayoutError
from .stages import LayerLayout, global_layout


@dataclass(frozen=True)
class HeadStats:
    entropy: np.ndarray  # (L, H) nats, CLS row over all N keys
    distance: np.ndarray  # (L, H) pixels of the model input
    prefix_share: np.ndarray  # (L, H) in [0, 1]
    num_tokens: int
    patch_px: float
    uniform_distance: float  # the mean distance if every patch attended to all patches equally
    rows: Literal["cls", "patch_mean"] = "cls"  # whose rows entropy and prefix share describe

    @property
    def max_entropy(self) -> float:
        """ln N: the entropy of a row that attends to all N tokens equally."""
        return math.log(self.num_tokens)


@dataclass(frozen=True)
class DepthTrend:
    """The distance panel in numbers: its most local and most global head, and the heads' mean distance in the
    first and the second half of the layers (layers and heads 0-based; distances in input pixels)."""

    local: tuple[int, int, float]  # (layer, head, distance)
    far: tuple[int, int, float]
    first_half: float  # mean over the heads of layers 0 … L // 2 − 1; NaN for a one-layer model
    second_half: float  # … of layers L // 2 … L − 1
    half: int  # L // 2: the first layer of the second half
    num_layers: int


def depth_trend(stats: HeadStats) -> DepthTrend:
    """What :attr:`HeadStats.distance` says about depth on this capture (heads a layer lacks are NaN)."""
    d = stats.distance  # (L, H)
    near, far = np.unravel_index(np.nanargmin(d), d.shape), np.unravel_index(np.nanargmax(d), d.shape)
    half = d.shape[0] // 2
    first = float(np.nanmean(d[:half])) if half else math.nan
    return DepthTrend((int(near[0]), int(near[1]), float(d[near])), (int(far[0]), int(far[1]), float(d[far])),
                      first, float(np.nanmean(d[half:])), half, d.shape[0])


@dataclass(frozen=True)
class Spread:
    """How concentrated the class token's attention is, layer by layer (the "How to read this map" tip):
    ``mean_map`` (L,) the entropy in nats of its row averaged over the heads — the map the page first shows —
    and ``heads`` (L, H) each head's own. 0 = all attention on one token, ln N = an equal share for all."""

    mean_map: np.ndarray
    heads: np.ndarray
    num_tokens: int

    @property
    def focused_layer(self) -> int:
        return int(np.argmin(self.mean_map))

    @property
    def spread_layer(self) -> int:
        return int(np.argmax(self.mean_map))

    @property
    def max_entropy(self) -> float:
        """ln N: the entropy of a row that attends to all N tokens equally."""
        return math.log(self.num_tokens)


def class_token_spread(cap: Capture) -> Spread:
    """:class:`Spread` of a capture whose class token attends at every layer (0-based layers)."""
    if cap.summary != "cls":
        raise LayoutError("the class token is not a query at every layer of this model, so there is no class-token "
                          "row to measure there")
    rows = torch.stack([cap.layer_rows(layer, 0).double() for layer in range(cap.num_layers)])  # (L, H, N)
    return Spread(entropy(rows.mean(1)).cpu().numpy(), entropy(rows).cpu().numpy(), cap.num_tokens)


def entropy(rows: torch.Tensor) -> torch.Tensor:
    """(..., N) rows of probabilities → (...) entropy in nats, with 0 · ln 0 = 0."""
    logs = torch.where(rows > 0, rows.clamp_min(1e-30).log(), torch.zeros_like(rows))
    return -(rows * logs).sum(-1)


def cell_centres(grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(h · w, 2) (y, x) centres of a grid's cells in raster order, in pixels of a ``size`` (H, W) input."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    cells = torch.stack([rows, cols], -1).reshape(-1, 2).double() + 0.5
    return cells * torch.tensor([size[0] / h, size[1] / w], dtype=torch.float64)


def patch_centres(grid: tuple[int, int], patch_px: float) -> torch.Tensor:
    """(h · w, 2) (y, x) centres of the patches in raster order, in pixels."""
    return cell_centres(grid, (grid[0] * patch_px, grid[1] * patch_px))


def mean_distance(
    weights: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int, patch_px: float
) -> torch.Tensor:
    """(H, N, N) weights of one global layer → (H,) mean attention distance in pixels: :func:`window_distance`
    with one window of every token."""
    lay = global_layout(0, grid, int(patch_px), weights.shape[0], 1, 1.0, num_prefix_tokens, False)
    size = (grid[0] * patch_px, grid[1] * patch_px)
    return window_distance(weights[:, None], lay, size)


def window_distance(rows: torch.Tensor, lay: LayerLayout, size: tuple[float, float]) -> torch.Tensor:
    """(H, W, Tq, Tk) window weights of a layer laid out as ``lay`` → (H,) mean attention distance in pixels of a
    ``size`` (height, width) input: for every query that is a grid cell, its weights over the key cells,
    re-normalised, against the distance from its cell centre to each key's (queries on the layer's grid, keys on
    its keys' grid), averaged over those queries; NaN where no grid cell asks."""
    key_cell = (lay.keys - lay.num_key_prefix).to(rows.device)  # (W, Tk): the key's cell on the keys' grid, < 0: prefix
    query_cell = (lay.windows - lay.prefix).to(rows.device)  # (W, Tq): the same for the queries, on the layer's grid
    asking = query_cell >= 0  # (W, Tq): queries that are grid cells
    if not asking.any():
        return torch.full((rows.shape[0],), float("nan"), dtype=rows.dtype, device=rows.device)
    queries = cell_centres(lay.grid, size).to(rows.device)[query_cell.clamp(min=0)]  # (W, Tq, 2)
    keys = cell_centres(lay.keys_grid, size).to(rows.device)[key_cell.clamp(min=0)]  # (W, Tk, 2)
    dist = torch.cdist(queries, keys).to(rows.dtype)  # (W, Tq, Tk) pixels between cell centres
    patch = rows * (key_cell >= 0)[None, :, None, :].to(rows.dtype)  # weights on key cells only
    patch = patch / patch.sum(-1, keepdim=True).clamp_min(1e-30)
    return (patch * dist).sum(-1)[:, asking].mean(-1)  # (H,)


def layer_head_stats(cap: Capture, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(entropy, distance, prefix share), each (H_l,), of every head of ``layer``, at that layer's own grids and
    inside its windows. Where the class token is a query at the layer, entropy and prefix share are its row's;
    otherwise the mean over the patch queries' rows. Distance: over the patch queries (NaN where the layer has
    none, e.g. CaiT's class attention), to the patch keys, re-normalised."""
    lay = cap.layout(layer)
    rows = cap.window_weights(layer).transpose(0, 1)  # (H, W, Tq, Tk)
    heads = rows.shape[0]
    key_cell = (lay.keys - lay.num_key_prefix).to(rows.device)  # (W, Tk): the key's cell on the keys' grid, < 0: prefix
    query_cell = (lay.windows - lay.prefix).to(rows.device)  # (W, Tq): the same for the queries, on the layer's grid
    asking = query_cell >= 0  # (W, Tq): queries that are grid cells
    to_prefix = (rows * (key_cell < 0)[None, :, None, :].to(rows.dtype)).sum(-1)  # (H, W, Tq)
    if cap.summary_kind(layer) == "cls":
        w, t = lay.window_of(0)
        ent, share = entropy(rows[:, w, t]), to_prefix[:, w, t]  # (H,)
    elif asking.any():
        ent, share = entropy(rows)[:, asking].mean(-1), to_prefix[:, asking].mean(-1)
    else:
        ent, share = entropy(rows).reshape(heads, -1).mean(-1), to_prefix.reshape(heads, -1).mean(-1)
    return ent, window_distance(rows, lay, tuple(cap.input.shape[-2:])), share


def head_stats(cap: Capture) -> HeadStats:
    """Entropy, mean distance and prefix share for every layer and head of a capture, (L, H) each: a layer with
    fewer heads than the most any layer has is NaN in the others."""
    patch_px = cap.input.shape[-1] / cap.grid[1]
    shape = (cap.num_layers, cap.num_heads)
    ent, dist, share = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    for layer in range(cap.num_layers):
        values = layer_head_stats(cap, layer)
        for out, value in zip((ent, dist, share), values):
            out[layer, :len(value)] = value.cpu().double().numpy()
    centres = patch_centres(cap.grid, patch_px)
    uniform = float(torch.cdist(centres, centres).mean())
    rows = "cls" if cap.summary == "cls" else "patch_mean"
    return HeadStats(ent, dist, share, cap.num_tokens, float(patch_px), uniform, rows)



TOP_FRACTION = 0.1  # the brightest tenth of the patches
# Below this the "How to read this map" note calls a map diffuse. Measured (python -m bench.defaults, docs/classroom.md):
# of the offline ViT-S/14's 192 maps of the four samples (12 layers, the page's four sizes), 52 hold less in their
# brightest tenth, and 48 of those bring no more than a tenth of the off-box attention into the object's box.
DIFFUSE_BELOW = 0.25


@dataclass(frozen=True)
class Concentration:
    """How much of a map's weight its brightest cells hold (the "How to read this map" note)."""

    top: float  # the share of the map's weight on its brightest ``top_cells`` cells
    top_cells: int  # ⌈fraction · cells⌉
    cells: int

    @property
    def even(self) -> float:
        """What ``top`` is for a map that is the same everywhere."""
        return self.top_cells / self.cells

    @property
    def diffuse(self) -> bool:
        return self.top < DIFFUSE_BELOW


def concentration(grid_map: np.ndarray, fraction: float = TOP_FRACTION) -> Concentration:
    """:class:`Concentration` of a (h, w) map of non-negative weights: the share its brightest ``fraction`` of cells
    hold — ``fraction`` (rounded up to whole cells) for a map that is the same everywhere, 1 for a map on one cell."""
    flat = np.sort(np.asarray(grid_map, dtype=np.float64).ravel())[::-1]
    if not 0 < fraction <= 1 or not flat.sum() > 0:
        raise ValueError("need 0 < fraction ≤ 1 and a map that holds some weight")
    top_cells = math.ceil(fraction * flat.size)
    return Concentration(float(flat[:top_cells].sum() / flat.sum()), top_cells, flat.size)
