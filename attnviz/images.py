"""Bytes → a checked RGB picture, or one sentence saying what is wrong with the file.

Pixels are decoded only after the header has passed the size checks, so a decompression bomb (a
tiny PNG declaring 60000 × 60000 pixels) is refused before any memory is spent on it. Everything
happens in memory: nothing a user uploads is ever written to disk.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageError

# JPEG covers MPO (multi-picture) files; HEIF is what iPhones and many Android phones save (pillow-heif),
# AVIF is decoded by Pillow itself.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "HEIF", "AVIF")
MAX_BYTES = 50 * 1024 * 1024  # matches server.maxUploadSize in attnviz_app/config.toml
MAX_PIXELS = 50_000_000  # a 24-megapixel photo passes; a 60000 × 60000 header does not
# The model's view resizes the shorter side to S before cropping: a 1 × 20000 sliver would become
# S × 3.9 M pixels. 100 : 1 still lets 60 × 3000 strips and 4000 × 200 panoramas through.
MAX_ASPECT = 100
BACKGROUND = (255, 255, 255)  # transparent areas are composited on white
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # more than 8 bits a pixel: scaled, not clipped
ORIENTATION = 0x0112  # EXIF tag; values 2…8 ask for a flip or turn
SUPPORTED = "JPEG, PNG, HEIC, AVIF, WebP, GIF, BMP or TIFF"

# Leading bytes of formats we read (to tell "damaged PNG" from "not an image") …
SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG", b"\xff\xd8\xff": "JPEG", b"GIF87a": "GIF", b"GIF89a": "GIF",
    b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"BM": "BMP",
}
# … and of files people often mistake for images.
OTHER_KINDS = {
    b"%PDF": "a PDF document", b"PK\x03\x04": "a ZIP archive", b"<svg": "an SVG drawing",
    b"<?xml": "an XML or SVG file", b"<!doctype html": "a web page", b"<html": "a web page",
}
# Each phrase sniff() can give, by the word a translation catalogue knows it as (``images.kind_<id>``).
KIND_IDS = {
    "a PDF document": "pdf", "a ZIP archive": "zip", "an SVG drawing": "svg", "an XML or SVG file": "xml",
    "a web page": "html", "a video or MP4 file": "video", "picture": "picture",
}


def _register_heif() -> None:
    """Let Pillow open HEIC/HEIF (pillow-heif). Registering twice is harmless; without the package
    HEIC files get the "cannot read" sentence like any other unknown kind."""
    try:
        from pillow_heif import register_heif_opener
    except ImportError:
        return
    # No thumbnails, depth maps or auxiliary pictures: only the photo itself is decoded.
    register_heif_opener(thumbnails=False, depth_images=False, aux_images=False)


_register_heif()


@dataclass(frozen=True, eq=False)
class CheckedImage:
    image: Image.Image  # RGB, upright (EXIF orientation applied)
    format: str  # what the bytes really are, whatever the file name says
    notes: tuple[str, ...] = ()  # things a person should know, e.g. "first frame of 12 used"
    note_keys: tuple[tuple[str, dict], ...] = field(default=(), repr=False)  # (catalogue key, values) per note


def sniff(data: bytes) -> str | None:
    """Name what ``data`` looks like from its first bytes: an image format we read, another kind, or None."""
    head = data[:64].lstrip().lower()
    for magic, kind in OTHER_KINDS.items():
        if head.startswith(magic.lower()):
            return kind
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        return "AVIF" if brand.startswith(b"avi") else "HEIC" if brand[:3] in (
            b"hei", b"hev", b"mif", b"msf") else "a video or MP4 file"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((fmt for magic, fmt in SIGNATURES.items() if data.startswith(magic)), None)


def _wide_to_rgb(im: Image.Image, name: str) -> Image.Image:
    """A 16-bit, 32-bit integer or float picture as 8-bit RGB, scaled by the range its values really use.

    PIL's convert("L") clips at 255: a 16-bit photo would turn white, a float one in 0 … 1 black. 16-bit
    modes use their whole range, 0 … 65535; mode "I" holds widened 8-bit values (0 … 255), 16-bit ones
    (0 … 65535) or anything else; floats have no agreed range. What falls outside a known range is
    stretched from its own smallest to its largest value.
    """
    a = np.asarray(im, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ImageError(f"{name} holds values that are not numbers (NaN or infinite), so it cannot be shown "
                         "to the model.", "not_finite", name=name)
    if im.mode.startswith("I;16"):
        top = 65535.0
    elif im.mode == "I" and a.min() >= 0 and a.max() <= 65535:
        top = 255.0 if a.max() <= 255 else 65535.0
    else:
        a = a - a.min()
        top = max(float(a.max()), 1e-12)
    return Image.fromarray(np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8)).convert("RGB")


def _to_rgb(im: Image.Image, notes: list[tuple[str, str, dict]], name: str = "the file") -> Image.Image:
    if im.mode in WIDE_MODES:
        return _wide_to_rgb(im, name)
    has_alpha = im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info
    if has_alpha:
        rgba = im.convert("RGBA")
        if rgba.getextrema()[3][0] < 255:
            notes.append(("transparent areas are shown on a white background", "transparent", {}))
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def _upright(im: Image.Image, notes: list[tuple[str, str, dict]]) -> Image.Image:
    if im.format == "HEIF":
        # pillow-heif turns the picture as its irot/imir boxes say while decoding (EXIF orientation is then
        # 1); it keeps what the file asked for in info["original_orientation"].
        if im.info.get("original_orientation", 1) in range(2, 9):
            notes.append(("turned upright as its EXIF orientation says", "rotated", {}))
        return im
    try:
        orientation = im.getexif().get(ORIENTATION, 1)
        if orientation in range(2, 9):
            im = ImageOps.exif_transpose(im)
            notes.append(("turned upright as its EXIF orientation says", "rotated", {}))
    except Exception:  # a damaged EXIF block must not cost the picture
        notes.append(("its EXIF data is damaged and was ignored", "bad_exif", {}))
    return im


def open_image(
    data: bytes, name: str = "the file", *, max_side: int | None = None, shorter_side: int | None = None
) -> CheckedImage:
    """Decode ``data`` into an upright RGB image; raise :class:`ImageError` with one sentence if it can't be.

    ``max_side`` shrinks larger pictures to fit that many pixels: a page that keeps decoded images in a
    cache keeps each under ``3 · max_side²`` bytes.

    ``shorter_side`` decodes no more than needed for a picture whose shorter side is at least that: JPEGs
    are decoded at 1/2 … 1/8 scale straight from their DCT coefficients (a 12-megapixel photo in ~20 ms
    instead of ~0.3 s), and any picture twice as large or more is then box-averaged by a whole factor.
    Both steps depend only on the bytes and ``shorter_side``: see :func:`attnviz.photos.read_photo`, which
    picks it from the model so that the page, the CLI and the library feed a model identical pixels.
    """
    if not data:
        raise ImageError(f"{name} is empty.", "empty", name=name)
    mb, limit_mb = len(data) / 2**20, MAX_BYTES // 2**20
    if len(data) > MAX_BYTES:
        raise ImageError(f"{name} is {mb:.0f} MB; the upload limit is {limit_mb} MB.", "too_large", name=name,
                         mb=round(mb), limit=limit_mb)
    looks_like = sniff(data)
    megapixels = MAX_PIXELS // 1_000_000
    try:
        # PIL refuses more than 2 × Image.MAX_IMAGE_PIXELS (179 M) here, from the header alone; our lower
        # limit is checked right after, still before any pixel is decoded.
        im = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:
        raise ImageError(f"{name} declares far too many pixels; the limit is {megapixels} megapixels.",
                         "bomb", name=name, limit=megapixels) from None
    except UnidentifiedImageError:
        if looks_like in (*SIGNATURES.values(), "WEBP", "HEIC", "AVIF"):
            raise ImageError(f"{name} looks like a {looks_like} file but its header is damaged.",
                             "bad_header", name=name, format=looks_like) from None
        if looks_like:
            raise ImageError(f"{name} is {looks_like}, which this app cannot read (use {SUPPORTED}).",
                             "other_kind", name=name, kind=looks_like, formats=SUPPORTED) from None
        raise ImageError(f"{name} is not an image this app can read (use {SUPPORTED}).",
                         "unreadable", name=name, formats=SUPPORTED) from None
    except Exception:  # plugins raise many kinds on broken headers
        raise ImageError(f"{name} looks like a {looks_like or 'picture'} file but its header is damaged.",
                         "bad_header", name=name, format=looks_like or "picture") from None
    w, h = im.size
    if w < 1 or h < 1:
        raise ImageError(f"{name} has no pixels.", "no_pixels", name=name)
    if w * h > MAX_PIXELS:
        raise ImageError(
            f"{name} is {w} × {h} pixels; the limit is {megapixels} megapixels, please use a smaller copy.",
            "too_many_pixels", name=name, w=w, h=h, limit=megapixels,
        )
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise ImageError(
            f"{name} is {w} × {h} pixels, too long and thin; one side may be at most {MAX_ASPECT} times the other.",
            "too_thin", name=name, w=w, h=h, ratio=MAX_ASPECT,
        )
    notes: list[tuple[str, str, dict]] = []
    frames = getattr(im, "n_frames", 1)
    if frames > 1 and im.format != "MPO":  # MPO: a phone photo plus a depth or preview picture
        notes.append((f"animated image: the first of {frames} frames is used", "animated", {"frames": frames}))
    try:
        im.seek(0)
        scale = min(max_side / max(w, h) if max_side else 1.0, shorter_side / min(w, h) if shorter_side else 1.0)
        if scale < 1 and im.format in ("JPEG", "MPO"):
            im.draft(im.mode, (int(w * scale) + 1, int(h * scale) + 1))  # both sides stay ≥ the target
        im.load()
    except Exception:
        raise ImageError(f"{name} is damaged or cut short, so its pixels cannot be decoded.",
                         "truncated", name=name) from None
    fmt = "JPEG" if im.format == "MPO" else "HEIC" if im.format == "HEIF" else im.format or "unknown"
    try:
        rgb = _to_rgb(_upright(im, notes), notes, name)
        if shorter_side and min(rgb.size) >= 2 * shorter_side:
            rgb = rgb.reduce(min(rgb.size) // shorter_side)  # box average over whole k × k blocks
        if max_side and max(rgb.size) > max_side:
            rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    except ImageError:
        raise
    except Exception:  # an exotic colour mode PIL cannot convert, or pixels that fail late
        raise ImageError(f"{name} uses a colour mode we cannot convert ({im.mode}).",
                         "mode", name=name, mode=im.mode) from None
    return CheckedImage(rgb, fmt, tuple(n for n, _, _ in notes), tuple((k, v) for _, k, v in notes))


def as_rgb(image: Image.Image, name: str = "the picture") -> Image.Image:
    """Any PIL image as the upright RGB picture :func:`open_image` makes of the same pixels.

    :func:`attnviz.capture` calls it, so a picture you opened yourself (``Image.open(path)``) reaches the
    model exactly as the page and the CLI show it: turned upright as its EXIF orientation says,
    transparency composited on :data:`BACKGROUND`, 16-bit and float pixels scaled by their range rather
    than clipped. An RGB picture with nothing to turn or composite is returned as it is. Raises
    :class:`ImageError` for an empty picture, one too long and thin, NaN or infinite values, or a colour
    mode PIL cannot convert. (Only :func:`open_image` decodes a file at reduced size: a large picture
    decoded in full is resized by the model's view instead, so it may differ from the page by rounding.)
    """
    w, h = image.size
    if w < 1 or h < 1:
        raise ImageError(f"{name} has no pixels.", "no_pixels", name=name)
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise ImageError(
            f"{name} is {w} × {h} pixels, too long and thin; one side may be at most {MAX_ASPECT} times the other.",
            "too_thin", name=name, w=w, h=h, ratio=MAX_ASPECT,
        )
    try:
        image.load()
    except Exception:
        raise ImageError(f"{name} is damaged or cut short, so its pixels cannot be decoded.",
                         "truncated", name=name) from None
    try:
        upright = _upright(image, [])
        if upright.mode == "RGB" and "transparency" not in upright.info:
            return upright
        return _to_rgb(upright, [], name)
    except ImageError:
        raise
    except Exception:
        raise ImageError(f"{name} uses a colour mode we cannot convert ({image.mode}).",
                         "mode", name=name, mode=image.mode) from None
