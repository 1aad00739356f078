"""Per-head statistics of any capture: each layer at its own grids, with its own heads — the numbers
``attnviz dataset`` writes for every model (a plain ViT's layers share one grid; Swin's, PiT's, … do not).

For layer l, every head h, in the same units as :mod:`attnviz.stats`:

- **Entropy** (nats) of the head's summary row(s): the class token's row over all of the layer's keys
  where the class token is a query at l (``summary_kind(l) == "cls"``), else the mean over the layer's
  patch query rows (each window row of :attr:`~attnviz.stages.LayerLayout.windows` that is a grid cell) of
  each row's entropy (:func:`attnviz.stats.layer_head_stats`).
- **Prefix share**: of those same rows, the part of the weights that goes to prefix keys (a class
  token among the keys), averaged the same way.
- **Mean attention distance** in pixels of the model input (Dosovitskiy et al. 2021, Fig. 7): for every
  query that is a grid cell, its weights over the key cells, re-normalised to sum to 1, against the
  distance from its cell centre to each key's cell centre — the queries' cells ``S / h × S / w`` pixels
  on the layer's grid, the keys' on its keys' grid (pooled keys are coarser) — averaged over those
  queries. NaN where no grid cell is a query at l (CaiT's and XCiT's class attention: the class token
  alone asks, and it has no place on the grid).
- **Top patch**: the most-attended cell of the summary map (:meth:`~attnviz.capture.Capture.summary_map`),
  its raster index on the layer's keys' grid (``row · w + column``), and the **mass fraction**: the
  share of that grid's cells that hold ``mass`` of the map (:func:`attnviz.masks.mass_mask`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .masks import DEFAULT_MASS, mass_mask
from .capture import Capture
from .stats import layer_head_stats


@dataclass(frozen=True)
class LayerStats:
    entropy: np.ndarray  # (H_l,) nats
    distance: np.ndarray  # (H_l,) pixels of the model input; NaN without a grid cell among the queries
    prefix_share: np.ndarray  # (H_l,) in [0, 1]
    top_patch: np.ndarray  # (H_l,) raster index on ``keys_grid``
    mass_fraction: np.ndarray  # (H_l,) in (0, 1]
    keys_grid: tuple[int, int]  # the grid ``top_patch`` and the summary map refer to
    rows: str  # "cls" or "mean_received": whose rows entropy and prefix share describe ("cls": the class token's)


def layer_stats(cap: Capture, layer: int, mass: float = DEFAULT_MASS) -> LayerStats:
    """The statistics of every head of ``layer`` (see the module's docstring)."""
    lay = cap.layout(layer)
    ent, distance, share = layer_head_stats(cap, layer)
    heads = len(ent)
    kind = cap.summary_kind(layer)
    maps = [cap.summary_map(layer, head) for head in range(heads)]  # (h, w) each, at the keys' grid
    top = np.array([int(np.argmax(m)) for m in maps], dtype=np.int32)  # raster order: row · w + column
    held = np.array([mass_mask(m, mass).count / m.size for m in maps], dtype=np.float64)
    as_array = lambda x: x.cpu().double().numpy()  # noqa: E731
    return LayerStats(as_array(ent), as_array(distance), as_array(share), top, held, lay.keys_grid, kind)


def head_values(cap: Capture, mass: float = DEFAULT_MASS) -> dict[str, np.ndarray]:
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
