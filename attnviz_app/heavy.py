"""Page glue for heavy jobs (the lesson's removal test, rollout, head statistics, class-specific maps).

Every session of the server shares one :class:`attnviz.jobs.JobQueue`: at most as many jobs run at once
as the owner allows (one per core by default), identical requests are one run, finished results come
from its bounded cache. While a job waits, the page shows its place in the queue; a session that
stops (the tab closed) gives up its place.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable, TypeVar

import streamlit as st

from attnviz.jobs import JobCancelled, JobQueue

from . import ui
from .text import t

RESULT_ENTRIES = 64  # finished results kept: each a few kB (maps, curves, statistics)
POLL_S = 0.5  # how often a waiting page refreshes its place (and notices that its session stopped)
T = TypeVar("T")


def _session_alive(owner: Hashable) -> bool:
    from streamlit.runtime import Runtime

    session_id, _ = owner
    return not Runtime.exists() or Runtime.instance().is_active_session(session_id)


@st.cache_resource(show_spinner=False, max_entries=2)
def shared_queue(workers: int) -> JobQueue:
    """The server's one queue (one per worker count, should the owner's setting change)."""
    return JobQueue(workers, cache_entries=RESULT_ENTRIES, alive=_session_alive)


def queue() -> JobQueue:
    return shared_queue(ui.owner_policy().heavy_jobs)


def _owner() -> tuple[str, str]:
    """This browser session: Streamlit's session id (to ask whether it is still connected) and a token of
    our own (test sessions all share one id)."""
    import uuid

    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    token = st.session_state.setdefault("_heavy_owner", uuid.uuid4().hex)
    return (ctx.session_id if ctx is not None else "", token)


class Cancelled(RuntimeError):
    """The page's Cancel stopped this job (it is not cached; asking again runs it again)."""


class Progress:
    """How far a running job is, and a Cancel the page can press: pass it to the core function as its
    ``progress(fraction)`` callback, which raises :class:`Cancelled` once cancelled (so the job ends,
    uncached)."""

    def __init__(self) -> None:
        self.fraction = 0.0
        self.cancelled = threading.Event()

    def __call__(self, fraction: float) -> None:
        if self.cancelled.is_set():
            raise Cancelled("cancelled on the page")
        self.fraction = fraction


@st.cache_resource(show_spinner=False)
def _progress_board() -> dict:
    """Progress of the jobs that report it, by job key (shared: sessions waiting on one job see one bar)."""
    return {}


def progress(kind: str, cap_key: tuple, args: tuple) -> Progress:
    """The one :class:`Progress` of job (kind, cap_key, args), made on first use."""
    return _progress_board().setdefault((kind, cap_key, args), Progress())


def cancel(kind: str, cap_key: tuple, args: tuple) -> None:
    """Stop the job (kind, cap_key, args) at its next step, for everyone waiting on it."""
    board = _progress_board().pop((kind, cap_key, args), None)
    if board is not None:
        board.cancelled.set()


def cached(kind: str, cap_key: tuple, args: tuple) -> bool:
    """Whether the job's result is already in the shared cache (a page can show it without a button)."""
    return bool(cap_key) and queue().cached((kind, cap_key, args))


def run(kind: str, cap_key: tuple, args: tuple, compute: Callable[[], T], working: str,
        bar: Progress | None = None) -> T:
    """``compute()`` through the shared queue, keyed by (kind, capture key, args); waits with a spinner
    (``working``; a progress bar when ``bar`` is given) and the place in the queue. ``cap_key`` empty:
    computed here, unshared."""
    if not cap_key:
        with st.spinner(working):
            return compute()
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    jobs, owner, key = queue(), _owner(), (kind, cap_key, args)
    place = st.empty()
    for _ in range(3):
        job = jobs.submit(key, compute, owner)
        if job.done() and job.state == "done":
            return job.result()
        try:
            # Every element call below is also where Streamlit stops a run whose session has gone.
            while job.state == "waiting":
                place.info(t("jobs.waiting", place=jobs.ahead(job) + 1, running=jobs.running, slots=jobs.workers),
                           icon=":material/hourglass_top:")
                jobs.wait(job, POLL_S)
            place.empty()
            with st.spinner(working):
                while not jobs.wait(job, POLL_S):
                    if bar is None:
                        place.empty()
                    else:
                        place.progress(min(1.0, bar.fraction), text=working)
        except StopException:
            jobs.leave(owner)
            raise
        place.empty()
        if bar is not None and _progress_board().get(key) is bar:
            del _progress_board()[key]  # finished (or failed): the next request starts a fresh bar
        try:
            return job.result()
        except JobCancelled:  # dropped between two polls (this session asked for another job): ask again
            continue
    st.stop()  # dropped again and again: this session is gone (its jobs are dropped for that), so draw nothing
