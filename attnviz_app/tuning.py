"""How the server runs on few cores, whatever starts it: ``streamlit run app.py``, ``attnviz app``, ``make run``.

Set once, here, for every way in:

- **One PyTorch thread per forward pass** (``ATTNVIZ_THREADS``, default 1): sessions run side by side on
  Streamlit's threads, and thirty teams of one thread per core on two cores spent most of their CPU
  waiting on each other (0.85 s of CPU per capture on a busy 2-core machine against 0.14 s with one).
- **Two malloc arenas**: glibc gives every thread its own heap arena and returns little of it; two keep
  the server's memory near what it holds.
- **Housekeeping** once the server runs: ``gc.freeze`` of what the imports made, then a full collection and
  ``malloc_trim`` every 10 s (instead of Streamlit's collection after every page run), so resident memory
  follows what is held rather than a rush's peak.

:func:`serve` applies the last three once per process: ``attnviz app`` calls it before the server starts,
and the router calls it on every page run (the first one in the process does the work: a plain
``streamlit run app.py`` gets the same server).
"""
from __future__ import annotations

import ctypes
import gc
import os
import threading
import time

import streamlit as st

M_ARENA_MAX = -8  # glibc mallopt parameter
ARENAS = 2
THREADS_ENV = "ATTNVIZ_THREADS"


def threads() -> int:
    """PyTorch threads per forward pass on the server (``ATTNVIZ_THREADS``, default 1)."""
    try:
        return max(1, int(os.environ.get(THREADS_ENV, "1")))
    except ValueError:
        return 1


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to tune
        return None


@st.cache_resource(show_spinner=False)
def serve() -> int:
    """Tune this process as a server, once (Streamlit's resource cache runs it once per process, also before
    the server starts); returns the threads per forward pass."""
    import torch

    torch.set_num_threads(threads())
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_ARENA_MAX, ARENAS)
    housekeeping(libc)
    return torch.get_num_threads()


def housekeeping(libc, first_after_s: float = 15.0, every_s: float = 10.0) -> None:
    """A daemon thread: ``gc.freeze`` once the server is up, then a full collection and ``malloc_trim`` every
    ``every_s``.

    Frozen objects (Streamlit, Starlette, the imports, the model) are out of the collector's sight: a full
    collection then walks only what sessions create. Streamlit's own full collection after every script run
    is off (``runner.postScriptGC`` in ``config.toml``): a class's sixty uploads within 10 s paid sixty of
    them, ~30 ms each on the page's thread; one every ``every_s`` keeps memory where they kept it.
    """
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None

    def run() -> None:
        time.sleep(first_after_s)
        gc.freeze()
        while True:
            gc.collect()
            if trim is not None:
                trim(0)
            time.sleep(every_s)

    threading.Thread(target=run, name="attnviz-housekeeping", daemon=True).start()
