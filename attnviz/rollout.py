"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Raw attention of one layer says how tokens mix *in that layer*; after a few layers every token is
already a blend of many patches. Rollout follows the mixing through the layers. Per layer l:

1. fuse the heads into one (N, N) matrix A (mean, max or min over heads);
2. optionally set the lowest ``discard`` fraction of A's weights to 0. Ours never discards any weight
   in column 0 (attention *to* token 0, the class token): the whole column is exempt. This is our
   choice, not the reference's: jacobgil/vit-explain exempts only the single CLS → CLS weight
   (``indices != 0`` on the flattened matrix), so attention from patches to CLS can be discarded
   there. Both count the fraction over all N² weights;
3. add the residual stream: A' = (1 − r)·A + r·I, with r = 0.5 in the paper;
4. re-normalise **every row** of A' to sum to 1 (steps 1–2 can leave rows that do not);

then multiply from the first chosen layer to the last: R = A'_last ··· A'_first.

The map is a row of R: the class token's by default. A model without a class token has no such row;
there the default is the mean of R's patch rows (what all patches, on average, draw from each patch
through the layers), and :func:`rollout_map` says so through :attr:`Capture.summary`.

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


def rollout_matrix(
    layers: Sequence[torch.Tensor], head: Head = "mean", discard: float = 0.0, residual: float = RESIDUAL
) -> torch.Tensor:
    """(N, N) rollout through ``layers`` (each (H, N, N), first layer first): A'_last ··· A'_first."""
    if not layers:
        raise ValueError("rollout needs at least one layer")
    joint = layer_flow(layers[0], head, discard, residual)  # (N, N)
    for weights in layers[1:]:
        joint = layer_flow(weights, head, discard, residual) @ joint  # (N, N)
    return joint


rollout = rollout_matrix  # the module's older name for it; the package exports only rollout_matrix


def _check_query(query, n: int) -> int:
    if isinstance(query, (bool, np.bool_)) or not isinstance(query, (int, np.integer)):
        raise TypeError(f"query must be a whole token index 0…{n - 1}, not {query!r}")
    if not 0 <= query < n:
        raise IndexError(f"query token {query} is outside 0…{n - 1} (negative indices are not accepted)")
    return int(query)


def rollout_row(
    layers: Sequence[torch.Tensor],
    query: int | torch.Tensor = 0,
    head: Head = "mean",
    discard: float = 0.0,
    residual: float = RESIDUAL,
) -> torch.Tensor:
    """(N,) row ``query`` of :func:`rollout_matrix`, in O(L · N²) instead of O(L · N³).

    Row q of A'_L ··· A'_1 is e_qᵀ A'_L ··· A'_1: start from the one-hot row and multiply leftwards.
    ``query`` may also be an (N,) start vector: a weighted mix of rows (e.g. the mean of the patch rows).
    """
    if not layers:
        raise ValueError("rollout needs at least one layer")
    n = layers[0].shape[-1]
    if isinstance(query, torch.Tensor):
        row = query.to(dtype=layers[0].dtype, device=layers[0].device)
    else:
        row = torch.zeros(n, dtype=layers[0].dtype, device=layers[0].device)
        row[_check_query(query, n)] = 1.0
    for weights in reversed(layers):
        row = row @ layer_flow(weights, head, discard, residual)  # (N,)
    return row


def capture_layers(cap: Capture, first: int = 0, last: int | None = None) -> list[torch.Tensor]:
    """The (H, N, N) weights of layers ``first``…``last`` (0-based, inclusive) of a capture."""
    last = cap.num_layers - 1 if last is None else last
    for value in (first, last):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"layers must be whole numbers (0-based), not {value!r}")
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
    query: int | None = None,
) -> np.ndarray:
    """(h, w): token ``query``'s rolled-out attention to the patches, on the grid.

    ``query=None`` (default) follows :attr:`Capture.summary`: the class token's row, or, for a model
    without one, the mean of the patch tokens' rows.
    """
    layers = capture_layers(cap, first, last)
    if query is None:
        query = 0 if cap.has_class_token else patch_mean(cap)
    row = rollout_row(layers, query, head, discard, residual)
    return patch_grid(row.cpu().numpy(), cap.grid, cap.num_prefix_tokens)


def patch_mean(cap: Capture) -> torch.Tensor:
    """(N,) start vector 1/P on each of the P patch tokens, 0 on the prefix tokens."""
    start = torch.zeros(cap.num_tokens, dtype=cap.query.dtype, device=cap.query.device)
    start[cap.num_prefix_tokens :] = 1.0 / (cap.num_tokens - cap.num_prefix_tokens)
    return start


def cls_rollout_grid(cap: Capture) -> np.ndarray:
    """(h, w) float32: the CLS rollout row over every layer, head mean, no discard, residual 0.5
    (for a model without a class token, the mean of the patch rows: see :func:`rollout_map`).

    This is the ``rollout`` array that ``attnviz export --rollout`` writes.
    """
    return rollout_map(cap).astype(np.float32)
