"""Attention over a video file: the class token's heatmap laid over every (sampled) frame, as an H.264 MP4.

The per-frame work is the live camera's (:func:`attnviz.live.heatmap_frame`): the frame made upright
→ ``model.view`` → capture → ``summary_map`` → ``render.overlay``, so a frame frozen from the video and
explored as a photo shows the same map. Around it:

- :func:`probe` reads the container's header only — length, size, frame rate, bytes — and refuses a
  file over :class:`Limits` with one sentence, before any frame is decoded;
- :func:`render_video` streams: PyAV decodes frames one at a time, ``batch`` of them are turned into
  heatmaps, encoded and let go, so memory stays flat however long the video is (no whole-video
  array is ever made). Phone videos are turned upright from the display matrix each frame carries
  (``VideoFrame.rotation``; MOV and MP4 files from phones store the rotation there, not in the pixels).
  Which frames were used (every n-th) is written into the MP4's metadata (``comment``);
- the MP4 is written whole or not at all (:mod:`attnviz.atomic`): a damaged file, a frame that
  cannot be decoded or Ctrl-C leave no partial output behind.

    >>> result = video.render_video("clip.mov", "clip_attention.mp4", model, video.VideoSettings(layer=11))
    >>> result.note  # 'attnviz: layer 12, mean of all heads; every 2nd frame of clip.mov (60 → 30 fps) …'

Layers and heads are 0-based, as everywhere in the library.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from PIL import Image

import attnviz.atomic as atomic
import attnviz.i18n as i18n
from .capture import Head
from .errors import AttnvizError
from .live import LiveSettings, heatmap_frame
from .models import Fit, Model

FORMATS = ("mp4", "mov", "webm", "mkv", "m4v")  # what the page's upload accepts (PyAV reads more)
MAX_OUT_FPS = 30.0  # default: a faster video is sampled down to at most this many frames per second


class VideoError(AttnvizError, ValueError):
    """A video that cannot be used: not a video, damaged, or over a limit. One sentence.

    ``key`` and ``values`` name the same sentence for a translation catalogue (``video.error_<key>``).
    """

    def __init__(self, message: str, key: str = "", **values: object) -> None:
        super().__init__(message)
        self.key = key
        self.values = values


@dataclass(frozen=True)
class Limits:
    """What a video may be: checked from the header, before any frame is decoded."""

    seconds: float = 60.0
    pixels: int = 3840 * 2160  # width × height of one frame (4K)
    bytes: int = 500 * 2**20


@dataclass(frozen=True)
class VideoInfo:
    """What the container's header says about a video's first video stream."""

    name: str
    width: int  # as stored (before the display rotation)
    height: int
    fps: float  # average frame rate
    seconds: float | None  # None when the header does not say (some WebM files from browsers)
    frames: int | None  # None when the header does not say
    codec: str
    bytes: int


@dataclass(frozen=True, eq=False)
class VideoSettings:
    """How each frame is drawn and which frames are used. Layer and head are 0-based; ``layer=None``: the last."""

    layer: int | None = None
    head: Head = "mean"
    alpha: float = 0.6
    cmap: str = "inferno"
    smooth: bool = False
    fit: Fit = "crop"
    fps: float | None = None  # frames per second of the result; None: the source's, at most MAX_OUT_FPS
    scale: int = 2  # each model pixel becomes scale × scale pixels of the result (H.264 wants even sides)
    batch: int = 8  # frames decoded, drawn and encoded together


@dataclass(frozen=True)
class VideoResult:
    """What :func:`render_video` did."""

    source: VideoInfo
    frames_in: int  # frames decoded
    frames_out: int  # frames in the result
    every: int  # every n-th frame was used
    fps: float  # frames per second of the result
    seconds: float  # wall time
    note: str  # the sentence written into the MP4's metadata

    @property
    def frames_per_second(self) -> float:
        """Result frames made per second of wall time."""
        return self.frames_out / self.seconds if self.seconds > 0 else float("nan")


def _open(source: str | Path, name: str):
    import av

    try:
        return av.open(str(source), metadata_errors="ignore")
    except FileNotFoundError:
        raise VideoError(f"{name} does not exist.") from None
    except (av.error.InvalidDataError, av.error.FFmpegError, UnicodeDecodeError) as e:
        raise VideoError(f"{name} is not a video attnviz can read ({_reason(e)}); use an MP4, MOV or WebM file.",
                         "not_video", name=name) from None


def _reason(error: Exception) -> str:
    text = getattr(error, "strerror", None) or str(error)
    return text.split(":")[0].strip().rstrip(".").lower() or type(error).__name__


def probe(source: str | Path, limits: Limits = Limits(), name: str | None = None) -> VideoInfo:
    """The header of ``source``'s first video stream, or a :class:`VideoError` if it is over ``limits``."""
    name = name or Path(source).name
    try:
        size = os.stat(source).st_size
    except FileNotFoundError:
        raise VideoError(f"{name} does not exist.") from None
    if size > limits.bytes:
        raise VideoError(f"{name} is {size / 2**20:.0f} MB; videos up to {limits.bytes / 2**20:.0f} MB can be used, "
                         "so cut it shorter or make it smaller.", "too_large", name=name, mb=round(size / 2**20),
                         limit=round(limits.bytes / 2**20))
    with _open(source, name) as container:
        if not container.streams.video:
            raise VideoError(f"{name} holds no video, only {len(container.streams)} other stream(s).", "no_video", name=name)
        stream = container.streams.video[0]
        ctx = stream.codec_context
        width, height = int(ctx.width or 0), int(ctx.height or 0)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 0.0
        seconds = None
        if stream.duration is not None and stream.time_base:
            seconds = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            seconds = container.duration / 1_000_000  # AV_TIME_BASE
        frames = int(stream.frames) or (round(seconds * fps) if seconds and fps else None)
        info = VideoInfo(name, width, height, fps, seconds, frames or None, ctx.name or "?", size)
    if width <= 0 or height <= 0 or fps <= 0:
        raise VideoError(f"{name}'s video stream does not say its frame size or rate, so it cannot be used.")
    if width * height > limits.pixels:
        raise VideoError(f"{name} is {width} × {height} pixels; videos up to {limits.pixels / 1e6:.1f} megapixels "
                         "a frame (4K) can be used.", "too_many_pixels", name=name, width=width, height=height,
                         mp=f"{limits.pixels / 1e6:.1f}")
    if seconds is not None and seconds > limits.seconds + 0.5 / fps:
        raise VideoError(f"{name} is {seconds:.1f} s long; videos up to {limits.seconds:.0f} s can be used, "
                         "so cut it shorter first.", "too_long", name=name, seconds=f"{seconds:.1f}",
                         limit=f"{limits.seconds:.0f}")
    return info


def upright(frame) -> Image.Image:
    """A decoded ``av.VideoFrame`` as the RGB picture a person sees: turned by its display matrix
    (``frame.rotation``, degrees counter-clockwise, as phones record it)."""
    picture = frame.to_image()  # RGB, as stored
    turn = round((frame.rotation or 0) / 90) % 4
    return picture if turn == 0 else picture.transpose(
        (Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270)[turn - 1])


def decoded_frames(source: str | Path, name: str | None = None) -> Iterator[Image.Image]:
    """Every frame of the first video stream, upright, one at a time (never more than one in memory)."""
    import av

    name = name or Path(source).name
    with _open(source, name) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                yield upright(frame)
        except (av.error.InvalidDataError, av.error.FFmpegError) as e:
            raise VideoError(f"{name} is damaged: a frame could not be decoded ({_reason(e)}); nothing was written.",
                             "damaged", name=name) from None


def frame_at(source: str | Path, index: int, name: str | None = None) -> Image.Image:
    """Frame ``index`` (0-based, in decoding order) of ``source``, upright: what "freeze this frame" keeps."""
    count = 0
    for count, picture in enumerate(decoded_frames(source, name), start=1):
        if count == index + 1:
            return picture
    raise VideoError(f"{name or Path(source).name} has only {count} frames, not {index + 1}.")


def sampling(fps: float, wanted: float | None) -> int:
    """Every how many frames one is used, for a result of about ``wanted`` frames per second."""
    target = min(fps, MAX_OUT_FPS) if wanted is None else wanted
    if target <= 0:
        raise VideoError(f"the frame rate must be above 0, not {wanted}.")
    return max(1, round(fps / target))


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th") if n % 100 not in (11, 12, 13) else f"{n}th"


def describe(info: VideoInfo, model: Model, layer: int, head: Head, every: int, fps: float, lang: str = "en") -> str:
    """The sentence a result carries in its metadata (and the page shows): which map, which frames."""
    head_name = i18n.text(lang, f"view.head_{head}") if isinstance(head, str) else i18n.text(lang, "view.head_n", n=head + 1)
    which = i18n.text(lang, "video.every_frame") if every == 1 else i18n.text(
        lang, "video.every_nth", nth=_ordinal(every) if lang == "en" else every)
    return i18n.text(lang, "video.note", layer=layer + 1, head=head_name, which=which, name=info.name,
                     fps_in=f"{info.fps:.3g}", fps_out=f"{fps:.3g}", model=model.public_name, size=model.size)


def render_video(
    source: str | Path,
    target: str | Path,
    model: Model,
    settings: VideoSettings = VideoSettings(),
    limits: Limits = Limits(),
    progress: Callable[[int, int | None], None] | None = None,
    on_frame: Callable[[int, Image.Image], None] | None = None,
    name: str | None = None,
) -> VideoResult:
    """Write ``target``: an H.264 MP4 of ``source`` with the class token's heatmap over every used frame.

    ``progress(done, total)`` is called after each batch (``total``: frames expected in the result, or
    None when the header does not say); ``on_frame(i, picture)`` sees result frame ``i`` before it is
    encoded (the tests compare it with a capture of the same input frame).
    """
    import av

    name = name or Path(source).name
    info = probe(source, limits, name)
    layer = model.depth - 1 if settings.layer is None else settings.layer
    if not 0 <= layer < model.depth:
        raise VideoError(f"layer {layer + 1} is not one of {model.public_name}'s {model.depth} layers.")
    if isinstance(settings.head, int) and not 0 <= settings.head < model.num_heads:
        raise VideoError(f"head {settings.head + 1} is not one of {model.public_name}'s {model.num_heads} heads.")
    if not (isinstance(settings.scale, int) and 1 <= settings.scale <= 8):
        raise VideoError(f"the scale must be a whole number from 1 to 8, not {settings.scale!r}.")
    every = sampling(info.fps, settings.fps)
    fps = info.fps / every if settings.fps is None else settings.fps
    rate = Fraction(fps).limit_denominator(1001)
    expected = -(-info.frames // every) if info.frames else None
    live = LiveSettings(model, layer, settings.head, settings.alpha, settings.cmap, settings.smooth, settings.fit)
    side = model.size * settings.scale
    side += side % 2  # yuv420p needs even sides
    start = time.perf_counter()
    frames_in = frames_out = 0
    last_time = 0.0
    with atomic.replacing(target) as f:
        with av.open(f, "w", format="mp4") as out:
            stream = out.add_stream("libx264", rate=rate, options={"crf": "18", "preset": "veryfast"})
            stream.width = stream.height = side
            stream.pix_fmt = "yuv420p"
            note = describe(info, model, layer, settings.head, every, fps)
            out.metadata["comment"] = note  # written with the header: before the first frame
            out.metadata["title"] = f"attnviz: {info.name}"
            batch: list[Image.Image] = []

            def flush() -> None:
                nonlocal frames_out
                for picture in batch:
                    drawn = heatmap_frame(picture, live).picture  # (S, S): the live camera's exact frame
                    if settings.scale > 1 or drawn.width != side:
                        drawn = drawn.resize((side, side), Image.Resampling.NEAREST)
                    if on_frame is not None:
                        on_frame(frames_out, drawn)
                    frame = av.VideoFrame.from_image(drawn)
                    frame.pts = frames_out
                    for packet in stream.encode(frame):
                        out.mux(packet)
                    frames_out += 1
                batch.clear()
                if progress is not None:
                    progress(frames_out, expected)

            for picture in decoded_frames(source, name):
                if frames_in % every == 0:
                    batch.append(picture)
                    last_time = frames_in / info.fps
                    if last_time > limits.seconds:  # a header without a length: the limit holds while decoding
                        raise VideoError(f"{name} is longer than {limits.seconds:.0f} s; videos up to "
                                         f"{limits.seconds:.0f} s can be used, so cut it shorter first.",
                                         "too_long_decoded", name=name, limit=f"{limits.seconds:.0f}")
                frames_in += 1
                if len(batch) >= settings.batch:
                    flush()
            flush()
            if frames_out == 0:
                raise VideoError(f"{name} holds no frame that could be decoded; nothing was written.")
            for packet in stream.encode():
                out.mux(packet)
    return VideoResult(info, frames_in, frames_out, every, fps, time.perf_counter() - start, note)
