"""Per-head statistics of a :class:`~attnviz.stages.StagedCapture`: each layer at its own grids, with
its own heads — the numbers ``attnviz dataset`` writes for a model with stages (Swin, PiT, LeViT, …).

For layer l, every head h, in the same units as :mod:`attnviz.stats`:

- **Entropy** (nats) of the head's summary row(s): the class token's row over all of the layer's keys
  where the class token is a query at l (``summary_kind(l) == "cls"``), else the mean over the layer's
  query rows (each window row of :attr:`~attnviz.stages.LayerLayout.windows`) of each row's entropy.
- **Prefix share**: of those same rows, the part of the weights that goes to prefix keys (a class
  token among the keys), averaged the same way.
- **Mean attention distance** in pixels of the model input (Dosovitskiy et al. 2021, Fig. 7): for every
  query that is a grid cell, its weights over the key cells, re-normalised to sum to 1, against the
  distance from its cell centre to each key's cell centre — the queries' cells ``S / h × S / w`` pixels
  on the layer's grid, the keys' on its keys' grid (pooled keys are coarser) — averaged over those
  queries. NaN where no grid cell is a query at l (CaiT's and XCiT's class attention: the class token
  alone asks, and it has no place on the grid).
- **Top patch**: the most-attended cell of the summary map (:meth:`~attnviz.stages.StagedCapture.summary_map`),
  its raster index on the layer's keys' grid (``row · w + column``), and the **mass fraction**: the
  share of that grid's cells that hold ``mass`` of the map (:func:`attnviz.masks.mass_mask`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .masks import DEFAULT_MASS, mass_mask
from .stages import StagedCapture
from .stats import entropy


@dataclass(frozen=True)
class LayerStats:
    entropy: np.ndarray  # (H_l,) nats
    distance: np.ndarray  # (H_l,) pixels of the model input; NaN without a grid cell among the queries
    prefix_share: np.ndarray  # (H_l,) in [0, 1]
    top_patch: np.ndarray  # (H_l,) raster index on ``keys_grid``
    mass_fraction: np.ndarray  # (H_l,) in (0, 1]
    keys_grid: tuple[int, int]  # the grid ``top_patch`` and the summary map refer to
    rows: str  # "cls" or "mean_received": whose rows entropy and prefix share describe ("cls": the class token's)


def cell_centres(grid: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """(h · w, 2) (y, x) centres of a grid's cells in raster order, in pixels of a ``size`` (H, W) input."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    cells = torch.stack([rows, cols], -1).reshape(-1, 2).double() + 0.5
    return cells * torch.tensor([size[0] / h, size[1] / w], dtype=torch.float64)


def layer_stats(cap: StagedCapture, layer: int, mass: float = DEFAULT_MASS) -> LayerStats:
    """The statistics of every head of ``layer`` (see the module's docstring)."""
    lay = cap.layout(layer)
    rows = cap.window_weights(layer).transpose(0, 1)  # (H, W, Tq, Tk)
    heads = rows.shape[0]
    key_cell = lay.keys - lay.num_key_prefix  # (W, Tk): the key's cell on the keys' grid, < 0 for a prefix key
    query_cell = lay.windows - lay.prefix  # (W, Tq): the same for the queries, on the layer's grid
    to_prefix = (rows * (key_cell < 0)[None, :, None, :].to(rows.dtype)).sum(-1)  # (H, W, Tq)
    kind = cap.summary_kind(layer)
    if kind == "cls":
        w, t = lay.window_of(0)
        ent, share = entropy(rows[:, w, t]), to_prefix[:, w, t]  # (H,)
    else:
        ent = entropy(rows).reshape(heads, -1).mean(-1)
        share = to_prefix.reshape(heads, -1).mean(-1)

    size = tuple(cap.input.shape[-2:])
    asking = query_cell >= 0  # (W, Tq): queries that are grid cells
    queries = cell_centres(lay.grid, size)[query_cell.clamp(min=0)]  # (W, Tq, 2)
    keys = cell_centres(lay.keys_grid, size)[key_cell.clamp(min=0)]  # (W, Tk, 2)
    dist = torch.cdist(queries, keys).to(rows.dtype)  # (W, Tq, Tk) pixels between cell centres
    patch = rows * (key_cell >= 0)[None, :, None, :].to(rows.dtype)  # weights on key cells only
    patch = patch / patch.sum(-1, keepdim=True).clamp_min(1e-30)
    per_query = (patch * dist).sum(-1)  # (H, W, Tq)
    distance = per_query[:, asking].mean(-1) if asking.any() else torch.full((heads,), float("nan"))

    maps = [cap.summary_map(layer, head) for head in range(heads)]  # (h, w) each, at the keys' grid
    top = np.array([int(np.argmax(m)) for m in maps], dtype=np.int32)  # raster order: row · w + column
    held = np.array([mass_mask(m, mass).count / m.size for m in maps], dtype=np.float64)
    as_array = lambda x: x.cpu().double().numpy()  # noqa: E731
    return LayerStats(as_array(ent), as_array(distance), as_array(share), top, held, lay.keys_grid, kind)


def staged_head_values(cap: StagedCapture, mass: float = DEFAULT_MASS) -> dict[str, np.ndarray]:
    """Per (layer, head), flattened in that order, each layer with its own head count: the dataset's
    per-head columns of one staged capture, and the keys' grid (``keys_grid_h``, ``keys_grid_w``) of each row."""
    parts: dict[str, list[np.ndarray]] = {name: [] for name in (
        "layer", "head", "entropy", "distance_px", "prefix_share", "top_patch", "mass60_fraction", "keys_grid_h", "keys_grid_w")}
    for layer in range(cap.num_layers):
        stats = layer_stats(cap, layer, mass)
        heads = len(stats.entropy)
        parts["layer"].append(np.full(heads, layer, np.int32))
        parts["head"].append(np.arange(heads, dtype=np.int32))
        parts["entropy"].append(stats.entropy)
        parts["distance_px"].append(stats.distance)
        parts["prefix_share"].append(stats.prefix_share)
        parts["top_patch"].append(stats.top_patch)
        parts["mass60_fraction"].append(stats.mass_fraction)
        parts["keys_grid_h"].append(np.full(heads, stats.keys_grid[0], np.int32))
        parts["keys_grid_w"].append(np.full(heads, stats.keys_grid[1], np.int32))
    return {name: np.concatenate(values) for name, values in parts.items()}
