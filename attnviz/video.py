"""Attention over a video file: the class token's heatmap laid over every (sampled) frame, as an H.264 MP4.

The per-frame work is the live camera's (:func:`attnviz.live.heatmap_frame`): the frame made upright
→ ``model.view`` → capture → ``summary_map`` → ``render.overlay``, so a frame frozen from the video and
explored as a photo shows the same map. Around it:

- :func:`probe` reads the container's header only — length, size, frame rate, frame count, bytes — and
  refuses a file over :class:`Limits` with one sentence, before any frame is decoded;
- :class:`Frames` holds every decoded frame to the same limits, because a header can lie: no frame may
  be larger than the header said (the decoder itself is told so, so a stream that switches in-band to
  8192 × 8192 is refused before such a frame is allocated), and the packets read, the frames decoded,
  the pictures made, the pixels decoded in all and the wall time of the job are bounded. Only the frames
  used are turned into pictures; other streams' packets are skipped by the demuxer;
- :func:`render_video` streams: PyAV decodes frames one at a time, ``batch`` of them are turned into
  heatmaps, encoded and let go, so memory stays flat however long the video is (no whole-video
  array is ever made). Phone videos are turned upright from the display matrix each frame carries
  (``VideoFrame.rotation``; MOV and MP4 files from phones store the rotation there, not in the pixels).
  Which frames were used (every n-th) is written into the MP4's metadata (``comment``);
- the MP4 is written whole or not at all (:mod:`attnviz.atomic`): a damaged file, a frame that
  cannot be decoded or Ctrl-C leave no partial output behind.

A source (and a target) is a path or, for a video that must never touch the disk (the page's uploads),
the file's bytes (and a binary file object).

    >>> result = video.render_video("clip.mov", "clip_attention.mp4", model, video.VideoSettings(layer=11))
    >>> result.note  # 'attnviz: layer 12, mean of all heads; every 2nd frame of clip.mov (60 → 30 fps) …'

Layers and heads are 0-based, as everywhere in the library.
"""
from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO, Union

from PIL import Image

import attnviz.atomic as atomic
import attnviz.i18n as i18n
from .capture import Head
from .errors import AttnvizError
from .live import LiveSettings, heatmap_frame
from .models import Fit, Model

FORMATS = ("mp4", "mov", "webm", "mkv", "m4v")  # what the page's upload accepts (PyAV reads more)
MAX_OUT_FPS = 30.0  # default: a faster video is sampled down to at most this many frames per second
Source = Union[str, Path, bytes]  # a video file, or its bytes (never written anywhere)


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
    """What a video may be, and what decoding it may cost.

    Checked from the header before any frame is decoded (:func:`probe`), and again on every packet read
    and every frame decoded (:class:`Frames`): a frame larger than its header said, more packets, frames,
    pictures or pixels than these, or a job running longer than ``work_seconds`` is refused with one sentence.
    """

    seconds: float = 60.0
    pixels: int = 3840 * 2160  # width × height of one frame (4K)
    bytes: int = 500 * 2**20
    frames: int = 7200  # frames decoded: 60 s at 120 fps
    packets: int = 2 * 7200  # video packets read: two a frame at most (field-coded video), packets with no frame too
    drawn: int = 3600  # frames turned into pictures (render_video draws each through the model): 60 s at 60 fps
    decoded_pixels: int = 1800 * 3840 * 2160  # pixels decoded in all: 60 s of 4K at 30 fps (~15 gigapixels)
    work_seconds: float = 600.0  # wall time of one render_video, decoding, drawing and encoding together
    stall_seconds: float = 10.0  # decoding without a frame coming out (hidden frames: decoded, never shown)


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


def _open(source: Source, name: str):
    import av

    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return av.open(io.BytesIO(source), metadata_errors="ignore")
        return av.open(str(source), metadata_errors="ignore")
    except FileNotFoundError:
        raise VideoError(f"{name} does not exist.") from None
    except (av.error.InvalidDataError, av.error.FFmpegError, UnicodeDecodeError) as e:
        raise VideoError(f"{name} is not a video attnviz can read ({_reason(e)}); use an MP4, MOV or WebM file.",
                         "not_video", name=name) from None


def _reason(error: Exception) -> str:
    text = getattr(error, "strerror", None) or str(error)
    return text.split(":")[0].strip().rstrip(".").lower() or type(error).__name__


def _name(source: Source, name: str | None) -> str:
    return name or ("the video" if isinstance(source, (bytes, bytearray, memoryview)) else Path(source).name)


def probe(source: Source, limits: Limits = Limits(), name: str | None = None) -> VideoInfo:
    """The header of ``source``'s first video stream, or a :class:`VideoError` if it is over ``limits``."""
    name = _name(source, name)
    try:
        size = len(source) if isinstance(source, (bytes, bytearray, memoryview)) else os.stat(source).st_size
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
    if info.frames is not None and info.frames > limits.frames:
        raise _too_many_frames(name, info.frames, limits)
    if info.frames is not None and info.frames * width * height > limits.decoded_pixels:
        raise _too_many_pixels_in_all(name, info.frames * width * height, limits)
    return info


def _too_many_frames(name: str, frames: int, limits: Limits) -> VideoError:
    return VideoError(f"{name} has {frames} frames; videos of up to {limits.frames} frames can be used, so lower its "
                      "frame rate or cut it shorter first.", "too_many_frames", name=name, frames=frames,
                      limit=limits.frames)


def _too_many_pixels_in_all(name: str, pixels: int, limits: Limits) -> VideoError:
    return VideoError(f"{name} holds {pixels / 1e9:.1f} gigapixels of frames; videos up to "
                      f"{limits.decoded_pixels / 1e9:.1f} gigapixels in all can be used, so cut it shorter or make it "
                      "smaller first.", "too_many_pixels_in_all", name=name, gpx=f"{pixels / 1e9:.1f}",
                      limit=f"{limits.decoded_pixels / 1e9:.1f}")


def _too_many_drawn(name: str, limits: Limits, frames: int | None = None) -> VideoError:
    if frames is None:  # counted while decoding: the header did not say
        return VideoError(f"{name} needs more than {limits.drawn} frames drawn; up to {limits.drawn} can be drawn, so "
                          "ask for fewer frames per second or cut it shorter first.", "too_many_drawn_decoded",
                          name=name, limit=limits.drawn)
    return VideoError(f"{name} needs {frames} frames drawn; up to {limits.drawn} can be drawn, so ask for fewer frames "
                      "per second or cut it shorter first.", "too_many_drawn", name=name, frames=frames,
                      limit=limits.drawn)


def upright(frame) -> Image.Image:
    """A decoded ``av.VideoFrame`` as the RGB picture a person sees: turned by its display matrix
    (``frame.rotation``, degrees counter-clockwise, as phones record it)."""
    picture = frame.to_image()  # RGB, as stored
    turn = round((frame.rotation or 0) / 90) % 4
    return picture if turn == 0 else picture.transpose(
        (Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270)[turn - 1])


class Frames:
    """The frames of ``source``'s first video stream, decoded one at a time and held to ``limits``.

    Iterating gives ``(index, picture)`` — the upright picture — for each frame whose 0-based index
    ``wanted(index)`` accepts; every other frame is decoded (later frames are predicted from it) but never
    turned into a picture, and the packets of every other stream (sound, data) are skipped by the demuxer
    unread. Each of these ends the iteration with one sentence (a :class:`VideoError`): a frame larger than
    the stream's header said (the decoder is told the same bound, so such a frame is never allocated), more
    than ``limits.packets`` packets, ``limits.frames`` frames, ``limits.drawn`` pictures or
    ``limits.decoded_pixels`` pixels, frames past ``limits.seconds``, ``limits.work_seconds`` of wall time
    since ``started`` (``time.perf_counter()``; the consumer's own work between frames counts),
    ``limits.stall_seconds`` of decoding with no frame coming out, or ``stop()`` saying True (nobody waits
    for the result any more). Time and ``stop()`` are asked at every packet: packets that make no frame
    (VP9's hidden frames are decoded but never shown, so no frame or pixel limit sees them) cannot run past
    them. ``decoded`` counts the frames decoded, ``used`` the pictures made, ``packets`` the packets read.
    """

    def __init__(self, source: Source, name: str | None = None, limits: Limits = Limits(),
                 wanted: Callable[[int], bool] = lambda index: True, started: float | None = None,
                 stop: Callable[[], bool] | None = None) -> None:
        self.source, self.name, self.limits = source, _name(source, name), limits
        self.wanted, self.stop = wanted, stop
        self.started = time.perf_counter() if started is None else started
        self.decoded = self.used = self.packets = 0
        self._last_frame = self.started  # when a frame last came out (or the consumer last asked for one)

    def __iter__(self) -> Iterator[tuple[int, Image.Image]]:
        import av

        name, limits = self.name, self.limits
        with _open(self.source, name) as container:
            if not container.streams.video:
                raise VideoError(f"{name} holds no video, only {len(container.streams)} other stream(s).", "no_video",
                                 name=name)
            stream = container.streams.video[0]
            for other in container.streams:
                if other.index != stream.index:
                    other.discard = av.stream.Discard.all
            ctx = stream.codec_context
            header = (int(ctx.width or 0), int(ctx.height or 0))
            allowed = min(header[0] * header[1] or limits.pixels, limits.pixels)  # pixels of one frame
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else 0.0
            # FFmpeg's decoders refuse to allocate a frame over max_pixels: an in-band switch to a larger size
            # fails on its first packet instead of decoding at that size. They count coded sizes (macroblocks,
            # stride alignment): the bound is the header's size rounded up to 128 each way, the exact one is below.
            coded = (-(-header[0] // 128) * 128) * (-(-header[1] // 128) * 128) if allowed == header[0] * header[1] \
                else allowed
            ctx.options = {**ctx.options, "max_pixels": str(coded)}
            stream.thread_type = "AUTO"
            pixels = 0
            self._last_frame = time.perf_counter()
            try:
                for packet in container.demux(stream):
                    self.packets += 1
                    self._check_packet()
                    for frame in packet.decode():
                        self._last_frame = time.perf_counter()
                        index = self.decoded
                        self.decoded += 1
                        if frame.width * frame.height > allowed:  # a decoder that ignores max_pixels
                            raise self._size_changed(header, (frame.width, frame.height))
                        pixels += frame.width * frame.height
                        self._check_frame(index, pixels, fps)
                        if self.wanted(index):
                            self.used += 1
                            if self.used > limits.drawn:
                                raise _too_many_drawn(name, limits)
                            yield index, upright(frame)
                            self._last_frame = time.perf_counter()  # the consumer's work is not a stall
            except (av.error.InvalidDataError, av.error.FFmpegError) as e:
                now = (int(ctx.width or 0), int(ctx.height or 0))
                if now[0] * now[1] > allowed:  # the decoder read the new size, then refused to allocate it
                    raise self._size_changed(header, now) from None
                raise VideoError(f"{name} is damaged: a frame could not be decoded ({_reason(e)}); nothing was "
                                 "written.", "damaged", name=name) from None

    def _check_packet(self) -> None:
        name, limits = self.name, self.limits
        if self.packets > limits.packets:
            raise VideoError(f"{name} holds more than {limits.packets} packets of video, more than its frames can "
                             "need, so it cannot be used.", "too_many_packets", name=name, limit=limits.packets)
        if time.perf_counter() - self._last_frame > limits.stall_seconds:
            raise VideoError(f"{name} was decoded for {limits.stall_seconds:.0f} s without a frame to show (it may "
                             "hold hidden frames), so it was stopped.", "stalled", name=name,
                             limit=f"{limits.stall_seconds:.0f}")
        self._check_time()

    def _check_time(self) -> None:
        name, limits = self.name, self.limits
        if time.perf_counter() - self.started > limits.work_seconds:
            raise VideoError(f"{name} took longer than {limits.work_seconds:.0f} s to draw, so it was stopped after "
                             f"{self.decoded} frames; cut it shorter or ask for fewer frames per second.", "too_slow",
                             name=name, limit=f"{limits.work_seconds:.0f}", frames=self.decoded)
        if self.stop is not None and self.stop():
            raise VideoError(f"{name} was stopped: nobody is waiting for it any more.", "stopped", name=name)

    def _check_frame(self, index: int, pixels: int, fps: float) -> None:
        name, limits = self.name, self.limits
        if self.decoded > limits.frames:
            raise VideoError(f"{name} has more than {limits.frames} frames; videos of up to {limits.frames} frames can "
                             "be used, so lower its frame rate or cut it shorter first.", "too_many_frames_decoded",
                             name=name, limit=limits.frames)
        if pixels > limits.decoded_pixels:
            raise _too_many_pixels_in_all(name, pixels, limits)
        if fps > 0 and index / fps > limits.seconds:  # a header without a length: the limit holds while decoding
            raise VideoError(f"{name} is longer than {limits.seconds:.0f} s; videos up to {limits.seconds:.0f} s can "
                             "be used, so cut it shorter first.", "too_long_decoded", name=name,
                             limit=f"{limits.seconds:.0f}")
        self._check_time()  # the consumer's work since the last packet (a decoder's last frames come together)

    def _size_changed(self, header: tuple[int, int], now: tuple[int, int]) -> VideoError:
        return VideoError(f"{self.name} changes its frame size mid-stream from {header[0]} × {header[1]} to "
                          f"{now[0]} × {now[1]} pixels, larger than its header says, so it cannot be used.",
                          "size_changed", name=self.name, width=header[0], height=header[1], new_width=now[0],
                          new_height=now[1])


def decoded_frames(source: Source, name: str | None = None, limits: Limits = Limits()) -> Iterator[Image.Image]:
    """Every frame of the first video stream, upright, one at a time (never more than one in memory)."""
    return (picture for _, picture in Frames(source, name, limits))


def frame_at(source: Source, index: int, name: str | None = None, limits: Limits = Limits()) -> Image.Image:
    """Frame ``index`` (0-based, in decoding order) of ``source``, upright: what "freeze this frame" keeps."""
    frames = Frames(source, name, limits, wanted=lambda i: i == index)
    for _, picture in frames:
        return picture
    raise VideoError(f"{frames.name} has only {frames.decoded} frames, not {index + 1}.")


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
    source: Source,
    target: str | Path | BinaryIO,
    model: Model,
    settings: VideoSettings = VideoSettings(),
    limits: Limits = Limits(),
    progress: Callable[[int, int | None], None] | None = None,
    on_frame: Callable[[int, Image.Image], None] | None = None,
    name: str | None = None,
    stop: Callable[[], bool] | None = None,
) -> VideoResult:
    """Write ``target``: an H.264 MP4 of ``source`` with the class token's heatmap over every used frame.

    ``progress(done, total)`` is called after each batch (``total``: frames expected in the result, or
    None when the header does not say); ``on_frame(i, picture)`` sees result frame ``i`` before it is
    encoded (the tests compare it with a capture of the same input frame); ``stop()``, asked after every
    decoded frame, ends the job with a :class:`VideoError` once it says True (the page: the visitor left).
    ``target`` may be a binary file object (the page keeps the result in memory); a path is written
    whole or not at all.
    """
    import av

    start = time.perf_counter()  # the job's wall time (limits.work_seconds) counts from here
    name = _name(source, name)
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
    if expected is not None and expected > limits.drawn:
        raise _too_many_drawn(name, limits, expected)
    live = LiveSettings(model, layer, settings.head, settings.alpha, settings.cmap, settings.smooth, settings.fit)
    side = model.size * settings.scale
    side += side % 2  # yuv420p needs even sides
    frames_out = 0
    frames = Frames(source, name, limits, wanted=lambda index: index % every == 0, started=start, stop=stop)
    written = atomic.replacing(target) if isinstance(target, (str, Path)) else contextlib.nullcontext(target)
    with written as f:
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

            for _, picture in frames:
                batch.append(picture)
                if len(batch) >= settings.batch:
                    flush()
            flush()
            if frames_out == 0:
                raise VideoError(f"{name} holds no frame that could be decoded; nothing was written.")
            for packet in stream.encode():
                out.mux(packet)
    return VideoResult(info, frames.decoded, frames_out, every, fps, time.perf_counter() - start, note)
