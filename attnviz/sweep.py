"""The layer sweep: the class token's map from layer 1 to L as an animated GIF, for slides.

Each frame is :func:`attnviz.render.overlay` of one layer's map with a strip along the bottom that
fills as the layers go by (no words, so the same file serves every language), enlarged by a whole
factor to at least 448 px with crisp patches. GIF keeps 256 colours per frame, so colours are close
to, not exactly, the PNG's.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

import attnviz.render as render
from .capture import Capture, Head
from .html import _picture, summary_map

FRAME_MS = 700  # per layer; the last layer stays longer
LAST_MS = 2000
STRIP_PX = 4  # at the model's resolution, under the S × S picture


def frames(
    cap: Capture, head: Head = "mean", alpha: float = 0.6, cmap: str = "inferno", picture: Image.Image | None = None,
) -> list[Image.Image]:
    """One RGB frame per layer, layer 1 first, at the model's resolution: (S + 4) × S, the map over the
    photo and a progress strip under it."""
    view = _picture(cap, picture)
    out = []
    for layer in range(cap.num_layers):
        shown = render.overlay(view, summary_map(cap, layer, head), alpha=alpha, cmap=cmap)
        frame = Image.new("RGB", (shown.width, shown.height + STRIP_PX), (255, 255, 255))
        frame.paste(shown, (0, 0))
        done = round(shown.width * (layer + 1) / cap.num_layers)
        strip = (0, shown.height + 1, done - 1, shown.height + STRIP_PX - 1)
        ImageDraw.Draw(frame).rectangle(strip, fill=(11, 99, 197))
        out.append(frame)
    return out


def sweep_gif(cap: Capture, head: Head = "mean", side: int = 448, **kwargs) -> bytes:
    """The animated GIF of :func:`frames`, each enlarged by a whole factor to ≥ ``side`` px, looping forever."""
    shots = frames(cap, head, **kwargs)
    scale = max(1, -(-side // shots[0].width))
    buffer = io.BytesIO()
    durations = [FRAME_MS] * (len(shots) - 1) + [LAST_MS]
    # one adaptive palette per frame, no dithering (each patch stays one flat colour), then enlarged
    paletted = [
        f.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        .resize((f.width * scale, f.height * scale), Image.Resampling.NEAREST)
        for f in shots
    ]
    paletted[0].save(buffer, format="GIF", save_all=True, append_images=paletted[1:], duration=durations, loop=0,
                     optimize=False, disposal=1)
    return buffer.getvalue()


def frame_arrays(data: bytes) -> list[np.ndarray]:
    """Each frame of a GIF as (H, W, 3) uint8 — for checking a sweep."""
    gif = Image.open(io.BytesIO(data))
    out = []
    for i in range(gif.n_frames):
        gif.seek(i)
        out.append(np.asarray(gif.convert("RGB")))
    return out
