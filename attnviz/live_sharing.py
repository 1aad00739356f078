"""One server, many live cameras: how many streams run, and who computes first.

A classroom server is one Python process. Every stream's heatmaps are computed in it, beside every
visitor's uploads, and a forward pass holds Python's GIL between its tensor operations — so a stream
slows an upload even on a core of its own. Three rules keep the streams from taking the server:

- :class:`StreamSlots`: at most ``limit`` streams at once (the owner's ``ATTNVIZ_LIVE_STREAMS``); a
  stream holds its slot until it stops, its owner (a browser session) is gone, or its camera falls silent.
- :class:`Priority`: page work comes first. While a photo is decoded or captured
  (``with priority.foreground():``), and for ``grace_s`` after, it takes a core, and live frames get only
  the cores left (none on a one-core server); live frames take turns, ``background`` at once
  server-wide, in the order they asked. A frame already running stops at its next layer while page work
  takes every core (``pause_point``). Waiting holds neither a core nor the GIL.
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
GRACE_S = 0.7  # after a photo's capture its page still draws and sends the views: it keeps its core that long
PATIENCE_S = 2.0  # the longest a live frame waits for page work, so a busy server still updates the stream
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
    wraps one live frame: it waits for a turn, given in the order they were asked for, so streams share the live
    compute evenly. There are ``background`` turns while several streams ask, so that at most that many frames
    compete with the rest of the server (one, on two cores: a photo uploaded beside three streams then waits
    least), and ``alone`` turns while only one stream has asked in the last ``ALONE_S`` seconds: a lone viewer's
    frames use both cores (a forward pass on a runtime releases Python's GIL; docs/live-camera.md).

    Page work comes first: of the ``cores`` this process computes on, each piece of page work running now (or
    ended less than ``grace_s`` ago: its page still draws and sends its views) takes one, and live frames get
    only the cores left — on one core none while a photo is worked on, on two cores one. A frame waits for
    that at most ``patience_s`` in all, so a busy server still updates its streams.
    """

    def __init__(self, background: int = 1, grace_s: float = GRACE_S, patience_s: float = PATIENCE_S,
                 clock: Callable[[], float] = time.monotonic, alone: int | None = None, cores: int = 1):
        self.turns = max(1, background)
        self.alone = max(self.turns, alone or 0)  # the most frames at once: a lone stream's workers
        self.cores = max(1, cores)
        self._grace_s, self._patience_s, self._clock = grace_s, patience_s, clock
        self._changed = threading.Condition()
        self._foreground = 0  # page work running now
        self._ended = -float("inf")  # when the last page work ended (clock time)
        self._running = 0  # live frames computing now
        self._asked: dict[int, float] = {}  # id of a stream → when it last asked (ids: a stopped stream is not kept)
        self._line: collections.deque[object] = collections.deque()  # live frames waiting for a turn, oldest first

    @classmethod
    def server(cls, cores: int) -> Priority:
        """A server's rules on ``cores`` cores: one turn per two cores while several streams run, one per core for
        a lone stream, and page work first on every core."""
        return cls(background=max(1, cores // 2), alone=cores, cores=cores)

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
            return self._page_work(self._clock()) > 0

    @contextlib.contextmanager
    def background(self, stream: Hashable = None) -> Iterator[None]:
        deadline = self._clock() + self._patience_s
        self._take_turn(stream, deadline)
        try:
            yield
        finally:
            with self._changed:
                self._running -= 1
                self._changed.notify_all()

    def pause_point(self) -> Callable[[], None]:
        """For one live frame already running: a function to call between its layers
        (``capture_tensor(…, between_layers=…)``). While page work takes every core (on two cores: two photos at
        once, or one on a one-core server) it waits — holding neither a core nor the GIL — so a photo that arrives
        mid-frame does not share its core with the rest of that frame; all of one frame's waits together last at
        most ``patience_s``."""
        deadline = self._clock() + self._patience_s
        return lambda: self._wait_for_a_core(deadline)

    def _page_work(self, now: float) -> int:
        """Cores page work takes now (the lock held): one per photo being worked on, or one in the grace after."""
        return self._foreground or int(now - self._ended < self._grace_s)

    def _turns_now(self, now: float, deadline: float) -> int:
        """How many frames may compute at once now (the lock held): ``alone`` while one stream asks, else
        ``turns``; before ``deadline``, no more than the cores page work leaves."""
        for stream, when in list(self._asked.items()):
            if now - when > ALONE_S:
                del self._asked[stream]
        turns = self.alone if len(self._asked) <= 1 else self.turns
        page_work = self._page_work(now)
        return min(turns, self.cores - page_work) if page_work and now < deadline else turns

    def _next_change(self, now: float, deadline: float) -> float | None:
        """Seconds until the grace after page work or the frame's patience ends, whichever comes first."""
        ahead = [t - now for t in (self._ended + self._grace_s, deadline) if t > now]
        return min(ahead) if ahead else None

    def _take_turn(self, stream: Hashable, deadline: float) -> None:
        me = object()
        with self._changed:
            self._asked[id(stream)] = self._clock()
            self._line.append(me)
            while True:
                now = self._clock()
                if self._line[0] is me and self._running < self._turns_now(now, deadline):
                    break
                self._changed.wait(self._next_change(now, deadline))
            self._line.popleft()
            self._running += 1
            self._changed.notify_all()  # the next in line may fit too

    def _wait_for_a_core(self, deadline: float) -> None:
        with self._changed:
            while True:
                now = self._clock()
                if now >= deadline or self._page_work(now) < self.cores:
                    return
                self._changed.wait(self._next_change(now, deadline))


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
