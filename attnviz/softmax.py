"""The arithmetic every capture shares: the exact softmax of stored q and k, head fusion, the patch grid."""
from __future__ import annotations

from typing import Literal, Union

import numpy as np
import torch

Head = Union[int, Literal["mean", "max", "min"]]
HEAD_FUSIONS = ("mean", "max", "min")


def whole(value, what: str) -> int:
    """``value`` as an int, or a TypeError naming ``what`` (True, 11.0 and "3" are not indices)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be a whole number (0-based), not {value!r}")
    return int(value)


def softmax_scores(
    query: torch.Tensor, key: torch.Tensor, scale: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q · kᵀ · scale + bias) over the last axis: (H, M, d_k), (H, N, d_k) → (H, M, N), in q's dtype.

    The logits reach ~300 in this model, where float32 dot products are off by ~1e-5 and softmax
    passes that error on. So the dot products are taken in float64 and the row maximum subtracted
    there; the (now small) logits then go through softmax in the input's precision. Against a
    float64 recomputation this is within ~2e-6, at about twice the cost of plain float32.
    """
    scores = (query.double() * scale) @ key.double().transpose(-2, -1)
    if bias is not None:
        scores = scores + bias.double()  # (H, M, N)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    return scores.to(query.dtype).softmax(dim=-1)


def fuse_heads(weights: torch.Tensor, head: Head) -> torch.Tensor:
    """Pick head ``head`` from a (H, ...) tensor, or reduce over heads with mean / max / min."""
    if isinstance(head, str) and head in HEAD_FUSIONS:
        return {"mean": weights.mean, "max": weights.amax, "min": weights.amin}[head](0)
    if not isinstance(head, (bool, np.bool_)) and isinstance(head, (int, np.integer)) and 0 <= head < weights.shape[0]:
        return weights[int(head)]
    raise ValueError(f"head must be 0…{weights.shape[0] - 1} or one of {HEAD_FUSIONS}, not {head!r}")


def patch_grid(row: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int) -> np.ndarray:
    """(N,) row over all tokens → (h, w) over the patch tokens, in raster order."""
    h, w = grid
    patches = row[num_prefix_tokens:]
    if patches.shape[0] != h * w:
        raise ValueError(f"{patches.shape[0]} patch tokens do not fill a {h} × {w} grid")
    return patches.reshape(h, w)


def on_grid(values, grid: tuple[int, int]):
    """(..., h, w) map (NumPy or torch) → (..., gh, gw) on the finer ``grid``: each cell takes the value of the
    map's cell over it (a later stage's coarser grid laid on the photo's patches)."""
    h, w = values.shape[-2:]
    rows = np.arange(grid[0]) * h // grid[0]
    cols = np.arange(grid[1]) * w // grid[1]
    return values[..., rows[:, None], cols[None, :]]
