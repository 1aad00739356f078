"""The shared queue of heavy jobs (attnviz.jobs) at its pure level, with fake jobs."""
from __future__ import annotations

import threading
import time

import pytest

from attnviz.jobs import JobCancelled, JobQueue, core_count


class Gauge:
    """A fake heavy job factory that records how many of its jobs run at the same moment."""

    def __init__(self, seconds: float = 0.15):
        self.seconds, self.now, self.peak, self.calls = seconds, 0, 0, []
        self.lock = threading.Lock()

    def job(self, value):
        def compute():
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
                self.calls.append(value)
            time.sleep(self.seconds)
            with self.lock:
                self.now -= 1
            return value * value

        return compute


def held(queue: JobQueue, owner="teacher"):
    """Occupy every worker with a job that runs until the returned event is set."""
    release = threading.Event()
    jobs = [queue.submit(("hold", i), lambda: release.wait(10), owner=(owner, i)) for i in range(queue.workers)]
    deadline = time.monotonic() + 5
    while queue.running < queue.workers and time.monotonic() < deadline:
        time.sleep(0.005)
    assert queue.running == queue.workers
    return release, jobs


def test_core_count_is_what_this_process_may_use():
    import os

    assert core_count() == len(os.sched_getaffinity(0)) >= 1
    assert JobQueue().workers == core_count()


def test_at_most_workers_jobs_run_together_and_every_job_gets_its_own_answer():
    queue, gauge = JobQueue(workers=2), Gauge()
    jobs = [queue.submit(("square", i), gauge.job(i), owner=f"session{i}") for i in range(10)]
    for job in jobs:
        assert queue.wait(job, 10)
    assert [job.result() for job in jobs] == [i * i for i in range(10)]
    assert gauge.peak == 2 and queue.peak_running == 2
    assert sorted(gauge.calls) == list(range(10)) and queue.runs == 10
    assert queue.running == 0 and queue.waiting == 0


def test_identical_requests_are_one_run_and_later_ones_come_from_the_cache():
    queue, gauge = JobQueue(workers=2), Gauge(0.3)
    jobs, start = [], threading.Barrier(10)

    def click(i):
        start.wait()
        jobs.append(queue.submit(("removal test", "cat", 12), gauge.job(7), owner=f"session{i}"))

    threads = [threading.Thread(target=click, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for job in jobs:
        assert queue.wait(job, 10)
    assert {job.result() for job in jobs} == {49} and len({id(job) for job in jobs}) == 1
    assert gauge.calls == [7] and queue.runs == 1
    later = queue.submit(("removal test", "cat", 12), gauge.job(7), owner="latecomer")
    assert later.done() and later.result() == 49 and gauge.calls == [7]


def test_waiting_jobs_know_their_place_and_a_leaver_gives_it_up():
    queue, gauge = JobQueue(workers=1), Gauge(0.01)
    release, _ = held(queue)
    first = queue.submit("b", gauge.job(2), owner="anna")
    second = queue.submit("c", gauge.job(3), owner="ben")
    third = queue.submit("d", gauge.job(4), owner="chen")
    assert [queue.ahead(j) for j in (first, second, third)] == [0, 1, 2]
    queue.leave("ben")
    assert second.done() and second.state == "cancelled" and queue.ahead(third) == 1
    with pytest.raises(JobCancelled):
        second.result()
    release.set()
    assert queue.wait(third, 10) and third.result() == 16
    assert gauge.calls == [2, 4]  # ben's job never ran


def test_a_shared_job_stays_while_one_of_its_owners_remains():
    queue, gauge = JobQueue(workers=1), Gauge(0.01)
    release, _ = held(queue)
    job = queue.submit("same", gauge.job(5), owner="anna")
    assert queue.submit("same", gauge.job(5), owner="ben") is job
    queue.leave("anna")
    assert not job.done() and job.owners == {"ben"}
    release.set()
    assert queue.wait(job, 10) and job.result() == 25


def test_asking_for_another_job_gives_up_the_place_in_the_first():
    queue, gauge = JobQueue(workers=1), Gauge(0.01)
    release, _ = held(queue)
    old = queue.submit(("layer", 3), gauge.job(3), owner="anna")
    new = queue.submit(("layer", 4), gauge.job(4), owner="anna")
    assert old.state == "cancelled" and queue.waiting == 1
    release.set()
    assert queue.wait(new, 10) and new.result() == 16 and gauge.calls == [4]


def test_jobs_of_sessions_that_are_gone_are_dropped_when_their_turn_comes():
    gone = {"ghost"}
    queue, gauge = JobQueue(workers=1, alive=lambda owner: owner not in gone), Gauge(0.01)
    release, _ = held(queue)
    ghost = queue.submit("g", gauge.job(9), owner="ghost")
    live = queue.submit("l", gauge.job(8), owner="anna")
    release.set()
    assert queue.wait(live, 10) and live.result() == 64
    assert ghost.state == "cancelled" and gauge.calls == [8]


def test_an_error_reaches_every_waiter_is_not_cached_and_the_worker_survives():
    queue = JobQueue(workers=1)

    def broken():
        time.sleep(0.05)
        raise ValueError("no such layer")

    a = queue.submit("bad", broken, owner="anna")
    b = queue.submit("bad", broken, owner="ben")
    assert a is b and queue.wait(a, 10)
    with pytest.raises(ValueError, match="no such layer"):
        a.result()
    assert not queue.cached("bad")
    ok = queue.submit("good", lambda: 1, owner="anna")
    assert queue.wait(ok, 10) and ok.result() == 1


def test_the_result_cache_is_bounded_least_recently_used_first():
    queue = JobQueue(workers=1, cache_entries=3)
    for key in "abcd":
        job = queue.submit(key, lambda key=key: key.upper(), owner="anna")
        assert queue.wait(job, 10)
        if key == "b":
            queue.submit("a", lambda: "unused", owner="anna")  # a hit: "a" becomes the most recent
    assert [queue.cached(k) for k in "abcd"] == [True, False, True, True]
    assert queue.runs == 4


def test_a_running_job_whose_owners_all_left_or_are_gone_knows_it_is_abandoned_and_can_stop():
    gone: set = set()
    queue = JobQueue(workers=1, alive=lambda owner: owner not in gone)
    started, steps = threading.Event(), []

    def long_job(key):
        def compute():
            started.set()
            for step in range(500):  # 5 s unless it stops
                if queue.abandoned(key):
                    return ("stopped", step)
                steps.append(step)
                time.sleep(0.01)
            return ("finished", 500)
        return compute

    job = queue.submit("video", long_job("video"), owner="anna")
    assert started.wait(5) and not queue.abandoned("video")
    queue.submit("video", long_job("video"), owner="ben")  # a second visitor waits for the same run
    queue.leave("anna")
    time.sleep(0.05)
    assert not queue.abandoned("video") and not job.done()  # ben still waits
    gone.add("ben")  # ben's tab closed: his session is no longer active
    assert queue.wait(job, 5) and job.result()[0] == "stopped" and len(steps) < 100
    assert not queue.abandoned("video")  # finished: no longer running


def test_asking_for_another_job_gives_up_the_share_in_a_running_one():
    queue = JobQueue(workers=2)
    started = threading.Event()

    def compute():
        started.set()
        deadline = time.monotonic() + 5
        while not queue.abandoned("first") and time.monotonic() < deadline:
            time.sleep(0.01)
        return "stopped" if queue.abandoned("first") else "ran out"

    first = queue.submit("first", compute, owner="anna")
    assert started.wait(5)
    queue.submit("second", lambda: 2, owner="anna")
    assert queue.wait(first, 10) and first.result() == "stopped"


def test_a_job_submitted_without_cache_is_shared_while_it_runs_but_not_kept():
    queue, gauge = JobQueue(workers=1), Gauge(0.05)
    one = queue.submit("big", gauge.job(7), owner="anna", cache=False)
    assert queue.submit("big", gauge.job(7), owner="ben", cache=False) is one
    assert queue.wait(one, 10) and one.result() == 49 and not queue.cached("big")
    again = queue.submit("big", gauge.job(7), owner="anna", cache=False)
    assert queue.wait(again, 10) and again.result() == 49 and gauge.calls == [7, 7]
