"""Bytes → a checked RGB picture, or one sentence saying what is wrong with the file.

Pixels are decoded only after the header has passed the size checks, so a decompression bomb (a
tiny PNG declaring 60000 × 60000 pixels) is refused before any memory is spent on it.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")  # JPEG covers MPO (multi-picture) files
MAX_BYTES = 50 * 1024 * 1024  # matches server.maxUploadSize in .streamlit/config.toml
MAX_PIXELS = 50_000_000  # a 24-megapixel photo passes; a 60000 × 60000 header does not
BACKGROUND = (255, 255, 255)
ORIENTATION = 0x0112  # EXIF tag  # transparent areas are composited on white


class ImageError(ValueError):
    """The file is not an image we can use; ``str(error)`` is one sentence for a person."""


@dataclass(frozen=True, eq=False)
class CheckedImage:
    image: Image.Image  # RGB, upright (EXIF orientation applied)
    format: str  # what the bytes really are, whatever the file name says
    notes: tuple[str, ...] = ()  # things a person should know, e.g. "first frame of 12 used"


def _to_rgb(im: Image.Image, notes: list[str]) -> Image.Image:
    if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit / 32-bit greyscale: PIL's convert("L") clips at 255, so scale the range instead.
        a = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode.startswith("I;16") or a.max() > 255 else 255.0
        if im.mode == "F":
            a, top = a - a.min(), max(float(a.max() - a.min()), 1e-12)
        return Image.fromarray(np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8)).convert("RGB")
    has_alpha = im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info
    if has_alpha:
        rgba = im.convert("RGBA")
        if rgba.getextrema()[3][0] < 255:
            notes.append("transparent areas are shown on a white background")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def open_image(data: bytes, name: str = "the file") -> CheckedImage:
    """Decode ``data`` into an upright RGB image; raise :class:`ImageError` with one sentence if it can't be."""
    if not data:
        raise ImageError(f"{name} is empty.")
    if len(data) > MAX_BYTES:
        raise ImageError(f"{name} is {len(data) / 2**20:.0f} MB; the limit is {MAX_BYTES // 2**20} MB.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(f"{name} declares too many pixels; the limit is {MAX_PIXELS / 1e6:.0f} megapixels.") from None
    except UnidentifiedImageError:
        raise ImageError(f"{name} is not an image we can read (use JPEG, PNG, WebP, GIF, BMP or TIFF).") from None
    except Exception as e:
        raise ImageError(f"{name} has a damaged header ({type(e).__name__}).") from None
    w, h = im.size
    if w * h > MAX_PIXELS:
        raise ImageError(
            f"{name} is {w} × {h} pixels; the limit is {MAX_PIXELS / 1e6:.0f} megapixels, please use a smaller copy."
        )
    if w < 1 or h < 1:
        raise ImageError(f"{name} has no pixels.")
    notes: list[str] = []
    frames = getattr(im, "n_frames", 1)
    if frames > 1:
        notes.append(f"animated image: the first of {frames} frames is used")
    try:
        im.seek(0)
        im.load()
    except Exception as e:
        raise ImageError(f"{name} is damaged or truncated and cannot be decoded ({type(e).__name__}).") from None
    fmt = im.format or "unknown"
    try:
        if im.getexif().get(ORIENTATION, 1) not in (1, None):
            im = ImageOps.exif_transpose(im)
            notes.append("turned upright as its EXIF orientation says")
    except Exception:
        notes.append("its EXIF data is damaged and was ignored")
    return CheckedImage(_to_rgb(im, notes), fmt, tuple(notes))
