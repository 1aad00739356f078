"""Does the map land on the object? The share of the class token's attention inside a box drawn around it.

A box is drawn by hand on a photo, in the photo's own pixels (the shipped samples' boxes are in
``assets/boxes.json``). It is carried through the preprocessing the model's view applies — timm's resize of
the shorter side to S / crop_pct and the centre crop of S × S, or the squash to S × S — onto the model's
input, and from there onto the grid of patches: a patch the box covers in part counts by the fraction of
its area inside the box.

The share of a map inside the box is Σ map · coverage / Σ map: the class token's attention to the patches
(its weight on itself and other prefix tokens, which are not on the photo, left out). A map that spreads
evenly over the patches gives exactly the box's share of the grid's area, the baseline; the lift is how
many times the baseline a map puts inside.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Mapping, Sequence

import numpy as np

from .capture import Capture


@dataclass(frozen=True)
class Box:
    """An axis-aligned box in pixels: left ≤ x < right, top ≤ y < bottom (edges, not pixel centres)."""

    left: float
    top: float
    right: float
    bottom: float
    holds: str = ""  # what is inside, in words ("the cat's face")

    def scaled(self, sx: float, sy: float) -> "Box":
        return Box(self.left * sx, self.top * sy, self.right * sx, self.bottom * sy, self.holds)

    def shifted(self, dx: float, dy: float) -> "Box":
        return Box(self.left + dx, self.top + dy, self.right + dx, self.bottom + dy, self.holds)


def sample_boxes() -> Mapping[str, Box]:
    """The object's box on each shipped sample photo (``photos.SAMPLES``), in pixels of the shipped file."""
    raw = json.loads(resources.files("attnviz").joinpath("assets", "boxes.json").read_text("utf-8"))
    return {name: Box(*map(float, entry["box"]), holds=entry["holds"]) for name, entry in raw.items()}


def on_input(box: Box, photo: tuple[int, int], size: int, fit: str = "crop", crop_pct: float = 1.0) -> Box:
    """``box`` on a ``photo`` of (w, h) pixels → the same box on the S × S input that ``Model.view`` makes of it
    (not clipped: :func:`coverage` clips). The arithmetic is torchvision's: ``Resize(int(S / crop_pct))`` gives the
    shorter side that many pixels and the longer ``int(shorter · long / short)``; ``CenterCrop(S)`` starts at
    ``round((side − S) / 2)``."""
    w, h = photo
    if fit == "squash":
        return box.scaled(size / w, size / h)
    if fit != "crop":
        raise ValueError(f"fit must be 'crop' or 'squash', not {fit!r}")
    shorter = int(size / crop_pct)
    new_w, new_h = (shorter, int(shorter * h / w)) if w <= h else (int(shorter * w / h), shorter)
    left, top = int(round((new_w - size) / 2.0)), int(round((new_h - size) / 2.0))
    return box.scaled(new_w / w, new_h / h).shifted(-left, -top)


def coverage(box: Box, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """(h, w) grid: the fraction of each cell's area inside ``box``, for a ``grid`` of equal cells over an input of
    ``size`` = (height, width) pixels. 1 inside, 0 outside, in between on the box's edge."""
    gh, gw = grid
    height, width = size
    ys, xs = np.linspace(0, height, gh + 1), np.linspace(0, width, gw + 1)  # cell edges
    over_y = np.clip(np.minimum(ys[1:], box.bottom) - np.maximum(ys[:-1], box.top), 0, None) / np.diff(ys)  # (h,)
    over_x = np.clip(np.minimum(xs[1:], box.right) - np.maximum(xs[:-1], box.left), 0, None) / np.diff(xs)  # (w,)
    return over_y[:, None] * over_x[None, :]


def inside_share(grid_map: np.ndarray, cover: np.ndarray) -> float:
    """Σ map · coverage / Σ map: the part of a (h, w) map of non-negative weights that falls inside the box."""
    grid_map = np.asarray(grid_map, dtype=np.float64)
    if grid_map.shape != cover.shape:
        raise ValueError(f"the map is {grid_map.shape} but the coverage is {cover.shape}")
    total = grid_map.sum()
    if not total > 0:
        raise ValueError("the map holds no weight to share")
    return float((grid_map * cover).sum() / total)


@dataclass(frozen=True)
class BoxShare:
    """One layer's maps against one box: the mean of heads' share, each head's, and what an even map gives."""

    layer: int  # 0-based
    mean: float  # share of the mean-of-heads map inside the box
    heads: np.ndarray  # (H,) each head's share
    baseline: float  # the box's share of the grid's area: the share of a map that is the same everywhere

    @property
    def lift(self) -> float:
        """How many times the baseline the mean-of-heads map puts inside the box (1 = no better than even)."""
        return self.mean / self.baseline

    @property
    def gain(self) -> float:
        """(share − baseline) / (1 − baseline): the part of the attention an even map leaves outside the box that
        this map brings inside. 0 for an even map, 1 when all of it is inside, < 0 when the map avoids the box.
        Unlike the lift (at most 1 / baseline) it does not favour small boxes, and unlike the share not big ones."""
        return (self.mean - self.baseline) / (1 - self.baseline)


def box_share(cap: Capture, layer: int, cover: np.ndarray) -> BoxShare:
    """:class:`BoxShare` of the class token's map (the page's map) at ``layer`` against ``cover`` (:func:`coverage`
    at that layer's grid)."""
    heads = cap.heads(layer)
    per_head: list[float] = [inside_share(cap.summary_map(layer, h), cover) for h in range(heads)]
    mean_map = cap.summary_map(layer, "mean")
    return BoxShare(layer, inside_share(mean_map, cover), np.array(per_head), float(cover.mean()))


def layer_shares(cap: Capture, box: Box, photo: tuple[int, int], fit: str = "crop",
                 crop_pct: float = 1.0) -> tuple[BoxShare, ...]:
    """:class:`BoxShare` of every layer of ``cap`` for ``box`` drawn on a ``photo`` of (w, h) pixels that was fed to
    the model as ``fit`` (the box carried through the same resize and crop)."""
    size = cap.input.shape[-1]
    on = on_input(box, photo, size, fit, crop_pct)
    return tuple(box_share(cap, layer, coverage(on, cap.map_grid(layer), tuple(cap.input.shape[-2:])))
                 for layer in range(cap.num_layers))




@dataclass(frozen=True)
class Measured:
    """One row of ``python -m bench.defaults``: a sample photo at one input size and one layer."""

    photo: str
    size: int  # input side in pixels
    layers: int  # the model's depth
    share: BoxShare
    top: float  # stats.concentration(...).top of the mean-of-heads map: how concentrated it is


FINAL_PART = 1 / 3  # "final-ish": the last third of the layers (9–12 of 12), where the class token gathers the picture
PICK_RULE = "the largest gain (share − baseline) / (1 − baseline) of the mean-of-heads map in the last third of the layers"


def final_layers(layers: int) -> range:
    """The 0-based layers of the last third of a ``layers``-deep model (at least the last one)."""
    return range(layers - max(1, round(layers * FINAL_PART)), layers)


def pick_default(rows: Sequence[Measured], size: int) -> Measured:
    """The photo and layer the page should open on at ``size``: :data:`PICK_RULE`. A map late in the network is
    what the class token hands to the output, and the one a lesson explains; the gain is fair to big and small
    boxes alike (:attr:`BoxShare.gain`)."""
    chosen = [r for r in rows if r.size == size and r.share.layer in final_layers(r.layers)]
    if not chosen:
        raise ValueError(f"no measured row at {size} px in the final layers")
    return max(chosen, key=lambda r: r.share.gain)
