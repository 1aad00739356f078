"""One source of truth for preprocessing: a photo's bytes → the upright picture a model is fed.

The page, the command line and library users all call :func:`read_photo`, so a photo gives the same
pixels, the same input tensor and the same attention wherever it is opened. The decoding is reduced to
what the model needs (:func:`decode_side`): a 12-megapixel phone JPEG is decoded at 1/4 or 1/8 scale
straight from its DCT coefficients, so it costs tens of milliseconds instead of a second, and a cache of
decoded photos holds about a megapixel each instead of twelve.

    model = load_model()
    checked = read_photo(Path("IMG_0001.HEIC").read_bytes(), model)
    cap = capture(model, checked.image)
"""
from __future__ import annotations

import math
import os
import stat
from importlib import resources
from pathlib import Path

import attnviz.images as images
from .images import CheckedImage, ImageError, open_image
from .models import Fit, Model

SAMPLES = ("cat", "coffee", "astronaut", "rocket")  # freely licensed photos shipped in attnviz/assets (SOURCES.md)
LONGEST = 16  # the longer side is kept at most 16 decode sides (4704 px at 196 px): 60 × 3000 strips stay whole
CROP_NOTE_BELOW = 0.5  # say so when the centre crop shows the model less than half of a long picture


def sample(name: str) -> Path:
    """The path of a sample photo shipped with attnviz: ``sample("cat")``."""
    if name not in SAMPLES:
        raise ValueError(f"{name!r} is not a sample photo; the samples are {', '.join(SAMPLES)}.")
    return Path(str(resources.files("attnviz").joinpath("assets", f"{name}.jpg")))


def decode_side(model: Model) -> int:
    """The shorter side a photo is decoded to (at least): 1.5 × the side timm's resize gives it.

    The resize to ``size / crop_pct`` is then always an antialiased downscale by 1.5× or more from real
    pixels. For a 12-megapixel JPEG and the default model that allows 1/8-scale decoding (504 × 378 in
    ~23 ms of CPU, against ~35 ms at 1/4 and ~0.2 s in full); the model's input moves by 0.25 grey levels
    on average against a full decode, and its attention weights by ≤ 3e-3 — the same for every caller.
    """
    return math.ceil(1.5 * math.ceil(model.size / model.data_config["crop_pct"]))


def read_photo(data: bytes, model: Model, name: str = "the file") -> CheckedImage:
    """``data`` decoded upright, in RGB, at the size ``model`` needs; raises :class:`ImageError`.

    At most ``LONGEST · decode_side`` pixels a side (4704 px for the default model): ≤ 8.3 MB decoded.
    """
    side = decode_side(model)
    return open_image(data, name, shorter_side=side, max_side=LONGEST * side)


def read_file(path: str | Path, name: str | None = None, limit: int | None = None) -> bytes:
    """A photo file's bytes, checked before they are read: a regular file (a FIFO would block for ever, a
    device never end) of at most ``limit`` bytes by its size (default :data:`attnviz.images.MAX_BYTES`,
    50 MB): a 3 GB file is refused without being read.

    The file is opened without blocking and checked on the open descriptor, so it cannot be swapped for a
    pipe between the check and the read; a file that grows meanwhile is read only to ``limit`` + 1 bytes.
    Raises :class:`ImageError`; ``OSError`` when the file cannot be opened at all (missing, no permission).
    """
    path = Path(path)
    name = path.name if name is None else name
    limit = images.MAX_BYTES if limit is None else limit
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ImageError(f"{name} is not a regular file (a folder, a pipe or a device cannot be read as a "
                             "photo).", "not_regular", name=name)
        if st.st_size > limit:
            raise _too_large(name, st.st_size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise _too_large(name, len(data), limit)
    return data


def _too_large(name: str, size: int, limit: int) -> ImageError:
    mb, limit_mb = round(size / 2**20), limit // 2**20
    return ImageError(f"{name} is {mb} MB; attnviz reads photos of at most {limit_mb} MB.", "file_too_large",
                      name=name, mb=mb, limit=limit_mb)


def load_photo(path: str | Path, model: Model) -> CheckedImage:
    """:func:`read_photo` for a file on disk (read by :func:`read_file`: regular files of ≤ 50 MB only)."""
    path = Path(path)
    return read_photo(read_file(path), model, path.name)


def view_notes(size: tuple[int, int], model: Model, fit: Fit) -> tuple[tuple[str, dict], ...]:
    """What a person should know about how ``model`` sees a picture of ``size`` = (w, h): the catalogue
    keys (``images.note_<key>``) and their values.

    A picture with fewer pixels than the model has patches is blown up until each pixel covers several
    patches; a long strip under the centre crop loses most of its length.
    """
    w, h = size
    grid_h, grid_w = model.grid
    notes: list[tuple[str, dict]] = []
    if w * h < grid_h * grid_w:
        notes.append(("tiny", {"w": w, "h": h, "grid_h": grid_h, "grid_w": grid_w}))
    # timm resizes the shorter side to size / crop_pct and crops a size × size square from the middle:
    # this share of the longer side reaches the model.
    kept = model.data_config["crop_pct"] * min(w, h) / max(w, h)
    if fit == "crop" and kept < CROP_NOTE_BELOW:
        notes.append(("cropped", {"w": w, "h": h, "percent": round(100 * kept)}))
    return tuple(notes)
