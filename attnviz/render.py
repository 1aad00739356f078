"""Maps → pixels: upsample an (h, w) patch map to the picture and blend it in with a colormap."""
from __future__ import annotations

import matplotlib
import numpy as np
from PIL import Image, ImageDraw

COLORMAPS = ("inferno", "viridis", "magma", "jet", "gray")


def upsample(grid_map: np.ndarray, size: tuple[int, int], smooth: bool = False) -> np.ndarray:
    """(h, w) → (H, W) float32. Nearest keeps each patch a flat square; smooth is bicubic."""
    resample = Image.Resampling.BICUBIC if smooth else Image.Resampling.NEAREST
    picture = Image.fromarray(np.asarray(grid_map, dtype=np.float32), mode="F")
    return np.asarray(picture.resize(size, resample=resample), dtype=np.float32)


def normalise(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Map [lo, hi] (default: the values' own min and max) onto [0, 1]."""
    lo = float(values.min()) if lo is None else lo
    hi = float(values.max()) if hi is None else hi
    return np.clip((values - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros_like(values)


def colorize(unit: np.ndarray, cmap: str = "inferno") -> np.ndarray:
    """[0, 1] values → (..., 3) uint8 RGB through a matplotlib colormap."""
    lut = (matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3] * 255 + 0.5).astype(np.uint8)
    return lut[np.round(unit * 255).astype(np.intp)]


def overlay(
    view: Image.Image,
    grid_map: np.ndarray,
    alpha: float = 0.6,
    cmap: str = "inferno",
    smooth: bool = False,
) -> Image.Image:
    """Blend the colour-mapped (h, w) map over ``view`` (the S × S picture the model saw).

    The colour scale runs from the map's smallest value (dark) to its largest (bright).
    """
    heat = colorize(normalise(upsample(grid_map, view.size, smooth)), cmap)  # (S, S, 3)
    photo = np.asarray(view.convert("RGB"), dtype=np.float32)
    blended = (1.0 - alpha) * photo + alpha * heat.astype(np.float32)
    return Image.fromarray(np.clip(blended + 0.5, 0, 255).astype(np.uint8))


def colorbar(cmap: str = "inferno", width: int = 256, height: int = 12) -> Image.Image:
    """A horizontal strip of the colormap, low on the left."""
    ramp = colorize(np.linspace(0.0, 1.0, width), cmap)  # (width, 3)
    return Image.fromarray(np.repeat(ramp[None], height, axis=0))


def enlarge(picture: Image.Image, side: int = 448) -> Image.Image:
    """Scale up by a whole factor until the longer side is ≥ ``side``: each model pixel a crisp block."""
    scale = max(1, -(-side // max(picture.size)))
    return picture.resize((picture.width * scale, picture.height * scale), resample=Image.Resampling.NEAREST)


def outline(
    picture: Image.Image, grid: tuple[int, int], cells: list[tuple[int, int, tuple]], width: int | None = None
) -> Image.Image:
    """A copy of ``picture`` with a coloured frame round each (row, col, colour) cell of the (h, w) grid."""
    framed = picture.copy()
    draw = ImageDraw.Draw(framed)
    ch, cw = picture.height / grid[0], picture.width / grid[1]
    width = width or max(2, round(min(ch, cw) / 8))
    for row, col, colour in cells:
        draw.rectangle((col * cw, row * ch, (col + 1) * cw - 1, (row + 1) * ch - 1), outline=colour, width=width)
    return framed


def outline_region(picture: Image.Image, mask: np.ndarray, colour: tuple, width: int | None = None) -> Image.Image:
    """A copy of ``picture`` with a line along every edge between a cell of ``mask`` (h, w bool) and one
    outside it (or the picture's border): a window outlined, in as many pieces as a shift cuts it into."""
    framed = picture.copy()
    draw = ImageDraw.Draw(framed)
    h, w = mask.shape
    ch, cw = picture.height / h, picture.width / w
    width = width or max(2, round(min(ch, cw) / 4))
    padded = np.pad(mask, 1)
    for r, c in zip(*np.nonzero(mask)):
        x0, y0, x1, y1 = c * cw, r * ch, (c + 1) * cw - 1, (r + 1) * ch - 1
        if not padded[r, c + 1]:  # above
            draw.line((x0, y0, x1, y0), fill=colour, width=width)
        if not padded[r + 2, c + 1]:  # below
            draw.line((x0, y1, x1, y1), fill=colour, width=width)
        if not padded[r + 1, c]:  # left
            draw.line((x0, y0, x0, y1), fill=colour, width=width)
        if not padded[r + 1, c + 2]:  # right
            draw.line((x1, y0, x1, y1), fill=colour, width=width)
    return framed
