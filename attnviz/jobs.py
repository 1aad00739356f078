"""A bounded queue of heavy jobs, shared by everyone using one server process.

In a classroom thirty people may press the same button within a second. The queue makes that cost
what it must and no more:

- at most ``workers`` jobs run at once (by default one per core this process may use); the rest wait
  in the order they were asked for, and anyone can see how many jobs are ahead of theirs;
- jobs are identified by a key (the capture and the settings): a job asked for again while it waits or
  runs is the same job, and a finished one is answered from a small cache of results, so thirty
  identical clicks are one run;
- a job is wanted by its owners (browser sessions); an owner that leaves gives up its jobs, and a job
  nobody wants any more is dropped before it starts. A job that has started runs to the end (its
  result is cached for the next click) unless it asks :meth:`JobQueue.abandoned` as it goes and stops
  (a video job does, after every frame: a closed tab ends it);
- a job submitted with ``cache=False`` (a result too large to keep 64 of, such as a video) is shared
  while it runs, but its result goes only to those waiting for it.

Plain threads and no Streamlit: the page glue (``heavy.py``) only submits, waits and shows the place.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict, deque
from typing import Callable, Hashable, Literal

State = Literal["waiting", "running", "done", "cancelled"]


def core_count() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


class JobCancelled(RuntimeError):
    """Every owner of this job left before it started."""


class Job:
    """One unit of work: a handle like a future, shared by everyone who asked for the same key."""

    def __init__(self, key: Hashable, compute: Callable[[], object], cache: bool = True):
        self.key = key
        self.cache = cache  # whether its result goes into the queue's cache of results
        self._compute = compute
        self.owners: set[Hashable] = set()
        self.state: State = "waiting"
        self._value: object = None
        self._error: BaseException | None = None
        self._finished = threading.Event()

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self) -> object:
        """The job's value; re-raises its error; raises :class:`JobCancelled` for a dropped job."""
        if not self.done():
            raise RuntimeError("the job has not finished")
        if self.state == "cancelled":
            raise JobCancelled(f"job {self.key!r} was dropped: everyone who asked for it left")
        if self._error is not None:
            raise self._error
        return self._value

    def _finish(self, state: State, value: object = None, error: BaseException | None = None) -> None:
        self.state, self._value, self._error = state, value, error
        self._compute = None  # let the closure (model, capture) go
        self._finished.set()


class JobQueue:
    """At most ``workers`` jobs at once, de-duplicated by key, with an LRU cache of results.

    ``alive(owner)`` says whether an owner is still there; a job whose owners are all gone is dropped
    when its turn comes (the glue also calls :meth:`leave` when it sees a session stop).
    """

    def __init__(
        self,
        workers: int | None = None,
        cache_entries: int = 64,
        alive: Callable[[Hashable], bool] = lambda owner: True,
    ):
        if cache_entries < 1:
            raise ValueError("the result cache needs at least one entry")
        self.workers = max(1, workers or core_count())
        self.cache_entries = cache_entries
        self._alive = alive
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()  # in the order they were asked for
        self._active: dict[Hashable, Job] = {}  # waiting or running, by key
        self._results: OrderedDict[Hashable, object] = OrderedDict()  # finished, least recently used first
        self._running = 0
        self._threads = 0
        self.peak_running = 0  # the most jobs ever seen running together (for tests and the benchmark)
        self.runs = 0  # jobs started so far

    # --- asking --------------------------------------------------------------------------------

    def submit(self, key: Hashable, compute: Callable[[], object], owner: Hashable, cache: bool = True) -> Job:
        """The job for ``key``: finished from the cache, the one already waiting/running, or a new one
        (``cache=False``: its result is not kept once it has been handed to its waiters).

        An owner waits for one job at a time: asking for another gives up its place in the others (and its
        share in a running one, which :meth:`abandoned` then reports).
        """
        with self._lock:
            if key in self._results:
                self._results.move_to_end(key)
                job = Job(key, compute)
                job._finish("done", self._results[key])
                return job
            job = self._active.get(key)
            if job is None:
                job = Job(key, compute, cache)
                self._active[key] = job
                self._waiting.append(job)
                if self._threads < self.workers:
                    self._threads += 1
                    threading.Thread(target=self._work, name="attnviz-heavy-job", daemon=True).start()
            self._drop_owner(owner, keep=job)
            job.owners.add(owner)
            return job

    def wait(self, job: Job, timeout: float | None = None) -> bool:
        """True once ``job`` has finished (or been dropped); False after ``timeout`` seconds."""
        return job._finished.wait(timeout)

    def ahead(self, job: Job) -> int:
        """How many waiting jobs come before ``job`` (0 when it runs, is done or is next)."""
        with self._lock:
            if job.state != "waiting":
                return 0
            for place, other in enumerate(self._waiting):
                if other is job:
                    return place
            return 0

    def leave(self, owner: Hashable) -> None:
        """``owner`` no longer wants any job; waiting jobs nobody wants are dropped."""
        with self._lock:
            self._drop_owner(owner, keep=None)

    def abandoned(self, key: Hashable) -> bool:
        """Whether the running job for ``key`` is wanted by nobody any more: every owner left or is gone. A
        long job asks this as it goes and ends itself (its result would reach no one)."""
        with self._lock:
            job = self._active.get(key)
            return job is not None and job.state == "running" and not any(self._alive(o) for o in job.owners)

    # --- looking -------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def cached(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._results

    # --- inside --------------------------------------------------------------------------------

    def _drop_owner(self, owner: Hashable, keep: Job | None) -> None:
        for job in [j for j in self._active.values() if j is not keep and owner in j.owners]:
            job.owners.discard(owner)
            if not job.owners and job.state == "waiting":
                self._cancel(job)

    def _cancel(self, job: Job) -> None:
        self._waiting.remove(job)
        del self._active[job.key]
        job._finish("cancelled")

    def _next(self) -> Job | None:
        """The first waiting job someone still wants (others are dropped); None when the line is empty."""
        while self._waiting:
            job = self._waiting[0]
            if any(self._alive(owner) for owner in job.owners):
                self._waiting.popleft()
                return job
            self._cancel(job)
        return None

    def _work(self) -> None:
        while True:
            with self._lock:
                job = self._next()
                if job is None:
                    self._threads -= 1
                    return
                job.state = "running"
                self._running += 1
                self.runs += 1
                self.peak_running = max(self.peak_running, self._running)
                compute = job._compute
            try:
                value, error = compute(), None
            except BaseException as e:  # handed to every waiter; never kills the worker
                value, error = None, e
            with self._lock:
                self._running -= 1
                del self._active[job.key]
                if error is None and job.cache:
                    self._results[job.key] = value
                    while len(self._results) > self.cache_entries:
                        self._results.popitem(last=False)
                job._finish("done", value, error)
