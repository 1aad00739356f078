"""Generated clips for the video tests: moving shapes, written with PyAV (nothing downloaded)."""
from __future__ import annotations

import io
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


class _Pipe(io.RawIOBase):
    """A place to write that cannot seek back: a muxer writes no length or index into the header (as a
    browser's MediaRecorder writes its WebM)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.data += b
        return len(b)


def write_clip(path: Path, frames: int, fps: int = 30, width: int = 160, height: int = 120, rotation: int = 0,
               codec: str = "libx264", container: str | None = None, streamed: bool = False) -> Path:
    """A clip of ``frames`` moving-shape frames; ``rotation`` (degrees counter-clockwise) goes into the display
    matrix. ``streamed``: written as to a pipe, a Matroska file whose header says neither length nor frame count."""
    import av

    pipe = _Pipe() if streamed else None
    with av.open(pipe or str(path), "w", format=container or ("matroska" if streamed else None)) as out:
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
    if pipe is not None:
        path.write_bytes(bytes(pipe.data))
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



def _superframe(frames: list[bytes]) -> bytes:
    """VP9's superframe syntax: the frames, then an index (a marker byte, each size in 4 bytes, the marker)."""
    marker = bytes([0b11000000 | (4 - 1) << 3 | (len(frames) - 1)])
    return b"".join(frames) + marker + b"".join(len(f).to_bytes(4, "little") for f in frames) + marker


def write_hidden_frames(path: Path, packets: int = 300, width: int = 64, height: int = 48) -> Path:
    """A hostile Matroska file (its header says neither length nor frame count): one VP9 keyframe shown, then
    ``packets`` packets each holding 8 copies of it marked hidden (``show_frame`` 0). The decoder decodes every
    copy and gives no frame for any, so no frame or pixel count sees them: a 50 MB upload of hidden 4K
    keyframes (~3 kB each) kept a decoder busy for minutes."""
    import av

    pipe = _Pipe()
    with av.open(pipe, "w", format="matroska") as out:
        stream = out.add_stream("libvpx-vp9", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
        first = [*stream.encode(av.VideoFrame.from_ndarray(shapes(0, width, height), format="rgb24")),
                 *stream.encode()]
        key = bytes(first[0])
        assert len(first) == 1 and key[0] == 0b10000010  # frame marker, profile 0, a keyframe, show_frame 1
        out.mux(first[0])
        hidden = _superframe([bytes([key[0] & ~0b10]) + key[1:]] * 8)
        step = first[0].duration or 1
        for i in range(1, packets + 1):
            packet = av.Packet(hidden)
            packet.stream, packet.time_base = stream, first[0].time_base
            packet.pts = packet.dts = i * step
            packet.duration = step
            out.mux(packet)
    path.write_bytes(bytes(pipe.data))
    return path
