"""The teacher's photo on thirty phones: photos a presenter shares, kept in memory under unguessable names.

In presenter view the page's address and its QR code name what is shown (attnviz_app/links.py); a sample photo is
named by its name, an upload or a camera shot has none. :class:`SharedPhotos` gives it one for a while: the photo's
bytes are kept in this process's memory under 22 random URL-safe characters (128 bits from :mod:`secrets`), so a
phone opening ``/?photo=<name>`` gets the same photo, and nobody can list the photos or guess another class's. It
is bounded (at most ``max_photos`` photos and ``max_bytes`` bytes: the oldest go first) and forgets each photo
``keep_s`` after it was last shared or opened (a lesson's length). Nothing is written to disk.

The page keeps one per server (``st.cache_resource``); its methods lock, as many sessions call them at once.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

NAME = re.compile(r"[A-Za-z0-9_-]{22}")  # what secrets.token_urlsafe(16) makes: a link's value is checked against it


@dataclass(frozen=True)
class SharedPhoto:
    data: bytes
    filename: str
    digest: str  # sha256 of ``data``: the same photo shared again keeps its name


class SharedPhotos:
    """Photos shared by name, bounded in count, bytes and time."""

    def __init__(self, max_photos: int = 64, max_bytes: int = 512 * 2**20, keep_s: float = 4 * 3600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_photos, self.max_bytes, self.keep_s, self._clock = max_photos, max_bytes, keep_s, clock
        self._photos: OrderedDict[str, tuple[SharedPhoto, float]] = OrderedDict()  # name → (photo, last use), oldest first
        self._names: dict[str, str] = {}  # digest → name
        self._lock = threading.Lock()

    def share(self, data: bytes, filename: str, digest: str | None = None) -> str:
        """The name under which ``data`` can be opened (the same name while the same bytes are kept). ``digest``:
        the bytes' sha256 where the caller has it (the page keys its captures by it), not computed again."""
        if len(data) > self.max_bytes:
            raise ValueError(f"a photo of {len(data)} bytes is more than the {self.max_bytes} this server shares")
        digest = digest or hashlib.sha256(data).hexdigest()
        with self._lock:
            self._forget_old()
            name = self._names.get(digest)
            if name is None:
                name = secrets.token_urlsafe(16)
                self._names[digest] = name
                self._photos[name] = (SharedPhoto(data, filename, digest), self._clock())
                self._keep_within_bounds()
            else:
                self._touch(name)
            return name

    def open(self, name: str) -> SharedPhoto | None:
        """The photo shared as ``name``, or None when there is none (never was, or forgotten)."""
        if not NAME.fullmatch(name or ""):
            return None
        with self._lock:
            self._forget_old()
            if name not in self._photos:
                return None
            self._touch(name)
            return self._photos[name][0]

    def __len__(self) -> int:
        with self._lock:
            self._forget_old()
            return len(self._photos)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(len(photo.data) for photo, _ in self._photos.values())

    def _touch(self, name: str) -> None:
        photo, _ = self._photos.pop(name)
        self._photos[name] = (photo, self._clock())  # the newest now

    def _drop_oldest(self) -> None:
        name, (photo, _) = self._photos.popitem(last=False)
        del self._names[photo.digest]

    def _forget_old(self) -> None:
        now = self._clock()
        while self._photos and now - next(iter(self._photos.values()))[1] > self.keep_s:
            self._drop_oldest()

    def _keep_within_bounds(self) -> None:
        total = sum(len(photo.data) for photo, _ in self._photos.values())
        while len(self._photos) > self.max_photos or total > self.max_bytes:
            total -= len(next(iter(self._photos.values()))[0].data)
            self._drop_oldest()
