"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Raw attention of one layer says how tokens mix *in that layer*; after a few layers every token is
already a blend of many patches. Rollout follows the mixing through the layers. Per layer l:

1. fuse the heads into one (N, N) matrix A (mean, max or min over heads);
2. optionally set the lowest ``discard`` fraction of A's weights to 0, never touching the class-token
   column (attention *to* CLS), as the reference implementation does;
3. add the residual stream: A' = (1 − r)·A + r·I, with r = 0.5 in the paper;
4. re-normalise **every row** of A' to sum to 1 (steps 1–2 can leave rows that do not);

then multiply from the first chosen layer to the last: R = A'_last ··· A'_first.

A common bug elsewhere divides by ``A'.sum(-1)`` broadcast over the wrong axis (each *column* j
divided by row j's sum), which is not a row normalisation; tests pin the per-row version.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .capture import Capture, Head, fuse_heads, patch_grid

RESIDUAL = 0.5


def layer_flow(
    weights: torch.Tensor, head: Head = "mean", discard: float = 0.0, residual: float = RESIDUAL
) -> torch.Tensor:
    """One layer's (H, N, N) weights → the row-stochastic (N, N) matrix A' that rollout multiplies."""
    if not 0.0 <= discard < 1.0:
        raise ValueError(f"discard ratio must be in [0, 1), not {discard}")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual weight must be in [0, 1], not {residual}")
    a = fuse_heads(weights, head).clone()  # (N, N)
    n = a.shape[-1]
    k = min(int(n * n * discard), n * n - n)  # counted over all N² weights
    if k:
        ranked = a.clone()
        ranked[:, 0] = torch.inf  # the CLS column is never discarded
        flat = ranked.flatten()
        cut = flat.kthvalue(k).values  # the k-th smallest weight: O(N²), no sort
        drop = flat < cut
        ties = (flat == cut).nonzero()[: k - int(drop.sum()), 0]  # equal weights: first in raster order
        drop[ties] = True
        a.view(-1)[drop] = 0.0
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    a = (1.0 - residual) * a + residual * eye
    return a / a.sum(dim=-1, keepdim=True)  # (N, N): every row sums to 1


def rollout(
    layers: Sequence[torch.Tensor], head: Head = "mean", discard: float = 0.0, residual: float = RESIDUAL
) -> torch.Tensor:
    """(N, N) rollout through ``layers`` (each (H, N, N), first layer first): A'_last ··· A'_first."""
    if not layers:
        raise ValueError("rollout needs at least one layer")
    joint = layer_flow(layers[0], head, discard, residual)
    for weights in layers[1:]:
        joint = layer_flow(weights, head, discard, residual) @ joint  # (N, N)
    return joint


def rollout_row(
    layers: Sequence[torch.Tensor],
    query: int = 0,
    head: Head = "mean",
    discard: float = 0.0,
    residual: float = RESIDUAL,
) -> torch.Tensor:
    """(N,) row ``query`` of :func:`rollout`, in O(L · N²) instead of O(L · N³).

    Row q of A'_L ··· A'_1 is e_qᵀ A'_L ··· A'_1: start from the one-hot row and multiply leftwards.
    """
    if not layers:
        raise ValueError("rollout needs at least one layer")
    n = layers[0].shape[-1]
    row = torch.zeros(n, dtype=layers[0].dtype, device=layers[0].device)
    row[query] = 1.0
    for weights in reversed(layers):
        row = row @ layer_flow(weights, head, discard, residual)  # (N,)
    return row


def capture_layers(cap: Capture, first: int = 0, last: int | None = None) -> list[torch.Tensor]:
    """The (H, N, N) weights of layers ``first``…``last`` (0-based, inclusive) of a capture."""
    last = cap.num_layers - 1 if last is None else last
    if not 0 <= first <= last < cap.num_layers:
        raise IndexError(f"layers {first}…{last} are not a range inside 0…{cap.num_layers - 1}")
    return [cap.layer_weights(layer) for layer in range(first, last + 1)]


def rollout_map(
    cap: Capture,
    first: int = 0,
    last: int | None = None,
    head: Head = "mean",
    discard: float = 0.0,
    residual: float = RESIDUAL,
    query: int = 0,
) -> np.ndarray:
    """(h, w): token ``query``'s (default CLS) rolled-out attention to the patches, on the grid."""
    row = rollout_row(capture_layers(cap, first, last), query, head, discard, residual)
    return patch_grid(row.cpu().numpy(), cap.grid, cap.num_prefix_tokens)


def cls_rollout_grid(cap: Capture) -> np.ndarray:
    """(h, w) float32: the CLS rollout row over every layer, head mean, no discard, residual 0.5.

    This is the ``rollout`` array that ``python -m attnviz export --rollout`` writes.
    """
    return rollout_map(cap).astype(np.float32)
