"""Write a corpus of bad, dangerous and odd-but-valid image files, each with what must happen to it.

Nothing here is a stored binary: every file is made from code, so the corpus can be read, changed
and regenerated. ``python tests/make_corpus.py DIR`` writes the files and an ``index.txt``;
tests call :func:`write_corpus` into a temporary folder.

Each :class:`Entry` says either ``ok=True`` (decodes; optional note pattern, decoded size and probe
colours at fractional positions of the upright picture) or ``ok=False`` with the pattern of the one
sentence the user must see.
"""
from __future__ import annotations

import functools
import io
import re
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

Colour = tuple[int, int, int]
RED, GREEN, BLUE, WHITE, BLACK = (230, 30, 30), (30, 200, 40), (30, 40, 220), (255, 255, 255), (0, 0, 0)


@dataclass(frozen=True)
class Entry:
    name: str  # the file name a user would upload, extension as they had it
    data: bytes
    kind: str  # "not-image" | "broken" | "dangerous" | "odd"
    ok: bool
    expect: str = ""  # regex: the error sentence (ok=False) or a note that must be present (ok=True)
    size: tuple[int, int] | None = None  # decoded (width, height), upright
    probes: tuple[tuple[tuple[float, float], Colour], ...] = field(default=())  # ((x, y) in 0…1, RGB)
    no_note: str = ""  # regex no note may match (e.g. "animated" for a two-picture phone JPEG)

    def matches(self, message: str) -> bool:
        return re.search(self.expect, message) is not None


# --- pictures ---------------------------------------------------------------------------------

def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth, photo-like RGB picture (gradients, a yellow disc, mild noise): compresses like a photo."""
    rng = np.random.default_rng(seed)
    small_w, small_h = min(width, 512), min(height, 512)  # drawn small, then resized: fast at 24 MP
    v, u = np.linspace(0, 1, small_h)[:, None], np.linspace(0, 1, small_w)[None, :]  # (h, 1), (1, w)
    r, g = 255 * u + 0 * v, 255 * v + 0 * u
    b = 255 * (0.5 + 0.5 * np.sin(6.28 * (u + v)))
    disc = (u - 0.6) ** 2 + (v - 0.4) ** 2 < 0.04
    r, g, b = np.where(disc, 250, r), np.where(disc, 220, g), np.where(disc, 30, b)
    small = Image.fromarray(np.stack([r, g, b], -1).astype(np.uint8))  # (h, w, 3)
    a = np.asarray(small.resize((width, height), Image.Resampling.BILINEAR)).astype(np.int16)
    noise = rng.integers(-6, 7, (min(height, 256), min(width, 256), 1), dtype=np.int16)
    a += np.tile(noise, (-(-height // noise.shape[0]), -(-width // noise.shape[1]), 1))[:height, :width]
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def quadrants(width: int, height: int) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right: any rotation or flip shows."""
    a = np.empty((height, width, 3), np.uint8)
    h2, w2 = height // 2, width // 2
    a[:h2, :w2], a[:h2, w2:], a[h2:, :w2], a[h2:, w2:] = RED, GREEN, BLUE, WHITE
    return Image.fromarray(a)


QUADRANT_PROBES = (((0.25, 0.25), RED), ((0.75, 0.25), GREEN), ((0.25, 0.75), BLUE), ((0.75, 0.75), WHITE))


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    im.save(buffer, format=fmt, **kw)
    return buffer.getvalue()


def heif_bytes(im: Image.Image, exif: bytes) -> bytes:
    """HEIC as an iPhone saves it (pillow-heif's encoder at its fastest preset: ~1 s for 12 megapixels)."""
    from pillow_heif import from_pillow

    buffer = io.BytesIO()
    heif = from_pillow(im)
    heif.save(buffer, quality=85, exif=exif, enc_params={"preset": "ultrafast"})
    return buffer.getvalue()


# --- hand-made bytes --------------------------------------------------------------------------

def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width × height (8-bit RGB) with a correct CRC and no pixel data at all."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real small JPEG whose SOF0 marker is patched to declare width × height."""
    data = bytearray(encode(photo(16, 16), "JPEG", quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def gif_declaring(width: int, height: int) -> bytes:
    """A GIF header (logical screen width × height, 16-bit fields) with one 1 × 1 frame."""
    data = bytearray(encode(Image.new("P", (1, 1)), "GIF"))
    data[6:10] = struct.pack("<HH", width, height)
    return bytes(data)


def exif_block(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def with_app1(jpeg: bytes, body: bytes) -> bytes:
    """Insert an APP1 segment holding ``body`` right after the SOI marker."""
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def stored_for(upright: Image.Image, orientation: int) -> Image.Image:
    """The picture a camera stores so that applying EXIF ``orientation`` shows ``upright``."""
    undo = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}
    return upright.transpose(undo[orientation])


MINIMAL_PDF = b"""%PDF-1.4
1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj
2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj
3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >> endobj
trailer << /Root 1 0 R >>
%%EOF
"""
SVG = b"""<?xml version="1.0"?>
<svg xmlns="http://www.w3.org/2000/svg" width="200" height="200"><circle cx="100" cy="100" r="80" fill="red"/></svg>
"""
HTML = b"<!doctype html><html><body><h1>Not a cat</h1><script>alert(1)</script></body></html>\n"


def zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("cat.jpg", encode(photo(32, 32), "JPEG"))
    return buffer.getvalue()


# --- the corpus -------------------------------------------------------------------------------

NOT_IMAGE = r"is not an image this app can read \(use JPEG, PNG"
OTHER = r"which this app cannot read \(use JPEG, PNG"
DAMAGED = r"is damaged or cut short"
BAD_HEADER = r"looks like a (PNG|JPEG|GIF|HEIC|AVIF|picture) file but its header is damaged"
TOO_MANY = r"megapixels"


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Every corpus entry, built in memory once per process (≈ 1.3 s, most of it the 24-megapixel JPEG and the
    HEIC files): six test modules read it at collection."""
    rng = np.random.default_rng(6)
    jpeg = encode(photo(320, 240), "JPEG", quality=90)
    png = encode(photo(320, 240), "PNG")
    out: list[Entry] = []

    def bad(name: str, data: bytes, kind: str, expect: str) -> None:
        out.append(Entry(name, data, kind, ok=False, expect=expect))

    def good(name: str, data: bytes, size: tuple[int, int], expect: str = "", probes=(), no_note: str = "") -> None:
        out.append(Entry(name, data, "odd", ok=True, expect=expect, size=size, probes=tuple(probes), no_note=no_note))

    # Not an image at all.
    bad("empty.jpg", b"", "not-image", r"is empty")
    bad("notes.jpg", b"These are my lecture notes, not a picture.\n" * 20, "not-image", NOT_IMAGE)
    bad("page.png", HTML, "not-image", r"is a web page, " + OTHER)
    bad("paper.pdf", MINIMAL_PDF, "not-image", r"is a PDF document, " + OTHER)
    bad("drawing.svg", SVG, "not-image", r"SVG.*, " + OTHER)
    bad("photos.zip", zip_bytes(), "not-image", r"is a ZIP archive, " + OTHER)
    bad("photos.jpg", zip_bytes(), "not-image", r"is a ZIP archive, " + OTHER)
    bad("noise.jpg", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), "not-image", NOT_IMAGE)
    bad("iphone.heic", b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64), "broken",
        r"looks like a HEIC file but its header is damaged")

    # Broken images.
    bad("truncated.jpg", jpeg[: len(jpeg) // 2], "broken", DAMAGED)
    bad("truncated.png", png[: len(png) // 2], "broken", DAMAGED)
    bad("header_only.jpg", jpeg[:200], "broken", f"{DAMAGED}|{BAD_HEADER}")
    bad("bad_crc.png", png[:29] + bytes([png[29] ^ 0xFF]) + png[30:], "broken", BAD_HEADER)  # IHDR CRC wrong
    bad("bad_ihdr.png", b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", b"\x00" * 13) + png[33:], "broken", BAD_HEADER)
    bad("png_magic_only.png", b"\x89PNG\r\n\x1a\n", "broken", BAD_HEADER)
    garbage_exif = b"Exif\x00\x00" + b"MM\x00\x2a\x00\x00\x00\x08" + b"\xff\xff" + rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    out.append(Entry("corrupt_exif.jpg", with_app1(jpeg, garbage_exif), "broken", ok=True, size=(320, 240)))
    out.append(Entry("bad_orientation.jpg", with_app1(jpeg, exif_block(9)), "broken", ok=True, size=(320, 240),
                     no_note=r"upright"))

    # Dangerous sizes: refused from the header, before any pixel is decoded.
    bad("bomb_60000.png", png_header_only(60000, 60000), "dangerous", TOO_MANY)
    bad("bomb_8000.png", png_header_only(8000, 8000), "dangerous", TOO_MANY)  # over our limit, under PIL's
    bad("bomb_65000.jpg", jpeg_declaring(65000, 65000), "dangerous", TOO_MANY)
    bad("bomb_65535.gif", gif_declaring(65535, 65535), "dangerous", TOO_MANY)
    bad("sliver.png", encode(Image.new("RGB", (20000, 1), RED), "PNG"), "dangerous", r"long and thin")

    # Odd but valid.
    cmyk = Image.new("CMYK", (64, 48), (0, 255, 255, 0))  # pure red ink
    good("cmyk.jpg", encode(cmyk, "JPEG", quality=95), (64, 48), probes=[((0.5, 0.5), (237, 28, 36))])
    grey16 = Image.fromarray(np.full((40, 60), 32768, np.uint16))
    good("grey16.png", encode(grey16, "PNG"), (60, 40), probes=[((0.5, 0.5), (128, 128, 128))])
    ramp16 = Image.fromarray(np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (16, 1)))
    good("grey16_ramp.tif", encode(ramp16, "TIFF"), (64, 16), probes=[((0.0, 0.5), BLACK), ((0.99, 0.5), WHITE)])
    good("grey8.png", encode(Image.new("L", (50, 30), 200), "PNG"), (50, 30), probes=[((0.5, 0.5), (200, 200, 200))])
    good("bilevel.png", encode(Image.new("1", (33, 17), 1), "PNG"), (33, 17), probes=[((0.5, 0.5), WHITE)])
    rgba = Image.new("RGBA", (40, 40), (0, 0, 0, 0))
    rgba.paste((30, 40, 220, 255), (0, 0, 20, 40))  # left half opaque blue, right half transparent
    good("rgba.png", encode(rgba, "PNG"), (40, 40), r"white background",
         [((0.25, 0.5), BLUE), ((0.75, 0.5), WHITE)])
    good("grey_alpha.png", encode(Image.new("LA", (20, 20), (0, 0)), "PNG"), (20, 20), r"white background",
         [((0.5, 0.5), WHITE)])
    good("opaque_rgba.png", encode(Image.new("RGBA", (20, 20), RED + (255,)), "PNG"), (20, 20),
         probes=[((0.5, 0.5), RED)], no_note=r"background")
    palette = Image.new("P", (40, 40), 1)
    palette.putpalette([0, 0, 0, *RED, *GREEN] + [0] * 759)
    palette.paste(2, (0, 0, 20, 40))
    good("palette.png", encode(palette, "PNG", transparency=1), (40, 40), r"white background",
         [((0.25, 0.5), GREEN), ((0.75, 0.5), WHITE)])
    frames = [Image.new("RGB", (30, 20), c) for c in (RED, GREEN, BLUE)]
    good("animated.gif", encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0),
         (30, 20), r"first of 3 frames", [((0.5, 0.5), RED)])
    good("animated.webp", encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100,
         lossless=True), (30, 20), r"first of 3 frames", [((0.5, 0.5), RED)])
    good("animated.png", encode(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=100),
         (30, 20), r"first of 3 frames", [((0.5, 0.5), RED)])
    upright = quadrants(120, 80)
    for orientation in (6, 8, 3):
        stored = stored_for(upright, orientation)
        data = encode(stored, "JPEG", quality=95, exif=exif_block(orientation))
        good(f"exif_orientation_{orientation}.jpg", data, (120, 80), r"upright", QUADRANT_PROBES)
    good("exif_orientation_6.png", encode(stored_for(upright, 6), "PNG", exif=exif_block(6)), (120, 80),
         r"upright", QUADRANT_PROBES)
    good("two_pictures.jpg", encode(photo(64, 48), "MPO", save_all=True, append_images=[photo(32, 24, 1)]),
         (64, 48), no_note=r"animated|frame")
    good("one_pixel.png", encode(Image.new("RGB", (1, 1), GREEN), "PNG"), (1, 1), probes=[((0.5, 0.5), GREEN)])
    good("eight.png", encode(quadrants(8, 8), "PNG"), (8, 8), probes=QUADRANT_PROBES)
    good("panorama.jpg", encode(photo(4000, 200), "JPEG", quality=85), (4000, 200))
    good("strip.png", encode(quadrants(60, 3000), "PNG"), (60, 3000), probes=QUADRANT_PROBES)
    good("photo.webp", encode(quadrants(64, 48), "WEBP", lossless=True), (64, 48), probes=QUADRANT_PROBES)
    good("photo.bmp", encode(quadrants(64, 48), "BMP"), (64, 48), probes=QUADRANT_PROBES)
    good("photo.tif", encode(quadrants(64, 48), "TIFF", compression="tiff_lzw"), (64, 48), probes=QUADRANT_PROBES)
    good("really_png.jpg", encode(quadrants(64, 48), "PNG"), (64, 48), probes=QUADRANT_PROBES)
    good("progressive.jpg", encode(quadrants(64, 48), "JPEG", quality=95, progressive=True), (64, 48),
         probes=QUADRANT_PROBES)
    good("float.tif", encode(Image.fromarray(np.tile(np.linspace(-1, 1, 64, dtype=np.float32), (8, 1))), "TIFF"),
         (64, 8), probes=[((0.0, 0.5), BLACK), ((0.99, 0.5), WHITE)])
    good("photo_24mp.jpg", encode(photo(6000, 4000, seed=24), "JPEG", quality=80), (6000, 4000),
         probes=[((0.6, 0.4), (250, 220, 30))])
    # Phone photos: 12-megapixel pictures stored sideways with an orientation tag, as phones save them.
    phone = quadrants(4032, 3024)
    good("phone_12mp_rotated.jpg", encode(stored_for(phone, 6), "JPEG", quality=90, exif=exif_block(6)),
         (4032, 3024), r"upright", QUADRANT_PROBES)
    good("iphone_12mp_rotated.heic", heif_bytes(stored_for(phone, 6), exif_block(6)), (4032, 3024), r"upright",
         QUADRANT_PROBES)
    good("phone_rotated.avif", encode(stored_for(quadrants(640, 480), 8), "AVIF", quality=90, speed=10,
         exif=exif_block(8)), (640, 480), r"upright", QUADRANT_PROBES)
    good("photo.avif", encode(quadrants(64, 48), "AVIF", quality=95, speed=10), (64, 48), probes=QUADRANT_PROBES)
    heic = heif_bytes(photo(640, 480), exif_block(1))
    bad("cut.heic", heic[: len(heic) // 2], "broken", f"{DAMAGED}|{BAD_HEADER}")
    good("../../../etc/passwd.png", encode(quadrants(16, 16), "PNG"), (16, 16), probes=QUADRANT_PROBES)
    return tuple(out)


def file_name(entry: Entry) -> str:
    """Where ``entry`` lives inside the corpus folder (a name with directories is flattened)."""
    return entry.name.replace("/", "_").lstrip(".") if "/" in entry.name else entry.name


def write_corpus(directory: str | Path) -> list[tuple[Entry, Path]]:
    """Write every entry into ``directory``; return each entry with its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in entries():
        path = directory / file_name(entry)
        path.write_bytes(entry.data)
        written.append((entry, path))
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    lines = []
    for entry, path in write_corpus(target):
        verdict = f"ok {entry.expect}".strip() if entry.ok else f"error /{entry.expect}/"
        lines.append(f"{path.name}\t{entry.kind}\t{len(entry.data)} bytes\t{verdict}")
    (target / "index.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} files written to {target}")
