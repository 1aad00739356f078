"""One server, many live cameras: how many streams run, and who computes first.

A classroom server is one Python process. Every stream's heatmaps are computed in it, beside every
visitor's uploads, and a forward pass holds Python's GIL between its tensor operations — so a stream
slows an upload even on a core of its own. Three rules keep the streams from taking the server:

- :class:`StreamSlots`: at most ``limit`` streams at once (the owner's ``ATTNVIZ_LIVE_STREAMS``); a
  stream holds its slot until it stops, its owner (a browser session) is gone, or its camera falls silent.
- :class:`Priority`: page work comes first. While a photo is decoded or captured
  (``with priority.foreground():``), and for ``grace_s`` after, no live frame starts; nor while the
  server's event loop is slow to answer (``background(ready=…)``: the page asks Streamlit's loop, which
  carries every upload, page update and the video itself); live frames take turns, ``background`` at
  once server-wide, in the order they asked. A frame already running when a photo arrives stops at its
  next layer until the photo is done (``pause_point``). Waiting holds neither a core nor the GIL.
- :func:`lower_priority`: the threads that compute live frames run at a lower OS priority, so in the
  CPU time left between uploads the rest of the server still goes first.

Plain threads, no web framework; the page keeps one :class:`StreamSlots` and one :class:`Priority` per
server (``st.cache_resource``).
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from typing import Any, Callable, Hashable, Iterator

IDLE_S = 30.0  # a stream whose camera sent nothing for this long has ended (its slot is taken back)
# … and one whose browser tab has been gone this long: a WebSocket that drops and reconnects (a busy server, a
# phone's network) comes back well within it, and keeps its stream
GONE_S = 5.0
GRACE_S = 0.7  # after a photo's capture its page still draws and sends the views: live frames wait that long
PATIENCE_S = 2.0  # the longest a live frame waits for page work, so a busy server still updates the stream
READY_POLL_S = 0.05  # how often a waiting live frame asks ``ready()`` again
ALONE_S = 1.0  # a stream that asked for no turn this long is not counted: another stream is alone


class StreamSlots:
    """At most ``limit`` live streams at once, shared by every browser session of one server.

    :meth:`open` makes a stream only while a slot is free. A stream is anything with ``stopped``,
    ``idle_s()`` and ``stop()`` (:class:`attnviz.live.LiveProcessor`). It holds its slot until it has
    stopped, its owner has been gone for ``gone_s`` seconds (``alive(owner)`` False: the browser tab closed,
    not a connection that drops and comes back) or no camera frame came for ``idle_s`` seconds; such slots
    are taken back whenever the slots are counted, and a stream whose slot is taken back is stopped, so no
    stream ever computes without one.
    """

    def __init__(self, limit: int, alive: Callable[[Hashable], bool] = lambda owner: True, idle_s: float = IDLE_S,
                 gone_s: float = GONE_S, clock: Callable[[], float] = time.monotonic):
        self.limit = max(0, limit)
        self._alive = alive
        self._idle_s, self._gone_s, self._clock = idle_s, gone_s, clock
        self._lock = threading.Lock()
        self._held: dict[Any, Hashable] = {}  # stream → its owner (streams compare by identity)
        self._gone: dict[Any, float] = {}  # stream → when its owner was first seen gone (since seen again: dropped)

    def open(self, owner: Hashable, make: Callable[[], Any]) -> Any | None:
        """``make()``'s stream, holding a slot for ``owner``; None (and nothing made) when all are taken."""
        with self._lock:
            self._reclaim()
            if len(self._held) >= self.limit:
                return None
            stream = make()
            self._held[stream] = owner
            return stream

    def holds(self, stream: Any) -> bool:
        """Does ``stream`` hold a slot now (False for one turned away, stopped or taken back)?"""
        with self._lock:
            self._reclaim()
            return stream in self._held

    def free(self) -> int:
        """Slots free now."""
        with self._lock:
            self._reclaim()
            return self.limit - len(self._held)

    def _reclaim(self) -> None:
        now = self._clock()
        for stream, owner in list(self._held.items()):
            if self._alive(owner):
                self._gone.pop(stream, None)
                gone = False
            else:
                gone = now - self._gone.setdefault(stream, now) >= self._gone_s
            if stream.stopped or stream.idle_s() > self._idle_s or gone:
                del self._held[stream]
                self._gone.pop(stream, None)
                stream.stop()  # taken back from a stream that still runs: it computes no more frames


class Priority:
    """Who computes first in one server process: page work before live frames, live frames in turn.

    ``foreground()`` wraps page work (a visitor's photo being decoded and captured). ``background(stream=…)``
    wraps one live frame: it waits until no page work has run for ``grace_s`` seconds and ``ready()``
    (when given) says the server keeps up (together at most ``patience_s``), then for a turn, given in the
    order they were asked for, so streams share the live compute evenly. There are ``background`` turns
    while several streams ask, so that at most that many frames compete with the rest of the server (one,
    on two cores: a photo uploaded beside three streams then waits least), and ``alone`` turns while only one
    stream has asked in the last ``ALONE_S`` seconds: a lone viewer's frames use both cores (a forward pass
    on a runtime releases Python's GIL; docs/live-camera.md).
    """

    def __init__(self, background: int = 1, grace_s: float = GRACE_S, patience_s: float = PATIENCE_S,
                 clock: Callable[[], float] = time.monotonic, alone: int | None = None):
        self.turns = max(1, background)
        self.alone = max(self.turns, alone or 0)  # the most frames at once: a lone stream's workers
        self._grace_s, self._patience_s, self._clock = grace_s, patience_s, clock
        self._changed = threading.Condition()
        self._foreground = 0  # page work running now
        self._ended = -float("inf")  # when the last page work ended (clock time)
        self._running = 0  # live frames computing now
        self._asked: dict[int, float] = {}  # id of a stream → when it last asked (ids: a stopped stream is not kept)
        self._queue: collections.deque[threading.Event] = collections.deque()  # live frames waiting, oldest first

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        with self._changed:
            self._foreground += 1
        try:
            yield
        finally:
            with self._changed:
                self._foreground -= 1
                self._ended = self._clock()
                self._changed.notify_all()

    @property
    def busy(self) -> bool:
        """Is page work running, or did it end less than ``grace_s`` ago?"""
        with self._changed:
            return self._foreground > 0 or self._clock() - self._ended < self._grace_s

    @contextlib.contextmanager
    def background(self, ready: Callable[[], bool] | None = None, stream: Hashable = None) -> Iterator[None]:
        deadline = self._clock() + self._patience_s
        self._wait_for_quiet(deadline)
        while ready is not None and not ready() and self._clock() < deadline:
            time.sleep(READY_POLL_S)
        self._take_turn(stream)
        try:
            yield
        finally:
            self._give_turn()

    def _turns_now(self) -> int:
        """How many frames may compute at once now (the lock held): ``alone`` while one stream asks, else ``turns``."""
        now = self._clock()
        for stream, when in list(self._asked.items()):
            if now - when > ALONE_S:
                del self._asked[stream]
        return self.alone if len(self._asked) <= 1 else self.turns

    def pause_point(self) -> Callable[[], None]:
        """For one live frame already running: a function to call between its layers
        (``capture_tensor(…, between_layers=…)``). While page work runs, or ran less than ``grace_s`` ago,
        it waits — holding neither a core nor the GIL — so a photo that arrives mid-frame does not share
        the cores with the rest of that frame; all of one frame's waits together last at most ``patience_s``."""
        deadline = self._clock() + self._patience_s
        return lambda: self._wait_for_quiet(deadline)

    def _wait_for_quiet(self, deadline: float) -> None:
        with self._changed:
            while True:
                now = self._clock()
                quiet_in = self._ended + self._grace_s - now if self._foreground == 0 else deadline - now
                if (self._foreground == 0 and quiet_in <= 0) or now >= deadline:
                    return
                self._changed.wait(min(quiet_in, deadline - now))

    def _take_turn(self, stream: Hashable) -> None:
        with self._changed:
            self._asked[id(stream)] = self._clock()
            if self._running < self._turns_now() and not self._queue:
                self._running += 1
                return
            turn = threading.Event()
            self._queue.append(turn)
        turn.wait()  # _give_turn hands this turn over directly: nobody can take it first

    def _give_turn(self) -> None:
        with self._changed:
            self._running -= 1
            while self._queue and self._running < self._turns_now():
                self._running += 1
                self._queue.popleft().set()


def lower_priority(nice: int) -> None:
    """Lower the calling thread's scheduling priority by ``nice`` (Linux only: there every thread has its
    own nice value, and ``setpriority`` on a thread id changes that thread alone; on macOS the same call
    would name a process). A thread cannot raise its priority again, so call it on a thread of its own."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
    except OSError:  # a sandbox that forbids it: the stream still runs, at the ordinary priority
        pass
