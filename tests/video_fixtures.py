"""Generated clips for the video tests: moving shapes, written with PyAV (nothing downloaded)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def shapes(i: int, width: int, height: int) -> np.ndarray:
    """Frame ``i``: a grey-blue background, a red square moving right, a yellow disc moving down. (H, W, 3) uint8."""
    y, x = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), np.uint8)
    frame[...] = (40, 60, 90)
    side = max(4, min(width, height) // 4)
    left = (i * 3) % max(1, width - side)
    frame[height // 4: height // 4 + side, left: left + side] = (220, 30, 30)
    cy, cx, r = (i * 2) % height, width * 2 // 3, max(3, side // 2)
    frame[(y - cy) ** 2 + (x - cx) ** 2 <= r * r] = (240, 220, 40)
    frame[:, : max(2, width // 16)] = (255, 255, 255)  # a white bar on the stored left edge: shows the rotation
    return frame


def write_clip(path: Path, frames: int, fps: int = 30, width: int = 160, height: int = 120, rotation: int = 0,
               codec: str = "libx264", container: str | None = None) -> Path:
    """A clip of ``frames`` moving-shape frames; ``rotation`` (degrees counter-clockwise) goes into the display matrix."""
    import av

    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "rgb24" if codec == "libx264rgb" else "yuv420p"  # yuv420p needs even sides
        if codec.startswith("libx264"):
            stream.options = {"crf": "10", "preset": "ultrafast"}
        if rotation:
            stream.set_display_rotation(rotation)
        for i in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(shapes(i, width, height), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def read_frames(path: Path) -> list[np.ndarray]:
    """Every frame of ``path`` as stored (no rotation applied), RGB (H, W, 3)."""
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def _annex_b(width: int, height: int, frames: int, fps: int) -> bytes:
    """``frames`` moving-shape frames as a raw H.264 stream (Annex B: its SPS and PPS in-band, first)."""
    from fractions import Fraction

    import av

    ctx = av.CodecContext.create("libx264", "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = width, height, "yuv420p", Fraction(1, fps)
    ctx.options = {"preset": "ultrafast", "crf": "30"}
    packets = []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(shapes(i, width, height), format="rgb24")
        frame.pts = i
        packets += [bytes(p) for p in ctx.encode(frame)]
    packets += [bytes(p) for p in ctx.encode(None)]
    return b"".join(packets)


def write_size_switch(path: Path, first: tuple[int, int] = (64, 48), then: tuple[int, int] = (1024, 768),
                      frames: int = 4, fps: int = 30) -> Path:
    """A hostile MP4: its header (and first ``frames`` frames) say ``first``; the stream then switches in-band,
    with a new SPS, to ``then`` for ``frames`` more frames — as a ~1 MB file switching to 8192 × 8192 would."""
    import io
    from fractions import Fraction

    import av

    raw = _annex_b(*first, frames, fps) + _annex_b(*then, frames, fps)
    with av.open(io.BytesIO(raw), format="h264") as source, av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream_from_template(source.streams.video[0])
        stream.time_base = Fraction(1, fps)
        for i, packet in enumerate(p for p in source.demux(source.streams.video[0]) if p.size):
            packet.stream, packet.time_base = stream, Fraction(1, fps)
            packet.pts = packet.dts = i
            packet.duration = 1
            out.mux(packet)
    return path
