"""Mass masks, as in DINO (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers").

Keep the smallest set of patches that together hold a fraction X of a map's attention mass (DINO
shows X = 60 %): sort the patches from most to least attention and take them until the running sum
reaches X. The mass is measured over the patches only (prefix tokens left out), as DINO does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from .render import upsample

DEFAULT_MASS = 0.6


@dataclass(frozen=True)
class MassMask:
    keep: np.ndarray  # (h, w) bool: the patches kept
    mass: float  # the share of the map's mass the kept patches hold (≥ the share asked for)

    @property
    def count(self) -> int:
        return int(self.keep.sum())


def mass_mask(grid_map: np.ndarray, mass: float = DEFAULT_MASS) -> MassMask:
    """The smallest set of cells of the non-negative (h, w) map that holds ``mass`` of its total.

    Ties are broken by raster order, so the answer is deterministic.
    """
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass must be in (0, 1], not {mass}")
    values = np.asarray(grid_map, dtype=np.float64)
    if (values < 0).any():
        raise ValueError("a mass mask needs non-negative values")
    total = values.sum()
    flat = values.ravel()
    if total <= 0:
        return MassMask(np.ones(values.shape, dtype=bool), 1.0)
    order = np.argsort(-flat, kind="stable")  # most attention first
    running = np.cumsum(flat[order]) / total
    # A little slack so that exactly reaching X (e.g. 0.6 from summing 0.3 + 0.3) counts as reaching it.
    count = int(np.searchsorted(running, mass - 1e-12)) + 1
    count = min(count, flat.size)
    keep = np.zeros(flat.size, dtype=bool)
    keep[order[:count]] = True
    return MassMask(keep.reshape(values.shape), float(running[count - 1]))


def draw_mask(
    view: Image.Image, keep: np.ndarray, dim: float = 0.65, colour: tuple[int, int, int] = (0, 255, 255)
) -> Image.Image:
    """The S × S ``view`` with the patches outside ``keep`` darkened and the mask's outline drawn."""
    inside = upsample(keep.astype(np.float32), view.size) > 0.5  # (S, S) bool, patch-exact edges
    photo = np.asarray(view.convert("RGB"), dtype=np.float32)
    shaded = np.where(inside[..., None], photo, photo * (1.0 - dim))
    mask_img = Image.fromarray(inside.astype(np.uint8) * 255)
    width = max(1, view.width // 150)
    grown = np.asarray(mask_img.filter(ImageFilter.MaxFilter(2 * width + 1))) > 0
    shrunk = np.asarray(mask_img.filter(ImageFilter.MinFilter(2 * width + 1))) > 0
    edge = grown & ~shrunk  # a band around the boundary, on both sides
    shaded[edge] = colour
    return Image.fromarray(np.clip(shaded + 0.5, 0, 255).astype(np.uint8))
