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
from .softmax import softmax_scores


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
    """:class:`Spread` of a capture with a class token (0-based layers)."""
    bias = None if cap.bias is None else cap.bias[:, :, :1]
    rows = softmax_scores(cap.query[:, :, :1], cap.key, cap.scale, bias)[:, :, 0].double()  # (L, H, N): every layer at once
    return Spread(entropy(rows.mean(1)).cpu().numpy(), entropy(rows).cpu().numpy(), cap.num_tokens)


def entropy(rows: torch.Tensor) -> torch.Tensor:
    """(..., N) rows of probabilities → (...) entropy in nats, with 0 · ln 0 = 0."""
    logs = torch.where(rows > 0, rows.clamp_min(1e-30).log(), torch.zeros_like(rows))
    return -(rows * logs).sum(-1)


def patch_centres(grid: tuple[int, int], patch_px: float) -> torch.Tensor:
    """(h · w, 2) (y, x) centres of the patches in raster order, in pixels."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return (torch.stack([rows, cols], -1).reshape(-1, 2).double() + 0.5) * patch_px


def mean_distance(
    weights: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int, patch_px: float
) -> torch.Tensor:
    """(H, N, N) weights of one layer → (H,) mean attention distance in pixels."""
    p = num_prefix_tokens
    centres = patch_centres(grid, patch_px).to(weights.device)
    dist = torch.cdist(centres, centres).to(weights.dtype)  # (P, P) pixels between patch centres
    patch = weights[:, p:, p:]  # (H, P, P): patch queries → patch keys
    patch = patch / patch.sum(-1, keepdim=True).clamp_min(1e-30)
    return (patch * dist).sum(-1).mean(-1)  # (H,)


def head_stats(cap: Capture) -> HeadStats:
    """Entropy, mean distance and prefix share for every layer and head of a capture."""
    patch_px = cap.input.shape[-1] / cap.grid[1]
    p = cap.num_prefix_tokens
    ent, dist, share = [], [], []
    for layer in range(cap.num_layers):
        weights = cap.layer_weights(layer)  # (H, N, N)
        if cap.has_class_token:
            cls_rows = weights[:, 0]  # (H, N)
            ent.append(entropy(cls_rows))
            share.append(cls_rows[:, :p].sum(-1))
        else:  # no class token: the mean over the patch query rows, never patch 0's row alone
            ent.append(entropy(weights[:, p:]).mean(-1))
            share.append(weights[:, p:, :p].sum(-1).mean(-1))
        dist.append(mean_distance(weights, cap.grid, p, patch_px))
    as_array = lambda xs: torch.stack(xs).cpu().double().numpy()  # noqa: E731
    centres = patch_centres(cap.grid, patch_px)
    uniform = float(torch.cdist(centres, centres).mean())
    rows = "cls" if cap.has_class_token else "patch_mean"
    return HeadStats(as_array(ent), as_array(dist), as_array(share), cap.num_tokens, float(patch_px), uniform, rows)
