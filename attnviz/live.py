"""Attention on moving video: the class token's heatmap over every camera frame, newest frame first.

Two pieces, both free of any web framework:

- :func:`heatmap_frame` is the per-frame work — picture → the model's view → capture → class-token
  map → overlay. It is exactly :func:`attnviz.capture` followed by ``cls_map``: the same picture gives
  the same map, so a frozen frame explored on the page shows what the stream showed. On a runtime whose
  class-rows graph was checked exact against the capture (:class:`attnviz.runtimes.OnFirstUse`), it
  computes only the class token's rows, the map's one need.
- :class:`LiveProcessor` runs it on a thread of its own for a stream of frames. A new frame replaces
  one still waiting (drop, never queue), so the heatmap always follows the newest frame; the settings
  (layer, head, opacity, …) are one immutable object swapped whole, so a change applies from the next
  frame on without a lock or a restart. Each processor's captures run on its own thread, and capture
  records only its calling thread's pass: many viewers share one model and never see each other's
  frames. On a shared server its frames make way for the visitors' photos (``priority``, ``nice``), and
  :mod:`attnviz.live_sharing` bounds how many streams run at once.

A notebook can call ``heatmap_frame(Image.open("cup.jpg"), LiveSettings(model, layer=11, head="mean"))``,
or feed ``LiveProcessor.recv`` PIL images (or anything with ``to_image()``, such as ``av.VideoFrame``).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import statistics
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

import attnviz.render as render
from .capture import Head, capture_tensor
from .softmax import fuse_heads, patch_grid
from .images import as_rgb
from .live_sharing import Priority, lower_priority
from .models import Fit, Model

STATS_WINDOW_S = 3.0  # fps and latency are reported over this many recent seconds …
STATS_MIN_EVENTS = 5  # … or over the last five heatmaps when fewer came in that time,
STATS_MAX_AGE_S = 30.0  # as long as they are this recent


@dataclass(frozen=True, eq=False)
class LiveSettings:
    """What every frame is drawn with. Layers and heads are 0-based, as in :class:`attnviz.Capture`."""

    model: Model
    layer: int
    head: Head = "mean"
    alpha: float = 0.6
    cmap: str = "inferno"
    smooth: bool = False
    fit: Fit = "crop"
    display: int = 0  # side of the picture sent back (whole-factor nearest enlargement); 0: model size


@dataclass(frozen=True, eq=False)
class LiveFrame:
    """One frame's heatmap: what the model saw, the class token's map and the blended picture."""

    image: Image.Image  # the camera frame as it came, RGB
    view: Image.Image  # (S, S): the picture the model saw
    cls_map: np.ndarray  # (h, w): the class token's attention over the patches (cap.summary_map)
    picture: Image.Image  # (S, S) overlay (enlarged to ``display`` when asked)
    settings: LiveSettings
    seconds: float  # wall time of the whole frame: view, capture, map and overlay


def heatmap_frame(image: Image.Image, settings: LiveSettings,
                  between_layers: Callable[[], None] | None = None) -> LiveFrame:
    """picture → view → capture → class-token map → overlay, exactly as :func:`attnviz.capture` does it,
    with the model the settings name (swapped together with them); ``between_layers`` as in
    :func:`attnviz.capture_tensor` (a shared server's pause point)."""
    model = settings.model
    start = time.perf_counter()
    image = as_rgb(image)  # the one conversion capture() makes too (16-bit, float, alpha, EXIF)
    view = model.view(image, settings.fit)  # the one preprocessing path: page, CLI and camera alike
    x = model.to_input(view)
    rows = model.runtime.class_rows(x) if model.runtime is not None else None  # (L, H, N), where a graph gives them
    if rows is not None:  # the class token's rows alone, checked exact against the capture's when first started
        layer = min(settings.layer, rows.shape[0] - 1)
        heads = rows.shape[1]
    else:
        cap = capture_tensor(model, x, between_layers)
        layer = min(settings.layer, cap.num_layers - 1)  # a kept choice from a deeper model
        heads = cap.heads(layer)  # a model with stages has its own count at each layer
    head = settings.head if isinstance(settings.head, str) or settings.head < heads else "mean"
    if rows is not None:
        grid_map = patch_grid(fuse_heads(rows[layer], head).numpy(), model.grid, model.num_prefix_tokens)
    else:
        grid_map = cap.summary_map(layer, head)  # (h, w): the class token's row, or the mean received (its stage's grid)
    picture = render.overlay(view, grid_map, alpha=settings.alpha, cmap=settings.cmap, smooth=settings.smooth)
    if settings.display > picture.width:
        picture = render.enlarge(picture, settings.display)
    return LiveFrame(image, view, grid_map, picture, settings, time.perf_counter() - start)


def frame_image(frame: Any) -> Image.Image:
    """A PIL image from a PIL image or a video frame with ``to_image()`` (``av.VideoFrame``)."""
    return frame if isinstance(frame, Image.Image) else frame.to_image()


@dataclass(frozen=True)
class LiveStats:
    """The stream's recent speed. ``latency_ms``: from a frame's arrival to its heatmap being sent."""

    fps: float  # heatmaps sent per second (NaN until two were sent)
    latency_ms: float  # median over the window (NaN until one was sent)
    compute_ms: float  # median time of heatmap_frame itself
    frames_in: int  # camera frames received so far
    heatmaps: int  # heatmaps computed so far
    dropped: int  # frames replaced by a newer one before the worker got to them


@dataclass(frozen=True, eq=False)
class _Result:
    live: LiveFrame
    output: Any  # what recv hands back: ``encode(live.picture)``
    arrived: float  # clock time the source frame arrived


class LiveProcessor:
    """Heatmaps for a stream of frames, computed on a worker thread; always the newest frame.

    ``recv(frame)`` is called once per camera frame and returns at once: it leaves the frame for the
    worker (replacing one not yet started) and hands back the newest finished heatmap (``placeholder``,
    or the frame itself, until the first one is ready). Assign a new :class:`LiveSettings` to ``settings`` to change what the
    next frames show; call ``stop()`` when the stream ends.
    """

    def __init__(
        self,
        settings: LiveSettings,
        encode: Callable[[Image.Image], Any] = lambda picture: picture,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 1,
        threads: int | None = None,
        placeholder: Any = None,
        nice: int = 0,
        priority: Priority | None = None,
    ):
        """``workers`` frames are computed at once, each with ``threads`` PyTorch threads (``None``: the
        process's setting). One worker using every core gives the shortest delay; on a crowded machine
        two single-threaded workers avoid the stalls a multi-threaded forward pass suffers when other
        work takes a core away (``python -m bench.live --processor`` compares them).

        ``nice`` > 0 lowers the workers' scheduling priority by that much (Linux, where every thread has
        its own nice value; elsewhere it is ignored): the rest of the process — a page's upload, say —
        gets the CPU first, and the stream's frames are computed with what is left (more are dropped).
        ``priority``: the server's :class:`attnviz.live_sharing.Priority`; each frame is computed inside
        its ``background()``, so frames get only the cores a visitor's photo leaves, and the streams take
        turns."""
        self.settings = settings  # replaced whole by other threads; read once per frame
        self._placeholder = placeholder  # sent until the first heatmap (None: the camera frame itself)
        self._encode = encode
        self._clock = clock
        self._threads = threads
        self._nice = nice
        self._priority = priority
        self._last_frame = clock()  # arrival of the newest camera frame (the start, until one comes)
        self._wake = threading.Condition()
        self._pending: tuple[Any, float] | None = None  # (frame, arrival time), at most one
        self._stopped = False
        self._result: _Result | None = None  # replaced whole by the worker
        self._sent: _Result | None = None
        self._counts = {"in": 0, "done": 0, "dropped": 0}
        self._events: collections.deque = collections.deque(maxlen=256)  # (sent at, latency, compute)
        self._lock = threading.Lock()  # guards _events and _counts (read by the page's thread)
        self.error: BaseException | None = None  # the worker's last failure, if any
        self._threads_started = [
            threading.Thread(target=self._run, name=f"attnviz-live-{i}", daemon=True) for i in range(workers)
        ]
        for thread in self._threads_started:
            thread.start()

    # ---- called by the stream (one thread) ----
    def recv(self, frame: Any) -> Any:
        now = self._clock()
        self._last_frame = now
        with self._wake:
            if self._pending is not None:
                with self._lock:
                    self._counts["dropped"] += 1
            self._pending = (frame, now)  # the newest frame wins; an older unstarted one is dropped
            self._wake.notify()
        with self._lock:
            self._counts["in"] += 1
        result = self._result
        if result is None:
            return frame if self._placeholder is None else self._placeholder
        if result is not self._sent:  # first time this heatmap goes out: its latency is known now
            self._sent = result
            with self._lock:
                self._events.append((now, now - result.arrived, result.live.seconds))
        return result.output

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers to end after :meth:`stop`; True when they all have."""
        for thread in self._threads_started:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads_started)

    on_ended = stop  # the name streamlit-webrtc calls when the stream ends

    # ---- read by anyone ----
    @property
    def stopped(self) -> bool:
        return self._stopped

    def idle_s(self) -> float:
        """Seconds since the newest camera frame arrived (since the start, until one has)."""
        return self._clock() - self._last_frame

    @property
    def latest(self) -> LiveFrame | None:
        """The newest finished frame (its camera picture is what Freeze keeps)."""
        result = self._result
        return result.live if result is not None else None

    def stats(self) -> LiveStats:
        """Speed over the last :data:`STATS_WINDOW_S` seconds, or the last few heatmaps when they are slower."""
        now = self._clock()
        with self._lock:
            events = list(self._events)
            counts = dict(self._counts)
        recent = [e for e in events if now - e[0] <= STATS_WINDOW_S]
        if len(recent) < STATS_MIN_EVENTS:
            recent = [e for e in events[-STATS_MIN_EVENTS:] if now - e[0] <= STATS_MAX_AGE_S]
        span = recent[-1][0] - recent[0][0] if len(recent) >= 2 else 0.0
        fps = (len(recent) - 1) / span if span > 0 else float("nan")  # unknown until two heatmaps went out
        latency = statistics.median(e[1] for e in recent) * 1000 if recent else float("nan")
        compute = statistics.median(e[2] for e in recent) * 1000 if recent else float("nan")
        return LiveStats(fps, latency, compute, counts["in"], counts["done"], counts["dropped"])

    def with_settings(self, **changes) -> None:
        """Change some settings for the next frames (a new immutable object, swapped in one step)."""
        self.settings = replace(self.settings, **changes)

    # ---- the worker thread ----
    def _run(self) -> None:
        lower_priority(self._nice)
        if self._threads is not None:
            torch.set_num_threads(self._threads)  # OpenMP's setting is per thread: other captures keep theirs
        if self._priority is not None:
            turn = functools.partial(self._priority.background, stream=self)
        else:
            turn = contextlib.nullcontext
        while True:
            with self._wake:
                while self._pending is None and not self._stopped:
                    self._wake.wait()
            with turn():  # on a shared server: after the visitors' photos, and in turn with other streams
                with self._wake:
                    if self._stopped:
                        return
                    if self._pending is None:  # this stream's other worker took it meanwhile
                        continue
                    frame, arrived = self._pending  # the newest frame, once it is this stream's turn
                    self._pending = None
                settings = self.settings
                pause = self._priority.pause_point() if self._priority is not None else None
                try:
                    live = heatmap_frame(frame_image(frame), settings, pause)
                    output = self._encode(live.picture)
                except Exception as e:  # a bad frame must not end the stream; the page can say so
                    self.error = e
                    continue
            with self._lock:
                self._counts["done"] += 1
                current = self._result
                # with two workers a slower, older frame can finish last: never go back in time
                if current is None or arrived > current.arrived:
                    self._result = _Result(live, output, arrived)
