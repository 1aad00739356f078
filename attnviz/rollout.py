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
through the layers), and :func:`rollout_map` says so through :meth:`Capture.summary_kind`.

Rollout is a product of N × N matrices, so it is defined over layers that share one token set as both
queries and keys: every layer of a plain ViT; within one stage of a Swin (block-diagonal matrices of
shifted windows); never across a change of grid or over pooled keys, which is refused in one sentence.

A common bug elsewhere divides by ``A'.sum(-1)`` broadcast over the wrong axis (each *column* j
divided by row j's sum), which is not a row normalisation; tests pin the per-row version.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .capture import Capture, Head, fuse_heads, patch_grid
from .errors import LayoutError
from .stages import LayerLayout

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


MAX_ROLLOUT_BYTES = 2**28  # the (H, N, N) weights of one layer (a page run holds a few): a Swin's 448 px first stage is 1.9 GB


def rollout_layers(cap: Capture) -> tuple[int, int]:
    """(first, last), 0-based: the layers rollout follows by default — every layer of a model whose layers share
    one token set (a plain ViT), else the run of layers that ends at the last one and shares its tokens (a
    Swin's last stage)."""
    last = first = cap.num_layers - 1
    while first > 0 and cap.same_tokens([first - 1, last]):
        first -= 1
    return first, last


def _check_layers(cap: Capture, first: int, last: int) -> None:
    """One sentence where layers ``first``…``last`` cannot be rolled out: a product of matrices needs one token
    set that is both the queries and the keys, and each matrix must fit in memory."""
    lay = cap.layout(last)
    if not cap.same_tokens(range(first, last + 1)) or lay.num_tokens != lay.num_keys:
        own = rollout_layers(cap)
        raise LayoutError(
            f"rollout multiplies each layer's attention over one set of tokens, but layers {first + 1}–{last + 1} "
            f"of this model attend over different token grids (or pooled keys); pick layers within one stage, e.g. "
            f"{own[0] + 1}–{own[1] + 1}")
    nbytes = 4 * lay.num_heads * lay.num_tokens * lay.num_keys
    if nbytes > MAX_ROLLOUT_BYTES:
        raise LayoutError(f"layer {last + 1} has {lay.num_tokens} tokens, so each of its rollout matrices would take "
                          f"{nbytes / 2**30:.1f} GB; use a smaller input size or later layers")


def rollout_refusal(cap: Capture, first: int | None = None, last: int | None = None) -> str | None:
    """Why layers ``first``…``last`` (by default :func:`rollout_layers`) cannot be rolled out, in one sentence;
    None when they can."""
    default = rollout_layers(cap)
    try:
        _check_layers(cap, default[0] if first is None else first, default[1] if last is None else last)
    except LayoutError as e:
        return str(e)
    return None


def capture_layers(cap: Capture, first: int | None = None, last: int | None = None) -> list[torch.Tensor]:
    """The (H, N, N) weights of layers ``first``…``last`` (0-based, inclusive) of a capture; by default
    :func:`rollout_layers`."""
    default = rollout_layers(cap)
    first = default[0] if first is None else first
    last = default[1] if last is None else last
    for value in (first, last):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"layers must be whole numbers (0-based), not {value!r}")
    if not 0 <= first <= last < cap.num_layers:
        raise IndexError(f"layers {first}…{last} are not a range inside 0…{cap.num_layers - 1}")
    _check_layers(cap, first, last)
    return [cap.layer_weights(layer) for layer in range(first, last + 1)]


def rollout_map(
    cap: Capture,
    first: int | None = None,
    last: int | None = None,
    head: Head = "mean",
    discard: float = 0.0,
    residual: float = RESIDUAL,
    query: int | None = None,
) -> np.ndarray:
    """(h, w): token ``query``'s rolled-out attention to the patches, on the grid of the layers rolled out.

    ``query=None`` (default) follows :meth:`Capture.summary_kind` of the last layer: the class token's row, or,
    where it does not attend, the mean of the patch tokens' rows.
    """
    layers = capture_layers(cap, first, last)
    lay = cap.layout(rollout_layers(cap)[1] if last is None else last)
    if query is None:
        query = 0 if lay.class_row else patch_mean(cap, lay)
    row = rollout_row(layers, query, head, discard, residual)
    return patch_grid(row.cpu().numpy(), lay.keys_grid, lay.num_key_prefix)


def patch_mean(cap: Capture, lay: LayerLayout | None = None) -> torch.Tensor:
    """(N,) start vector 1/P on each of the P patch tokens of layout ``lay`` (the last layer's), 0 on the prefix
    tokens."""
    lay = cap.layouts[-1] if lay is None else lay
    start = torch.zeros(lay.num_tokens, dtype=cap.input.dtype, device=cap.input.device)
    start[lay.prefix:] = 1.0 / (lay.num_tokens - lay.prefix)
    return start


def cls_rollout_grid(cap: Capture) -> np.ndarray:
    """(h, w) float32: the CLS rollout row over every layer, head mean, no discard, residual 0.5
    (for a model without a class token, the mean of the patch rows: see :func:`rollout_map`).

    This is the ``rollout`` array that ``attnviz export --rollout`` writes.
    """
    return rollout_map(cap).astype(np.float32)
